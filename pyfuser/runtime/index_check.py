"""Index checks of the indexing ops (take_along_axis, gather, index_select, embedding).

A kernel that reads a tensor at an index tensor's values checks each value against the dim it
indexes; where one is outside [0, size) it skips the read and records the first such value in
a small workspace (`index_error`: [check number + 1, value], zero while no check failed). The
executor reads the record after the launch and raises IndexOutOfRange, naming the op, the value
and the size, as torch does for its own indexing ops: never a read out of bounds, never an
error that kills the CUDA context (a device assert would).
"""
from __future__ import annotations


class IndexOutOfRange(IndexError):
    """An index tensor held a value outside the dim it indexes."""


def index_error_message(what: str, dim: int, value: int, size: int) -> str:
    return (f"{what}: index {value} is out of range for dim {dim} of size {size} (valid indices "
            f"are 0 to {size - 1})" if size > 0 else
            f"{what}: index {value} is out of range for dim {dim} of size 0 (it has no element)")


def raise_if_failed(record, checks, size_of) -> None:
    """Raise IndexOutOfRange if `record` (the workspace's two values) names a failed check.
    `checks`: (op name, dim, extent) per check number; size_of(extent) its size in this call."""
    failed = int(record[0])
    if failed == 0:
        return
    what, dim, extent = checks[failed - 1]
    raise IndexOutOfRange(index_error_message(what, dim, int(record[1]), int(size_of(extent))))
