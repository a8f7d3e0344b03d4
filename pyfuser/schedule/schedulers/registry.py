"""Which scheduler takes a fusion, and why.

Schedulers are tried in order; the first whose can_schedule accepts the whole fusion wins.
A fusion none accepts runs through the reference evaluator with a warning (never a wrong result);
the executor reports that in RunInfo so tests notice.
"""
from __future__ import annotations

import dataclasses

from ...ir.exprs import GatherOp, WindowOp
from ...ir.tensor import TensorView
from ...ir.id_graph import IdGraph, reshape_cycle, self_mapping
from .. import roles
from ..op_support import DEDICATED_OPS, segment_kind
from . import (inner_outer_persistent, inner_persistent, matmul, outer_persistent, pointwise,
               reduction, scan, scatter, topk, transpose)


@dataclasses.dataclass(frozen=True)
class Choice:
    scheduler: object | None     # the scheduler module, or None
    reason: str                  # why it was chosen, or why none was
    rejected: tuple = ()         # (name, reason) of the schedulers tried before


# `scan`, `topk`, `scatter` and `matmul` are the schedulers of their ops alone (op_support.DEDICATED_OPS):
# a fusion meets one of them or the others, so their place changes no choice.
SCHEDULERS = [inner_outer_persistent, outer_persistent, inner_persistent, reduction, transpose,
              pointwise, scan, topk, scatter, matmul]


def register(module, first: bool = True) -> None:
    """Add a scheduler module (NAME, can_schedule, compute_heuristics, schedule)."""
    if module in SCHEDULERS:
        return
    SCHEDULERS.insert(0 if first else len(SCHEDULERS), module)


def choose(fusion, exclude: dict | None = None, only: str | None = None) -> Choice:
    """The first scheduler that takes `fusion` once its roles are separated (what the executor
    schedules: roles.scheduling_clone). `exclude`: scheduler name -> why it is not asked (its
    heuristic refused the shapes of a call: the executor segments again without it). `only`:
    the scheduler a recorded choice named (a replayed segmentation decision): asked alone, the
    ones before it taken to refuse as they did when it was recorded (not listed in
    `rejected`); None where it refuses now."""
    # One exact ID graph for both checks (the segmenter asks this for every candidate group).
    graph = IdGraph(fusion)
    if self_mapping(graph, fusion.tensors()) is not None:
        fusion, _ = roles.scheduling_clone(fusion)
        graph = IdGraph(fusion)
        why = self_mapping(graph, fusion.tensors())
        if why is not None:
            return Choice(None, f"{why}, and no copy separates the roles (the second role's "
                                "computation holds a reduction or another op that is not copied)")
    # Scalar arithmetic (a mean's divisor from extents: ScalarOp) is part of whatever segment
    # reads it; only tensor expressions decide the segment kind.
    other = sorted({type(e).__name__ for e in fusion.exprs() if segment_kind(e) != "kernel"
                    and any(isinstance(o, TensorView) for o in e.outputs)})
    if other:
        return Choice(None, f"ops no scheduler generates kernels for: {', '.join(other)} "
                            "(schedule/op_support.py)")
    why = reshape_cycle(graph, fusion.tensors()) or _read_in_global_but_computed(fusion)
    if why is not None:
        return Choice(None, why)
    rejected = []
    dedicated = {DEDICATED_OPS[type(e)] for e in fusion.exprs() if type(e) in DEDICATED_OPS}
    for s in SCHEDULERS:
        if exclude and s.NAME in exclude:
            rejected.append((s.NAME, exclude[s.NAME]))
            continue
        asked = s.NAME in dedicated if dedicated else s.NAME not in DEDICATED_OPS.values()
        if only is not None and s.NAME != only:
            continue
        if not asked:
            # Not listed either: a scan's plan says why the scan scheduler refused, any other
            # plan says nothing of it.
            continue
        ok, why = s.can_schedule(fusion)
        if ok:
            return Choice(s, why, tuple(rejected))
        rejected.append((s.NAME, why))
    return Choice(None, refusal(rejected), tuple(rejected))


def refusal(rejected, exclude: dict | None = None) -> str:
    """The reason of a Choice no scheduler took, from its `rejected` (name, why) pairs; those
    `exclude` names given its reasons (a recorded refusal told with the current call's)."""
    reasons = "; ".join(f"{n}: {exclude[n] if exclude and n in exclude else w}"
                        for n, w in rejected)
    return f"no scheduler takes the whole fusion ({reasons})"


def _read_in_global_but_computed(fusion) -> str | None:
    """Why no kernel takes a window (slice, pad) or a gather (take_along_axis, index_select,
    ...) of a tensor it computes, or None: both read their source in global memory at their
    own offsets, so the segmenter ends a segment at the source."""
    for e in fusion.exprs():
        if isinstance(e, WindowOp) and e.src.definition is not None:
            return (f"T{e.outputs[0].name} is a window (slice or pad) of T{e.src.name}, which "
                    "the fusion computes; a window reads its source from global memory")
        if isinstance(e, GatherOp) and e.src.definition is not None:
            return (f"T{e.outputs[0].name} is a {e.what} of T{e.src.name}, which the fusion "
                    "computes; a gather reads its source from global memory")
    return None


def by_name(name: str):
    for s in SCHEDULERS:
        if s.NAME == name:
            return s
    raise KeyError(f"no scheduler named {name!r}; have {[s.NAME for s in SCHEDULERS]}")
