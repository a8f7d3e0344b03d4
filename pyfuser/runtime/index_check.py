"""Index checks of the indexing ops (take_along_axis, gather, index_select, embedding).

A kernel that reads a tensor at an index tensor's values checks each value against the dim it
indexes; where one is outside [0, size) it skips the read and records the first such value in
a small workspace (`index_error`: [check number + 1, value], zero while no check failed). The
executor reads the record and raises IndexOutOfRange, naming the op, the value and the size, as
torch does for its own indexing ops: never a read out of bounds, never an error that kills the
CUDA context (a device assert would).

On the GPU the record is read without waiting for the kernel, as CUDA reports its own errors:
each launch queues a copy of the record into pinned host memory behind the kernel
(DeferredIndexChecks), and the copies are looked at when they have arrived: before the plan's
next launch, at the start of any fusion's execute, by `pyfuser.check_index_errors()` (which
waits for them), and at exit (a warning). A wait per call cost the embedding bar 24 us of 64
(bench/results/2026-11-27/h200-index-check.txt). PYFUSER_ENABLE=sync_index_checks waits after
each launch instead, so the failing call itself raises.
"""
from __future__ import annotations

import atexit
import collections
import sys


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
    sizes are fixed too) and the copies of it not looked at yet, oldest first."""

    # Copies in flight before a launch waits for the oldest (a bound on pinned buffers).
    OUTSTANDING = 8

    def __init__(self, record, checks, sizes, device, wait_each: bool = False):
        self.record = record                    # the workspace on the GPU, zero while clean
        self.checks = tuple((what, dim, size) for (what, dim, _), size in zip(checks, sizes))
        self.device = device
        self.wait_each = wait_each
        self.pending: collections.deque = collections.deque()    # (event, pinned copy)
        self.spare: list = []

    def after_launch(self) -> None:
        """Queue a copy of the record behind the kernel just launched (no wait); with
        wait_each, wait for it and raise now."""
        import torch
        host = self.spare.pop() if self.spare else torch.empty(2, dtype=torch.int64,
                                                                pin_memory=True)
        host.copy_(self.record, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self.pending.append((event, host))
        UNREAD.add(self)
        if self.wait_each:
            self.settle(wait=True, late=False)

    def settle(self, wait: bool = False, late: bool = True) -> None:
        """Look at the copies that have arrived (all of them with `wait`, and the oldest when
        too many are in flight); raise IndexOutOfRange for the first failed check, after
        zeroing the record for the launches to come."""
        while self.pending:
            event, host = self.pending[0]
            if not wait and len(self.pending) <= self.OUTSTANDING and not event.query():
                return
            event.synchronize()
            self.pending.popleft()
            self.spare.append(host)
            record = host.tolist()
            if record[0]:
                # Later copies show this failure again (the kernel keeps the first one).
                self.spare.extend(h for _, h in self.pending)
                self.pending.clear()
                UNREAD.discard(self)
                self.record.zero_()
                try:
                    raise_if_failed(record, self.checks, int)
                except IndexOutOfRange as e:
                    if late:
                        raise IndexOutOfRange(str(e) + LATE) from None
                    raise
        UNREAD.discard(self)


# The plans with copies of their record not looked at yet.
UNREAD: set = set()


def settle_all(wait: bool = False) -> None:
    """Look at every plan's arrived copies (all, with `wait`): raise the first failure."""
    for checks in list(UNREAD):
        checks.settle(wait=wait)


def check_index_errors() -> None:
    """Wait for every launched kernel that checks indices and raise IndexOutOfRange if one
    found an index out of range (pyfuser.check_index_errors)."""
    settle_all(wait=True)


def _warn_at_exit() -> None:
    try:
        settle_all(wait=True)
    except IndexOutOfRange as e:
        print(f"pyfuser: an index check failed and was not raised before exit: {e}",
              file=sys.stderr)
    except Exception:       # noqa: BLE001 - the CUDA context may already be gone at exit
        pass


atexit.register(_warn_at_exit)
