"""Index checks of the indexing ops (take_along_axis, gather, index_select, embedding).

A kernel that reads a tensor at an index tensor's values checks each value against the dim it
indexes; where one is outside [0, size) it skips the read and records the first such value in
a small workspace (`index_error`: [check number + 1, value], zero while no check failed). The
executor reads the record and raises IndexOutOfRange, naming the op, the value and the size, as
torch does for its own indexing ops: never a read out of bounds, never an error that kills the
CUDA context (a device assert would).

On the GPU nothing waits for the kernel, as CUDA reports its own errors: the thread that
claims the record also copies it into a second workspace in pinned host memory, which the
kernel writes through unified addressing (`index_report`), and the host looks at that copy,
a read of its own memory with no copy queued and no event, before the plan's next launch and
at the start of any fusion's execute; `pyfuser.check_index_errors()` waits for the GPU first,
and exit warns about an error nothing raised. A wait after each launch cost the embedding bar
24 us of 64, and a copy of the record queued behind each launch 7 us
(bench/results/2026-11-27/h200-index-check.txt). PYFUSER_ENABLE=sync_index_checks waits after
each launch instead, so the failing call itself raises.
"""
from __future__ import annotations

import atexit
import sys
import weakref


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


LATE = (" (found after the call that launched the kernel returned: index checks are read "
        "asynchronously, as CUDA's own errors; PYFUSER_ENABLE=sync_index_checks raises from "
        "that call)")


class DeferredIndexChecks:
    """The index-error record of one launch plan (a fixed input signature, so the checked
    sizes are fixed too) and the copy of it the kernel writes into host memory."""

    def __init__(self, record, report, checks, sizes, device, wait_each: bool = False):
        self.record = record            # in GPU memory, zero while clean
        self.report = report            # pinned host memory, the kernel's copy of the record
        self.view = report.numpy()      # read with no torch call (the same memory)
        self.checks = tuple((what, dim, size) for (what, dim, _), size in zip(checks, sizes))
        self.device = device
        self.wait_each = wait_each
        key = id(self)
        LIVE[key] = weakref.ref(self, lambda _, key=key: LIVE.pop(key, None))

    def after_launch(self) -> None:
        """With wait_each, wait for the kernel just launched and raise from this call."""
        if self.wait_each:
            import torch
            torch.cuda.current_stream(self.device).synchronize()
            self.settle(late=False)

    def settle(self, late: bool = True) -> None:
        """Raise IndexOutOfRange if a kernel of this plan reported an index out of range (one
        that has not finished yet is seen later), after clearing the record and the report for
        the launches to come."""
        if not self.view[0]:
            return
        record = [int(self.view[0]), int(self.view[1])]
        self.view[:] = 0
        self.record.zero_()     # ordered before the next launch; a kernel in flight keeps it
        try:
            raise_if_failed(record, self.checks, int)
        except IndexOutOfRange as e:
            if late:
                raise IndexOutOfRange(str(e) + LATE) from None
            raise


# The plans whose kernels check indices, id -> weak reference (a plan released with its
# executor leaves). A dict, not a WeakSet: every execute asks whether it is empty, which costs a
# WeakSet 0.17 us of Python and a dict nothing.
LIVE: "dict[int, weakref.ref]" = {}


def _live_checks() -> list:
    return [c for c in (r() for r in list(LIVE.values())) if c is not None]


def settle_all() -> None:
    """Raise the first index error any plan's kernels reported so far."""
    for checks in _live_checks():
        checks.settle()


def check_index_errors() -> None:
    """Wait for the GPUs and raise IndexOutOfRange if a kernel found an index out of range
    (pyfuser.check_index_errors)."""
    if LIVE:
        import torch
        for d in {c.device for c in _live_checks()}:
            torch.cuda.synchronize(d)
    settle_all()


def _warn_at_exit() -> None:
    try:
        check_index_errors()
    except IndexOutOfRange as e:
        print(f"pyfuser: an index check failed and was not raised before exit: {e}",
              file=sys.stderr)
    except Exception:       # noqa: BLE001 - the CUDA context may already be gone at exit
        pass


atexit.register(_warn_at_exit)
