"""Fusion: a DAG of tensor expressions with inputs and outputs."""
from __future__ import annotations

import copy
import enum
import types

from .base import Expr, Val, graph_generation, pop_fusion, push_fusion
from .scalar import Scalar, same_value
from .tensor import MemoryType, TensorView


class Fusion:
    def __init__(self):
        self.inputs: list[Val] = []
        self.outputs: list[Val] = []
        self._counters: dict[str, int] = {}
        # Pairs of extents that ops assumed equal (e.g. x[i0] + y[i3] needs i0 == i3); runtime
        # input validation checks them.
        self.extent_equalities: list[tuple[Scalar, Scalar, str]] = []
        # Pairs (a, b, where) of extents an op needs a <= b (torch.gather's index sizes).
        self.extent_limits: list[tuple[Scalar, Scalar, str]] = []
        # Input positions of the seed and offset scalars of random ops defined without them,
        # which FusionDefinition.execute draws from torch's generator (None: no such op).
        self.implicit_rng: tuple | None = None
        # Set by a scheduler for lowering (pyfuser/lower/params.py and launch.py):
        # extents the kernel is specialized on (Scalar -> int; part of the heuristic), and
        # launch settings the schedule fixed (grid_x, max_threads, min_blocks, cooperative, ...).
        self.static_extents: dict = {}
        self.launch_hints: dict = {}
        # Inputs the schedule reads once, each warp's vector loads covering whole sectors
        # (a row reduction's rows): codegen loads them without allocating in L1.
        self.streamed_inputs: set = set()
        # Set by the matmul scheduler (schedule/schedulers/matmul.MatmulOperands): the tiles,
        # operand caches and dims lower/matmul.py builds the tensor-core loop nest from.
        self.mma = None
        # Extents the schedule needs to be multiples of a width (Scalar -> int): the extent a
        # vectorized flat loop's lanes step through, so that the lanes of one vector never
        # cross into the next row (lower/indexing.py folds the lane out of a row's division;
        # the executor checks each before a launch).
        self.extent_multiples: dict = {}
        # Set where the schedule runs vectors over flat runs of dense tensors that need not
        # hold whole vectors (the pointwise scheduler's ragged rows): lowering checks a vector
        # whose lanes depend on a bound at its last lane and runs a partial one lane by lane;
        # elsewhere whole vectors are the schedule's and the executor's guarantee.
        self.ragged_vectors: bool = False
        # Alias inputs (schedule/roles.py): position of an input that is a second view of the
        # runtime tensor of another input -> that input's position. The caller passes only the
        # others; kernels take an alias's pointer and strides from the input it aliases.
        self.input_aliases: dict[int, int] = {}
        # In-place outputs (fd.add_output(t, alias_input=x), nvFuser's spelling): output
        # position -> position of the input whose storage receives the output after each run
        # (running statistics, optimizer states). Such an output is hidden (not returned by
        # execute) unless it is also added as a plain output, as in nvFuser.
        self.output_aliases: dict[int, int] = {}
        self.hidden_outputs: set[int] = set()

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
        if v in self.outputs and self.outputs.index(v) in self.hidden_outputs:
            # An in-place output also added as a plain one is returned too (nvFuser), at the
            # position of this call among the returned outputs.
            k = self.outputs.index(v)
            self._move_output_last(k)
            self.hidden_outputs.discard(len(self.outputs) - 1)
            return v
        if v in self.outputs:
            raise ValueError(f"T{v.name} is already an output")
        v.memory_type = MemoryType.Global
        self.outputs.append(v)
        return v

    def _move_output_last(self, k: int) -> None:
        last = len(self.outputs) - 1

        def moved(j):
            return last if j == k else (j - 1 if j > k else j)
        self.outputs.append(self.outputs.pop(k))
        self.output_aliases = {moved(o): i for o, i in self.output_aliases.items()}
        self.hidden_outputs = {moved(o) for o in self.hidden_outputs}

    def alias_output_to_input(self, out: TensorView, inp: TensorView) -> None:
        """Make `out` an in-place output: each run writes it into the storage of input `inp`.
        It is hidden (not returned) unless it is already a plain output. Raises ValueError for
        an alias the storage cannot take: another dtype or shape, an input with expanded
        (stride-0) dims, an input another output already writes, an output written twice."""
        if not isinstance(inp, TensorView) or inp not in self.inputs:
            what = f"T{inp.name}" if isinstance(inp, TensorView) else type(inp).__name__
            raise ValueError(f"alias_input {what} is not a tensor input of this fusion; an "
                             "output can only be written into an input's storage")
        if not isinstance(out, TensorView):
            raise TypeError("fusion outputs must be tensors")
        if out in self.inputs:
            raise ValueError(f"T{out.name} is a fusion input; write a copy (fd.ops.set) of it")
        k_in = self.inputs.index(inp)
        if k_in in self.output_aliases.values():
            other = next(o for o, i in self.output_aliases.items() if i == k_in)
            raise ValueError(f"input T{inp.name} already receives output "
                             f"T{self.outputs[other].name}; two outputs cannot be written into "
                             "one input")
        if out in self.outputs and self.outputs.index(out) in self.output_aliases:
            i = self.output_aliases[self.outputs.index(out)]
            raise ValueError(f"T{out.name} is already written into input "
                             f"T{self.inputs[i].name}")
        if out.dtype != inp.dtype:
            raise ValueError(f"T{out.name} is {out.dtype.short_name} but input T{inp.name} is "
                             f"{inp.dtype.short_name}; an in-place output has its input's dtype "
                             "(cast it first)")
        o_ids, i_ids = out.domain.logical_no_reductions, inp.domain.logical_no_reductions
        if len(o_ids) != len(i_ids):
            raise ValueError(f"T{out.name} has rank {len(o_ids)} but input T{inp.name} has rank "
                             f"{len(i_ids)}; an in-place output has its input's shape")
        equal = []
        for d, (o, i) in enumerate(zip(o_ids, i_ids)):
            if i.is_broadcast and i.expanded_extent is not None:
                raise ValueError(f"input T{inp.name} dim {d} is expanded (stride 0: its "
                                 "elements share one memory location); it cannot receive an "
                                 "in-place output")
            if o.is_broadcast != i.is_broadcast:
                kind = {True: "a broadcast (size 1)", False: "not a broadcast"}
                raise ValueError(f"dim {d} of T{out.name} is {kind[o.is_broadcast]} but dim {d} "
                                 f"of input T{inp.name} is {kind[i.is_broadcast]}; an in-place "
                                 "output has its input's shape")
            eo, ei = o.user_extent, i.user_extent
            if eo.value is not None and ei.value is not None and eo.value != ei.value:
                raise ValueError(f"dim {d} of T{out.name} has size {eo.value} but input "
                                 f"T{inp.name} has {ei.value}; an in-place output has its "
                                 "input's shape")
            if not same_value(eo, ei):
                equal.append((eo, ei, f"in-place output T{out.name} dim {d} into input "
                                      f"T{inp.name}"))
        if out in self.outputs:
            k_out = self.outputs.index(out)
        else:
            self.add_output(out)
            k_out = len(self.outputs) - 1
            self.hidden_outputs.add(k_out)
        self.output_aliases[k_out] = k_in
        self.extent_equalities.extend(equal)

    def replace_output(self, old: TensorView, new: TensorView) -> None:
        self.outputs[self.outputs.index(old)] = new
        new.memory_type = MemoryType.Global

    def replace_uses(self, old: TensorView, new: TensorView) -> None:
        """Every expr reading `old` reads `new` instead, and `new` takes `old`'s places among
        the outputs (a rewrite's result standing for the op it replaces)."""
        for use in list(old.uses):
            use.replace_input(old, new)
        while old in self.outputs:
            self.replace_output(old, new)

    # Traversal ---------------------------------------------------------------------------------
    def exprs(self) -> list[Expr]:
        """Exprs needed for the outputs, producers before consumers (deterministic order)."""
        return list(self._walk()[0])

    def _walk(self) -> tuple[list[Expr], set]:
        """exprs() and their set, kept while the graph (ir/base.graph_generation) and the
        outputs are as they were: schedulers' and the segmenter's analyses ask for them hundreds
        of times per fusion (a new process's first BatchNorm call spent a third of its time
        walking the graph again)."""
        kept = self.__dict__.get("_walked")
        outputs = self.outputs
        if (kept is not None and kept[0] == graph_generation() and len(kept[1]) == len(outputs)
                and all(a is b for a, b in zip(kept[1], outputs))):
            return kept[2], kept[3]
        order = self._walk_now()
        self._walked = (graph_generation(), tuple(outputs), order, set(order))
        return order, self._walked[3]

    def _walk_now(self) -> list[Expr]:
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
        seen = set(out)
        for e in self._walk()[0]:
            for v in e.inputs + e.outputs:
                if isinstance(v, TensorView) and v not in seen:
                    seen.add(v)
                    out.append(v)
        return out

    def producers(self, tv: TensorView) -> list[TensorView]:
        d = tv.definition
        return [] if d is None else [i for i in d.inputs if isinstance(i, TensorView)]

    def consumers(self, tv: TensorView) -> list[TensorView]:
        live = self._walk()[1]
        out = []
        for e in tv.uses:
            if e in live:
                out.extend(o for o in e.outputs if isinstance(o, TensorView) and o not in out)
        return out

    def uses_of(self, tv: TensorView) -> list[Expr]:
        live = self._walk()[1]
        return [e for e in tv.uses if e in live]

    def scalar_inputs(self) -> list[Scalar]:
        return [v for v in self.inputs if isinstance(v, Scalar)]

    def clone(self) -> tuple["Fusion", dict]:
        """A deep copy and a map from id(old Val) to the new Val.

        Scheduling mutates a fusion; the executor schedules a clone so that the definition stays
        intact for the reference evaluator and for other input shapes.
        """
        walked = self.__dict__.pop("_walked", None)    # a walk of this graph, not the copy's
        memo: dict = {}
        try:
            new = _deep_copy(self, memo)
        finally:
            if walked is not None:
                self._walked = walked
        return new, {k: v for k, v in memo.items() if isinstance(v, Val)}

    def clone_for_rewrite(self) -> tuple["Fusion", dict]:
        """clone(), for a rewrite another executor runs in this fusion's place: no in-place
        output, because this fusion's executor writes them into their inputs after the
        rewrite's plan computed every output (runtime/output_aliases.py). The hidden ones stay
        marked: nothing returns them to the caller, so a plan of several kernels may write them
        into buffers it keeps (runtime/plan.py)."""
        new, memo = self.clone()
        new.output_aliases = {}
        return new, memo

    def __repr__(self) -> str:
        from .printer import fusion_str
        return fusion_str(self)

    def print_math(self) -> str:
        from .printer import fusion_str
        return fusion_str(self)

    def print_transforms(self) -> str:
        from .printer import transforms_str
        return transforms_str(self)


