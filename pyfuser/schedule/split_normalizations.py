"""Normalizations that no kernel takes whole, rewritten so that a plan of kernels recomputes
their pointwise work from the inputs instead of storing it.

A normalization uses a tensor along the reduced dims on both sides of its reduction: softmax's
E = exp(x - max) is summed and then divided by that sum. When no persistent kernel takes the
fusion (the row or the column is too long for a block, or the heuristic refuses the shapes),
the segmenter cuts at the reduction, and E, full size and float32, is written by one kernel
and read back by another. Recomputing it from the inputs costs a read of x instead (bf16:
2 bytes an element where E costs 8), and its exp again:

    Before:  C = cast(x); M = max(C); E = exp(C - M); S = sum(E); y = E / S
    After:   K = lse_key(cast(x)); KR = logsumexp(K); M = lse_max(KR); S = lse_sum(KR)
             y = exp(cast(x) - M) / S

Three steps, all made for the kernels that read their inputs once per pass over the rows:
every max / sum-of-exp pair becomes one logsumexp reduction (logsumexp.fuse_logsumexp_for_
passes: one reduction kernel reads x once for both statistics), every two-pass variance a
one-pass one (one_pass_variance: the sums of x and x^2 in float64, one reduction kernel for
the mean and the variance), and every tensor used across a reduction gets a copy of its
computation for the uses after it (recompute.recompute_each_pass). The segmenter then finds
the statistics' reduction kernels and one pointwise (or transpose) kernel reading x and the
statistics: the softmax of a transposed [4096, 8192] bf16 is two kernels that read x twice and
write y once, and so is BatchNorm's forward over an NCHW [32, 256, 56, 56] (three without).

Where: the executor asks `better_split` for the plan of several segments the segmenter made,
of the fusion as it is, or after the heuristic of the scheduler that takes the whole fusion
refused a call's shapes (the outer persistent one, where a block would read under a sector of
each row, or where the reduced rows do not fit on chip). It keeps the rewrite only where its
plan has fewer segments, or as many that store fewer bytes between them (each symbolic extent
counted as in the segmenter's merge ranking): the fusion's own plan stays where it already
recomputes (BatchNorm's statistics over a forwarded x - mean, where the variance is not a
two-pass one). The executor runs a rewrite through another executor
(runtime/rewritten_plan.py), keeps the split's segmentation in the disk cache beside the
fusion's (`decisions_of`); `explain` shows it as "rewritten first".
"""
from __future__ import annotations

from ..ir.tensor import ScheduleError
from .logsumexp import fuse_logsumexp_for_passes, pairs_fused_for_passes
from .one_pass_variance import one_pass_variance, two_pass_variances
from .recompute import recompute_each_pass, uses_across_reductions
from .schedulers.base import reduction_tensors
from .schedulers.reduction import broadcast_back

DESCRIPTION = ("normalization split for a plan of kernels: each pass over the reduced dims "
               "recomputes from the inputs")


def split_normalizations(fusion):
    """A clone of `fusion` rewritten as the module docstring says, or None where the rewrite
    changes nothing (no reduction broadcast back, no tensor used across one, no logsumexp
    pair, no two-pass variance)."""
    reds = [r for r in reduction_tensors(fusion) if broadcast_back(fusion, r)]
    if not reds or not (uses_across_reductions(fusion, reds) or pairs_fused_for_passes(fusion)
                        or two_pass_variances(fusion)):
        return None
    clone, _ = fusion.clone_for_rewrite()
    fuse_logsumexp_for_passes(clone)
    one_pass_variance(clone)
    try:
        recompute_each_pass(clone, reduction_tensors(clone))
    except ScheduleError:          # a tensor across a reduction computed from another one
        return None
    return clone


def stored_bytes(segmented) -> int:
    """Bytes of the tensors a plan's segments write for other segments to read (each symbolic
    extent counted as the segmenter's _UNKNOWN_EXTENT)."""
    from .segmenter import _bytes
    outputs = set(segmented.fusion.outputs)
    return sum(_bytes(t) for seg in segmented.segments for t in seg.outputs
               if t not in outputs)


def better_split(fusion, segmented, exclude=None, decisions_of=None):
    """(the rewritten fusion, its segmentation) where `segmented`, the plan of `fusion` with
    the schedulers in `exclude` refused (None: none), has several segments and the rewrite's
    plan has fewer, or as many storing fewer bytes between them; None otherwise.
    `decisions_of(split)`: where the segmenter keeps the split's decision (segmenter.segment's
    `decisions`; the executor's disk cache, so that a new process does not search its merges
    again), or None."""
    from .segmenter import _plan_cost, segment
    if len(segmented.segments) < 2 or not (_stores_along_reduced_dims(fusion, segmented)
                                           or two_pass_variances(fusion)):
        return None                  # (asked first: segmenting the split costs a search)
    split = split_normalizations(fusion)
    if split is None:
        return None
    again = segment(split, exclude, decisions_of(split) if decisions_of else None)
    cost, own = _plan_cost(again.segments), _plan_cost(segmented.segments)
    if cost > own or (cost == own and stored_bytes(again) >= stored_bytes(segmented)):
        return None
    return split, again


def _stores_along_reduced_dims(fusion, segmented) -> bool:
    """Whether a segment of the plan writes, for another to read, a tensor over all the
    reduced dims of a reduction broadcast back (softmax's exp(x - max)): what the split
    recomputes instead."""
    from ..ir.id_graph import IdGraph
    graph = IdGraph(fusion)
    reduced = [[i for i in r.domain.maybe_root if i.is_reduction and not i.is_broadcast]
               for r in reduction_tensors(fusion) if broadcast_back(fusion, r, graph)]
    outputs = set(fusion.outputs)
    for seg in segmented.segments:
        for t in seg.outputs:
            if t in outputs:
                continue
            ids = [i for i in t.domain.logical_no_reductions if not i.is_broadcast]
            if any(ids and all(any(graph.mapped(i, r) for i in ids) for r in dims)
                   for dims in reduced if dims):
                return True
    return False
