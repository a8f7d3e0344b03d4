"""Fusion: a DAG of tensor expressions with inputs and outputs."""
from __future__ import annotations

import copy

from .base import Expr, Val, pop_fusion, push_fusion
from .scalar import Scalar
from .tensor import MemoryType, TensorView


class Fusion:
    def __init__(self):
        self.inputs: list[Val] = []
        self.outputs: list[Val] = []
        self._counters: dict[str, int] = {}
        # Pairs of extents that ops assumed equal (e.g. x[i0] + y[i3] needs i0 == i3); runtime
        # input validation checks them.
        self.extent_equalities: list[tuple[Scalar, Scalar, str]] = []
        # Set by a scheduler for lowering (pyfuser/lower/params.py and launch.py):
        # extents the kernel is specialized on (Scalar -> int; part of the heuristic), and
        # launch settings the schedule fixed (grid_x, max_threads, min_blocks, cooperative, ...).
        self.static_extents: dict = {}
        self.launch_hints: dict = {}
        # Alias inputs (schedule/roles.py): position of an input that is a second view of the
        # runtime tensor of another input -> that input's position. The caller passes only the
        # others; kernels take an alias's pointer and strides from the input it aliases.
        self.input_aliases: dict[int, int] = {}

    def next_name(self, kind: str) -> int:
        n = self._counters.get(kind, 0)
        self._counters[kind] = n + 1
        return n

    def __enter__(self):
        push_fusion(self)
        return self

    def __exit__(self, *exc):
        pop_fusion(self)
        return False

    # Inputs and outputs ------------------------------------------------------------------------
    def add_input(self, v: Val) -> Val:
        if v in self.inputs:
            raise ValueError(f"{v!r} is already an input of this fusion")
        if isinstance(v, TensorView):
            v.memory_type = MemoryType.Global
        self.inputs.append(v)
        return v

    def input_position(self, v: Val) -> int:
        """Position of the runtime input that fusion input `v` reads (the aliased input's for an
        alias input)."""
        k = self.inputs.index(v)
        return self.input_aliases.get(k, k)

    def add_output(self, v: Val) -> Val:
        if not isinstance(v, TensorView):
            raise TypeError("fusion outputs must be tensors")
        if v in self.inputs:
            raise ValueError(f"T{v.name} is a fusion input; an input cannot also be an output "
                             "(the fusion would have nothing to compute)")
        if v in self.outputs:
            raise ValueError(f"T{v.name} is already an output")
        v.memory_type = MemoryType.Global
        self.outputs.append(v)
        return v

    def replace_output(self, old: TensorView, new: TensorView) -> None:
        self.outputs[self.outputs.index(old)] = new
        new.memory_type = MemoryType.Global

    # Traversal ---------------------------------------------------------------------------------
    def exprs(self) -> list[Expr]:
        """Exprs needed for the outputs, producers before consumers (deterministic order)."""
        order: list[Expr] = []
        seen: set = set()
        stack: list[tuple[Val, bool]] = [(o, False) for o in reversed(self.outputs)]
        visiting: set = set()
        while stack:
            v, done = stack.pop()
            d = v.definition
            if d is None or d in seen:
                continue
            if done:
                seen.add(d)
                visiting.discard(d)
                order.append(d)
                continue
            if d in visiting:
                continue
            visiting.add(d)
            stack.append((v, True))
            for i in reversed(d.inputs):
                if isinstance(i, (TensorView, Scalar)) and i.definition is not None:
                    stack.append((i, False))
        return order

    def tensors(self) -> list[TensorView]:
        """Every tensor used: inputs first, then in topological order."""
        out = [v for v in self.inputs if isinstance(v, TensorView)]
        for e in self.exprs():
            for v in e.inputs + e.outputs:
                if isinstance(v, TensorView) and v not in out:
                    out.append(v)
        return out

    def producers(self, tv: TensorView) -> list[TensorView]:
        d = tv.definition
        return [] if d is None else [i for i in d.inputs if isinstance(i, TensorView)]

    def consumers(self, tv: TensorView) -> list[TensorView]:
        live = set(self.exprs())
        out = []
        for e in tv.uses:
            if e in live:
                out.extend(o for o in e.outputs if isinstance(o, TensorView) and o not in out)
        return out

    def uses_of(self, tv: TensorView) -> list[Expr]:
        live = set(self.exprs())
        return [e for e in tv.uses if e in live]

    def scalar_inputs(self) -> list[Scalar]:
        return [v for v in self.inputs if isinstance(v, Scalar)]

    def clone(self) -> tuple["Fusion", dict]:
        """A deep copy and a map from id(old Val) to the new Val.

        Scheduling mutates a fusion; the executor schedules a clone so that the definition stays
        intact for the reference evaluator and for other input shapes.
        """
        memo: dict = {}
        new = copy.deepcopy(self, memo)
        return new, {k: v for k, v in memo.items() if isinstance(v, Val)}

    def __repr__(self) -> str:
        from .printer import fusion_str
        return fusion_str(self)

    def print_math(self) -> str:
        from .printer import fusion_str
        return fusion_str(self)

    def print_transforms(self) -> str:
        from .printer import transforms_str
        return transforms_str(self)
