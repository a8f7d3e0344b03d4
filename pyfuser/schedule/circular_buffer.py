"""circular_buffer: overlap the loads of iteration i + prefetch with the compute of iteration i."""
from __future__ import annotations

from ..ir.exprs import LoadStoreOp
from ..ir.tensor import (CircularBufferOptions, MemoryType, PipelinedBuffer, ScheduleError,
                         TensorView, WarpSpecialized)

# The register file of one SM holds 65536 32-bit registers; setmaxnreg hands them out per warp
# group of 128 threads.
REGISTER_FILE = 65536


def check_register_counts(producer: int, compute: int, compute_groups: int) -> str | None:
    """Why a warp-specialized register split is impossible, or None.

    setmaxnreg.inc waits until the SM has the registers it asks for; asking more than the file
    holds makes the kernel hang, so the check runs before any code is generated.
    """
    for what, n in (("producer", producer), ("compute", compute)):
        if not 24 <= n <= 256 or n % 8:
            return f"{what} register count {n} must be a multiple of 8 in 24..256"
    total = (producer + compute * compute_groups) * 128
    if total > REGISTER_FILE:
        return (f"{producer} + {compute_groups} x {compute} registers per thread need {total} "
                f"registers for the warp groups, more than the {REGISTER_FILE} of the register file")
    return None


def circular_buffer(tv: TensorView, stages: int, prefetch: int | None = None,
                    kind: PipelinedBuffer | WarpSpecialized | None = None) -> TensorView:
    """Make tv a circular buffer of `stages` slots over the serial loop left of its compute-at
    position.

    Pipelined:                              Warp-specialized (producer warp group on `kind.on`):
      for s in prefetch: load(s)              producer: for i: wait empty[i%S]; load(i)
      for i: load(i + prefetch)               compute:  for i: wait full[i%S]; use(i);
             wait(i); use(i)                                     arrive empty[i%S]
    """
    kind = kind or PipelinedBuffer()
    d = tv.definition
    if not isinstance(d, LoadStoreOp):
        raise ScheduleError(f"circular_buffer on T{tv.name}: only loads (cache_after) can be "
                            "circular-buffered")
    if tv.memory_type == MemoryType.Global:
        raise ScheduleError(f"circular_buffer on T{tv.name}: a global tensor needs no buffering")
    if stages < 2:
        raise ScheduleError(f"circular_buffer on T{tv.name}: stages must be at least 2, got {stages}")
    prefetch = stages - 1 if prefetch is None else prefetch
    if not 0 < prefetch < stages:
        raise ScheduleError(f"circular_buffer on T{tv.name}: prefetch {prefetch} must be in "
                            f"1..{stages - 1}")
    if isinstance(kind, WarpSpecialized):
        if not d.load_kind.is_tma:
            raise ScheduleError(f"circular_buffer on T{tv.name}: warp specialization needs a TMA "
                                "load (the producer warp group issues bulk copies)")
        if not kind.on.is_thread_dim:
            raise ScheduleError(f"circular_buffer on T{tv.name}: warp specialization is on a "
                                f"thread dimension, not {kind.on.short}")
        if kind.producer_registers is not None and kind.compute_registers is not None:
            why = check_register_counts(kind.producer_registers, kind.compute_registers, 1)
            if why:
                raise ScheduleError(f"circular_buffer on T{tv.name}: {why}")
    tv.circular_buffer_options = CircularBufferOptions(stages, prefetch, kind)
    return tv
