"""circular_buffer: overlap the loads of iteration i + prefetch with the compute of iteration i."""
from __future__ import annotations

from ..ir.exprs import LoadKind, LoadStoreOp
from ..kir.registers import REGISTER_FILE, check_register_counts  # noqa: F401 (re-exported)
from ..ir.tensor import (CircularBufferOptions, CpAsyncPipelined, MemoryType, PipelinedBuffer,
                         ScheduleError, TensorView, WarpSpecialized)


def circular_buffer(tv: TensorView, stages: int, prefetch: int | None = None,
                    kind: PipelinedBuffer | WarpSpecialized | CpAsyncPipelined | None = None
                    ) -> TensorView:
    """Make tv a circular buffer of `stages` slots over the serial loop left of its compute-at
    position.

    Pipelined:                              Warp-specialized (producer warp group on `kind.on`):
      for s in prefetch: load(s)              producer: for i: wait empty[i%S]; load(i)
      for i: load(i + prefetch)               compute:  for i: wait full[i%S]; use(i);
             wait(i); use(i)                                     arrive empty[i%S]

    cp.async pipelined (the default kind of a cp.async load): the pipelined shape above, each
    stage one cp.async group per thread (commit after every issue, wait_group before use).
    """
    d = tv.definition
    if not isinstance(d, LoadStoreOp):
        raise ScheduleError(f"circular_buffer on T{tv.name}: only loads (cache_after) can be "
                            "circular-buffered")
    if kind is None:
        kind = CpAsyncPipelined() if d.load_kind == LoadKind.CpAsync else PipelinedBuffer()
    if isinstance(kind, CpAsyncPipelined) != (d.load_kind == LoadKind.CpAsync) and \
            not isinstance(kind, WarpSpecialized):
        raise ScheduleError(f"circular_buffer on T{tv.name}: the cp.async pipelined kind goes "
                            "with cp.async loads, and a cp.async load with it (its stages "
                            f"complete on cp.async groups), not {d.load_kind.value} with "
                            f"{type(kind).__name__}")
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
