"""Val and Expr: the nodes of the fusion IR graph, and per-fusion naming."""
from __future__ import annotations

import itertools
import threading
import weakref

_local = threading.local()
_fallback_counters: dict[str, itertools.count] = {}


# Fusion -> the frontend's ops object that operators on its tensors call (a + b, -a, a < b),
# registered by the frontend (ir imports nothing above it). Weak: a fusion's clones (deep copies
# for scheduling) and dropped fusions carry none.
frontend_ops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# Bumped by every change to the graph's wiring (an Expr made, detached or given a new input):
# Fusion.exprs() keeps its last walk while the generation and the outputs are unchanged.
# Code that rewires an Expr's inputs or outputs in place, not through these, calls
# graph_changed() itself.
_graph_generation = 0


def graph_generation() -> int:
    return _graph_generation


def graph_changed() -> None:
    global _graph_generation
    _graph_generation += 1


def current_fusion():
    stack = getattr(_local, "fusion_stack", None)
    return stack[-1] if stack else None


def push_fusion(fusion) -> None:
    if not hasattr(_local, "fusion_stack"):
        _local.fusion_stack = []
    _local.fusion_stack.append(fusion)


def pop_fusion(fusion) -> None:
    stack = _local.fusion_stack
    assert stack and stack[-1] is fusion, "fusion context exited out of order"
    stack.pop()


def next_name(kind: str, fusion=None) -> int:
    """Names count per kind and per fusion (T0, T1 for tensors; i0 for scalars; ...)."""
    fusion = fusion if fusion is not None else current_fusion()
    if fusion is not None:
        return fusion.next_name(kind)
    return next(_fallback_counters.setdefault(kind, itertools.count()))


class Val:
    """A value: a scalar, an IterDomain or a TensorView. `definition` is the Expr producing it."""

    name_kind = "v"

    def __init__(self, fusion=None):
        self.fusion = fusion if fusion is not None else current_fusion()
        self.name = next_name(self.name_kind, self.fusion)
        self.definition: Expr | None = None
        self.uses: list[Expr] = []

    # Identity semantics: two Vals are equal only if they are the same object.
    __hash__ = object.__hash__

    def __eq__(self, other):  # noqa: D105 - identity
        return self is other


class Expr:
    """An operation with input and output Vals. Creating one wires uses and definitions."""

    def __init__(self, inputs, outputs):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        graph_changed()
        for v in self.inputs:
            v.uses.append(self)
        for v in self.outputs:
            v.definition = self

    def detach(self) -> None:
        """Remove this expr from the graph (its outputs lose their definition)."""
        graph_changed()
        for v in self.inputs:
            if self in v.uses:
                v.uses.remove(self)
        for v in self.outputs:
            if v.definition is self:
                v.definition = None

    def replace_input(self, old: Val, new: Val) -> None:
        graph_changed()
        for i, v in enumerate(self.inputs):
            if v is old:
                self.inputs[i] = new
                if self in old.uses:
                    old.uses.remove(self)
                new.uses.append(self)

    @property
    def op_name(self) -> str:
        return type(self).__name__

    @property
    def output(self):
        return self.outputs[0]

    __hash__ = object.__hash__
