"""circular_buffer: stages/prefetch checks, warp-specialized register checks."""
import pytest

from pyfuser import FusionDefinition
from pyfuser.ir import (CircularBufferOptions, CpAsyncPipelined, LoadKind, ParallelType,
                        PipelinedBuffer, ScheduleError, WarpSpecialized)
from pyfuser.ir.printer import tv_str
from pyfuser.schedule import cache_after, check_register_counts, circular_buffer


def _cached(kind=LoadKind.TmaBulk):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.exp(x))
    return fd, cache_after(x, kind)


def test_pipelined_default_prefetch_is_stages_minus_one():
    fd, c = _cached()
    assert circular_buffer(c, 3) is c
    assert c.circular_buffer_options == CircularBufferOptions(3, 2, PipelinedBuffer())
    assert tv_str(c).endswith(" circular_buffer( stages=3, prefetch=2, PipelinedBuffer )")


@pytest.mark.parametrize("stages, prefetch", [(2, 1), (4, 1), (4, 3), (8, 6)])
def test_valid_stages_and_prefetch(stages, prefetch):
    fd, c = _cached()
    circular_buffer(c, stages, prefetch)
    assert (c.circular_buffer_options.stages, c.circular_buffer_options.prefetch) == (stages,
                                                                                     prefetch)


@pytest.mark.parametrize("stages, prefetch, message", [
    (1, None, "stages must be at least 2, got 1"),
    (0, None, "stages must be at least 2, got 0"),
    (3, 3, r"prefetch 3 must be in 1\.\.2"),
    (3, 0, r"prefetch 0 must be in 1\.\.2"),
    (2, 5, r"prefetch 5 must be in 1\.\.1"),
])
def test_bad_stages_or_prefetch(stages, prefetch, message):
    fd, c = _cached()
    with pytest.raises(ScheduleError, match=rf"circular_buffer on T{c.name}: {message}"):
        circular_buffer(c, stages, prefetch)
    assert c.circular_buffer_options is None


def test_only_loads_can_be_buffered():
    fd, c = _cached()
    out = fd.fusion.outputs[0]
    with pytest.raises(ScheduleError, match=rf"circular_buffer on T{out.name}: only loads"):
        circular_buffer(out, 2)


def test_pipelined_plain_load_allowed():
    fd, c = _cached(LoadKind.Set)
    circular_buffer(c, 2)
    assert c.circular_buffer_options.kind == PipelinedBuffer()


def test_cp_async_load_defaults_to_the_cp_async_kind():
    fd, c = _cached(LoadKind.CpAsync)
    circular_buffer(c, 4)
    assert c.circular_buffer_options == CircularBufferOptions(4, 3, CpAsyncPipelined())
    assert tv_str(c).endswith("circular_buffer( stages=4, prefetch=3, CpAsyncPipelined )")


@pytest.mark.parametrize("load,kind", [(LoadKind.TmaBulk, CpAsyncPipelined()),
                                       (LoadKind.Set, CpAsyncPipelined()),
                                       (LoadKind.CpAsync, PipelinedBuffer())])
def test_cp_async_kind_goes_with_cp_async_loads_only(load, kind):
    fd, c = _cached(load)
    with pytest.raises(ScheduleError, match=rf"circular_buffer on T{c.name}: the cp.async "
                                            "pipelined kind goes with cp.async loads"):
        circular_buffer(c, 2, kind=kind)
    assert c.circular_buffer_options is None


def test_warp_specialized_on_tma_load():
    fd, c = _cached(LoadKind.TmaTensor)
    ws = WarpSpecialized(ParallelType.TIDy, producer_registers=40, compute_registers=232)
    circular_buffer(c, 4, kind=ws)
    assert c.circular_buffer_options == CircularBufferOptions(4, 3, ws)
    assert tv_str(c).endswith("circular_buffer( stages=4, prefetch=3, WarpSpecialized )")


@pytest.mark.parametrize("kind", [LoadKind.Set, LoadKind.CpAsync])
def test_warp_specialized_needs_tma(kind):
    fd, c = _cached(kind)
    with pytest.raises(ScheduleError, match=rf"circular_buffer on T{c.name}: warp specialization "
                                            r"needs a TMA load"):
        circular_buffer(c, 2, kind=WarpSpecialized())


@pytest.mark.parametrize("on", [ParallelType.BIDx, ParallelType.Serial, ParallelType.Bulk])
def test_warp_specialized_on_thread_dim_only(on):
    fd, c = _cached()
    with pytest.raises(ScheduleError, match=rf"warp specialization is on a thread dimension, not "
                                            rf"{on.short}"):
        circular_buffer(c, 2, kind=WarpSpecialized(on))


@pytest.mark.parametrize("producer, compute, message", [
    (40, 236, "compute register count 236 must be a multiple of 8 in 24..256"),
    (40, 264, "compute register count 264 must be a multiple of 8 in 24..256"),
    (16, 232, "producer register count 16 must be a multiple of 8 in 24..256"),
    (41, 232, "producer register count 41 must be a multiple of 8 in 24..256"),
])
def test_warp_specialized_register_counts_checked(producer, compute, message):
    fd, c = _cached()
    with pytest.raises(ScheduleError, match=rf"circular_buffer on T{c.name}: {message}"):
        circular_buffer(c, 2, kind=WarpSpecialized(ParallelType.TIDy, producer, compute))


def test_check_register_counts():
    assert check_register_counts(40, 232, 2) is None        # (40 + 464) * 128 = 64512
    assert check_register_counts(40, 152, 3) is None        # (40 + 456) * 128 = 63488
    assert check_register_counts(24, 256, 1) is None
    why = check_register_counts(40, 232, 3)                 # (40 + 696) * 128 = 94208
    assert why == ("40 + 3 x 232 registers per thread need 94208 registers for the warp "
                   "groups, more than the 65536 of the register file")
    assert check_register_counts(256, 256, 1) is None       # 65536: exactly the file
    assert check_register_counts(128, 256, 1) is None       # 49152
    assert check_register_counts(40, 160, 3) is not None    # 520 * 128 = 66560
    assert "multiple of 8" in check_register_counts(40, 100, 1)
    # A producer of 4 warp groups (bdimx = 512): 4 x 24 + 4 x 104 = 512 -> 65536, fits exactly.
    assert check_register_counts(24, 104, 4, producer_groups=4) is None
    # 640 threads enter with 96 registers: a pool of 61440, less than the file. This split
    # hung on the H100 (setmaxnreg.inc waiting for registers the block never had).
    assert check_register_counts(40, 112, 4, pool=96 * 640) is not None
    assert check_register_counts(40, 112, 4) is None
    assert check_register_counts(40, 104, 4, pool=96 * 640) is None   # 58368
    why = check_register_counts(40, 104, 4, producer_groups=4)   # (160 + 416) * 128 = 73728
    assert why.startswith("4 x 40 + 4 x 104 registers per thread need 73728")
