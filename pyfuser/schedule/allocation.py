"""set_allocation_domain: how a tensor lies in memory."""
from __future__ import annotations

from ..ir.tensor import MemoryType, ScheduleError, TensorView


def set_allocation_domain(tv: TensorView, ids, contiguity=None) -> TensorView:
    """Allocate tv with `ids` outer to inner.

    A global tensor takes a permutation of its logical IDs (its stride order). A shared or local
    tensor takes a permutation of loop IDs; those left of its compute-at position are dropped
    when it is allocated, since each iteration of the shared loops gets its own buffer.
    """
    ids = list(ids)
    if len(set(ids)) != len(ids):
        raise ScheduleError(f"set_allocation_domain on T{tv.name}: an ID appears twice")
    pool = tv.domain.logical if tv.memory_type == MemoryType.Global else tv.domain.loop
    what = "logical" if tv.memory_type == MemoryType.Global else "loop"
    if set(ids) != set(pool):
        raise ScheduleError(f"set_allocation_domain on T{tv.name}: the IDs must be a permutation "
                            f"of its {what} domain ({len(pool)} IDs)")
    if contiguity is None:
        contiguity = [None if i.is_broadcast else True for i in ids]
    if len(contiguity) != len(ids):
        raise ScheduleError(f"set_allocation_domain on T{tv.name}: {len(contiguity)} contiguity "
                            f"flags for {len(ids)} IDs")
    tv.domain.allocation = ids
    tv.domain.contiguity = [None if i.is_broadcast else c for i, c in zip(ids, contiguity)]
    return tv


def pad_shared_rows(tv: TensorView, row_id, pad: int) -> TensorView:
    """Follow each row of tv's shared-memory buffer by `pad` unused elements. A row is what the
    allocated IDs from loop ID `row_id` inward hold. A tile read by columns (the lanes of a warp
    walk down one column) then spreads those reads over the banks: with rows of 32 four-byte
    elements and no padding, every element of a column is in the same bank."""
    if tv.memory_type != MemoryType.Shared:
        raise ScheduleError(f"pad_shared_rows on T{tv.name}: only shared-memory buffers are "
                            "padded")
    if row_id not in tv.domain.loop:
        raise ScheduleError(f"pad_shared_rows on T{tv.name}: the row's first ID is none of its "
                            "loop IDs")
    if pad < 0:
        raise ScheduleError(f"pad_shared_rows on T{tv.name}: padding {pad} is negative")
    tv.row_padding = (row_id, int(pad)) if pad else None
    return tv