# Deep copies of the IR ---------------------------------------------------------------------------
# Values copy.deepcopy returns as they are.
_SHARED = (type(None), bool, int, float, complex, str, bytes, type, enum.Enum, frozenset,
           types.FunctionType, types.BuiltinFunctionType, types.ModuleType)
# Classes whose instances are copied as deepcopy's default would (a new instance, its __dict__
# copied), with nothing of copy's protocol to ask: class -> True, or False for the others.
_PLAIN: dict = {}


def _is_plain(cls) -> bool:
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = (
            "__dict__" in dir(cls) and not hasattr(cls, "__slots__")
            and not hasattr(cls, "__deepcopy__") and not hasattr(cls, "__setstate__")
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", None) is getattr(object, "__getstate__", None))
    return plain


def _deep_copy(x, memo: dict):
    """copy.deepcopy(x, memo) for the IR graph, about 1.6x faster: the IR's nodes are plain
    objects (a __dict__, no copy hooks) in lists, tuples, dicts and sets, which it copies without
    copy's per-object protocol look-ups; anything else goes through copy.deepcopy with the same
    memo. A new process's first execute of a segmented fusion makes a few copies per segment."""
    found = memo.get(id(x))
    if found is not None:
        return found
    if isinstance(x, _SHARED):
        return x
    cls = type(x)
    if cls is list:
        y = memo[id(x)] = []
        y.extend([_deep_copy(v, memo) for v in x])
        return y
    if cls is dict:
        y = memo[id(x)] = {}
        for k, v in x.items():
            y[_deep_copy(k, memo)] = _deep_copy(v, memo)
        return y
    if cls is tuple:
        y = memo[id(x)] = tuple([_deep_copy(v, memo) for v in x])
        return y
    if cls is set:
        y = memo[id(x)] = set()
        y.update([_deep_copy(v, memo) for v in x])
        return y
    if _is_plain(cls):
        y = memo[id(x)] = cls.__new__(cls)
        y.__dict__.update({k: _deep_copy(v, memo) for k, v in x.__dict__.items()})
        return y
    return copy.deepcopy(x, memo)
