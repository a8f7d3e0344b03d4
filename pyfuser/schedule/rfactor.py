"""rfactor: split one reduction into a partial reduction and a final one.

    T1[i0, r1] = sum(T0)                 rfactor(T1, [1]) after T1.split(1, 128)
    loop (i0, r1o, r1i)                  T2[i0, r1o, i1i] = sum over r1o of T0   (partials)
                                         T1[i0, r1i]      = sum over r1i of T2
The rfactor tensor T2 reduces the named axes and keeps the other reduction axes as iterations;
T1 then reduces what is left (typically across threads).
"""
from __future__ import annotations

from ..ir.exprs import ReductionOp
from ..ir.iter_domain import (IterDomain, IterType, Merge, Split, ancestors, id_exprs_between,
                              merge_ids, replayed_divisible, split_id)
from ..ir.tensor import MemoryType, ScheduleError, TensorDomain, TensorView


def _replay_onto(exprs, mapping: dict) -> None:
    """Replay Split/Merge exprs onto mapped IDs, extending `mapping` (old ID -> new ID)."""
    for e in exprs:
        if isinstance(e, Split):
            o, i = split_id(mapping[e.in_id], e.factor, e.inner_split,
                            replayed_divisible(e, mapping[e.in_id]))
            mapping[e.outer], mapping[e.inner] = o, i
        elif isinstance(e, Merge):
            mapping[e.out] = merge_ids(mapping[e.outer], mapping[e.inner])


def rfactor(tv: TensorView, axes: list[int]) -> TensorView:
    """Returns the new partial-reduction tensor; tv keeps the remaining reduction."""
    d = tv.definition
    if not isinstance(d, ReductionOp):
        raise ScheduleError(f"rfactor on T{tv.name}: it is not the output of a reduction")
    if tv.compute_at_pos or tv.max_producer_pos:
        raise ScheduleError(f"rfactor on T{tv.name}: call rfactor before inlining")
    n = len(tv.domain.loop)
    pos = sorted({a + n if a < 0 else a for a in axes})
    for a in pos:
        if not 0 <= a < n:
            raise ScheduleError(f"rfactor on T{tv.name}: axis {a} out of range for {n} loop axes")
        if not tv.domain.loop[a].is_reduction:
            raise ScheduleError(f"rfactor on T{tv.name}: axis {a} ({tv.domain.loop[a]!r}) is not "
                                "a reduction axis")
    rf_axes = {tv.domain.loop[a] for a in pos}
    if len(rf_axes) == sum(1 for i in tv.domain.loop if i.is_reduction):
        raise ScheduleError(f"rfactor on T{tv.name}: rfactoring every reduction axis leaves "
                            "nothing for the final reduction; leave at least one out")
    old = tv.domain
    root = old.maybe_root
    all_exprs = id_exprs_between(root, old.loop)
    # The exprs on the paths to the reduction leaves, replayed into the partial tensor's
    # logical domain: besides those that take a reduction ID, a merge of two broadcasts that a
    # full reduction then merges into its reduced dim ([1, 1, N] averaged over N).
    red_exprs = id_exprs_between(root, [i for i in old.loop if i.is_reduction])
    on_red_path = set(red_exprs)
    iter_exprs = [e for e in all_exprs if e not in on_red_path]
    fusion = tv.fusion
    with fusion:
        # The partial tensor: same root, the reduction transforms become its logical domain.
        rf_map = {i: i.clone() for i in root}
        rf_root = [rf_map[i] for i in root]
        _replay_onto(red_exprs, rf_map)
        red_leaves = [i for i in old.loop if i.is_reduction]
        rf_logical = []
        for r in root:
            if r.is_reduction:
                for leaf in red_leaves:
                    # A leaf of merged reduction roots comes after the first of them only.
                    if r in ancestors(leaf, root) and rf_map[leaf] not in rf_logical:
                        new = rf_map[leaf]
                        new.iter_type = IterType.Reduction if leaf in rf_axes else IterType.Iteration
                        new.is_rfactor_product = True
                        rf_logical.append(new)
            else:
                rf_logical.append(rf_map[r])
        _replay_onto(iter_exprs, rf_map)
        rf_loop = [rf_map[i] for i in old.loop]
        rf = TensorView(TensorDomain(rf_logical, root=rf_root, loop=rf_loop), tv.dtype,
                        MemoryType.Local)
        # The final reduction: its root is the partial tensor's logical domain minus the
        # rfactored axes; the kept reduction axes stay reductions.
        old_of_rf = {v: k for k, v in rf_map.items()}
        fin_map: dict = {}
        fin_root = []
        for i in rf_logical:
            if i.iter_type == IterType.Reduction:
                continue
            new = IterDomain(i.extent, IterType.Reduction if old_of_rf[i].is_reduction else i.iter_type,
                             expanded_extent=i.expanded_extent)
            fin_map[old_of_rf[i]] = new
            fin_root.append(new)
        # In order, so that a split of a split's output (rows over blocks, then over threadIdx.y)
        # finds its input already replayed.
        for e in iter_exprs:
            if all(i in fin_map for i in e.inputs):
                _replay_onto([e], fin_map)
        fin_loop = [fin_map[i] for i in old.loop if i not in rf_axes and i in fin_map]
        # Both tensors keep the parallelization the loop already had.
        for i in old.loop:
            for new in (rf_map.get(i), fin_map.get(i)):
                if new is not None:
                    new.parallel_type = i.parallel_type
        tv.domain = TensorDomain(list(fin_root), loop=fin_loop,
                                 allocation=None, contiguity=None)
        init = d.init
        op = d.op
        inp = d.inputs[0]
        d.detach()
        ReductionOp(op, rf, inp, init)
        ReductionOp(op, tv, rf, init)
    return rf

