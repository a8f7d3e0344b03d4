"""Reduction heuristics against the device table (H100, H200): inner vs outer, vectors, block
shape, grid split for few long rows and few columns; can_schedule's refusals."""
import dataclasses
import functools
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import (Setup, batchnorm_backward_sums, compile_clean,  # noqa: E402
                         empty_inputs, interpret, reference, schedule_and_lower)

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402
from pyfuser.runtime.device import DEVICE_TABLE  # noqa: E402
from pyfuser.schedule.schedulers import reduction  # noqa: E402
from pyfuser.schedule.schedulers.reduction import ReductionParams  # noqa: E402

F32 = DataType.Float

SMS = DEVICE_TABLE["h100"].sm_count


def heur(name, M, N, dtype="bf16", device="h100", alignment=16):
    fd = catalogue.define(name, dtype)
    st = Setup(fd, empty_inputs(name, M, N, dtype), device, alignment)
    return reduction.compute_heuristics(st.fusion, st.info)


def _blocks(p, M, N):
    iters = M if p.inner else N
    if p.inner:
        return -(-iters // p.bdimy) * p.grid_split
    return -(-(iters // p.vector) // p.bdimx) * p.grid_split


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_inner_and_outer(device):
    r = heur("row_sum", 1024, 4096, device=device)
    c = heur("col_sum", 1024, 4096, device=device)
    assert r.inner and not c.inner
    assert r.vector == c.vector == 8 and r.vector_inputs == c.vector_inputs == (0,)
    assert heur("row_sum", 1024, 4096, "fp32", device).vector == 4


@pytest.mark.parametrize("name", ["row_sum", "col_sum"])
@pytest.mark.parametrize("shape", [(16384, 8192), (7, 1023), (1, 1), (4097, 4097), (8, 1 << 20)])
def test_h100_and_h200_agree(name, shape):
    assert heur(name, *shape, device="h100") == heur(name, *shape, device="h200")


def test_inner_block_grows_with_the_row():
    widths = [heur("row_sum", 4096, n).bdimx for n in (64, 1024, 8192, 65536)]
    assert widths == sorted(widths) and widths[0] == 32 and widths[-1] == 512
    for n in (64, 1024, 8192, 65536):
        p = heur("row_sum", 4096, n)
        assert p.bdimx * p.bdimy <= 512
        assert p.bdimy == 1 or p.bdimx * p.bdimy == 256   # short rows: several per block


def test_rows_that_hold_no_vector_count_threads_in_bytes():
    """A row of 1001 bf16 holds no vector: threads along it are counted by its bytes (32
    threads by 8 rows, where counting loads gave 256 threads of 4 elements, one row per block:
    991 GB/s against 1555 on the H200), and element-wise loads go 8 to a step where a thread
    has them ([4096, 50257]: 512 x 8 3370 GB/s, 512 x 4 3085)."""
    p = heur("row_sum", 16383, 1001)
    assert (p.vector, p.bdimx, p.bdimy) == (1, 32, 8), p
    p = heur("row_sum", 4096, 50257)
    assert (p.vector, p.bdimx, p.bdimy, p.unroll) == (1, 512, 1, 8), p
    assert heur("row_sum", 16384, 8192).unroll == 2           # vectors: LOADS_PER_STEP holds


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_rows_read_in_one_step_are_streamed_past_l1(device):
    """Threads along the row until each holds two vectors of it (512 x 2 at 8192 bf16 columns,
    where 256 x 4 was 5% slower on the H200), and a row a block reads in one step is loaded
    past L1; rows of many steps, or split over blocks, keep L1 (measured no faster)."""
    p = heur("row_sum", 16384, 8192, device=device)
    assert (p.bdimx, p.bdimy, p.unroll, p.stream_rows) == (512, 1, 2, True), p
    p = heur("row_sum", 32768, 4096, device=device)
    assert (p.bdimx, p.bdimy, p.unroll, p.stream_rows) == (256, 1, 2, True), p
    assert not heur("row_sum", 2048, 65536, device=device).stream_rows
    assert not heur("row_sum", 8, 1 << 20, device=device).stream_rows     # split over blocks
    assert not heur("col_sum", 16384, 8192, device=device).stream_rows


def test_a_streamed_row_keeps_its_weight_in_l1():
    """sum(x * w[N], 1) with rows read in one step: x is loaded with L1::no_allocate, the weight
    (read again for every row) with the plain read-only load; the kernel is right on the
    interpreter."""
    from pyfuser.codegen.cuda import generate_cuda
    x, w = torch.randn(37, 1024), torch.randn(1024)
    with FusionDefinition() as fd:
        _weighted_row_sum(fd, fd.from_pytorch(x), fd.from_pytorch(w))
    st, _, p, kernel = schedule_and_lower(fd, [x, w], scheduler=reduction)
    assert p.stream_rows and p.vector_inputs == (0, 1), p
    loads = [line for line in generate_cuda(kernel).splitlines() if "load_global_vec<" in line]
    assert len(loads) == 2, loads
    x_load = next(line for line in loads if "&T0[" in line)
    w_load = next(line for line in loads if "&T1[" in line)
    assert "LoadHint::ReadOnlyNoAllocate>" in x_load and "LoadHint::ReadOnly>" in w_load
    run_and_check(fd, [x, w], scheduler="reduction", options={"enable": ["interpret"]})


def _inner_steps(p, N, split):
    return (N // p.vector) // (p.bdimx * p.unroll * split)


def _outer_steps(p, M, split):
    return M // (p.bdimy * p.unroll * split)


@pytest.mark.parametrize("M,N", [(8, 1 << 20), (8, 1 << 24), (1, 1 << 22), (64, 1 << 18)])
def test_inner_grid_split_for_few_long_rows(M, N):
    """Split each row among blocks until the grid covers the SMs twice, as long as every block
    keeps at least 4 serial steps."""
    p = heur("row_sum", M, N)
    assert p.inner and p.grid_split > 1
    assert _inner_steps(p, N, p.grid_split) >= 4
    assert _blocks(p, M, N) >= 2 * SMS or _inner_steps(p, N, 2 * p.grid_split) < 4
    assert _blocks(p, M, N) // 2 < 2 * SMS                  # not split further than needed


def test_no_grid_split_with_enough_rows():
    assert heur("row_sum", 16384, 8192).grid_split == 1
    assert heur("row_sum", 4096, 1 << 16).grid_split == 1


@pytest.mark.parametrize("M,N", [(1 << 20, 8), (16384, 8192), (1 << 16, 64)])
def test_outer_grid_split_for_few_columns(M, N):
    p = heur("col_sum", M, N)
    assert not p.inner and p.grid_split > 1
    assert _outer_steps(p, M, p.grid_split) >= 4
    blocks = _blocks(p, M, N)
    assert 2 * blocks >= 3 * SMS or _outer_steps(p, M, 2 * p.grid_split) < 4
    assert 2 * (blocks // 2) < 3 * SMS


def test_no_outer_grid_split_for_short_columns():
    assert heur("col_sum", 16, 1 << 20).grid_split == 1


def test_grid_split_follows_the_sm_count():
    fd = catalogue.define("row_sum", "bf16")
    st = Setup(fd, empty_inputs("row_sum", 8, 1 << 24), "h100", 16)
    base = reduction.compute_heuristics(st.fusion, st.info)
    st.info.device = dataclasses.replace(st.info.device, sm_count=2 * SMS)
    more = reduction.compute_heuristics(st.fusion, st.info)
    assert more.grid_split == 2 * base.grid_split


@pytest.mark.parametrize("alignment,n,vector", [(16, 1024, 8), (4, 1024, 1), (16, 1023, 1), (16, 1022, 2),
                                                (16, 1028, 4)])
def test_vector_needs_alignment_and_divisibility(alignment, n, vector):
    p = heur("row_sum", 64, n, alignment=alignment)
    assert p.vector == vector and p.vector_inputs == ((0,) if vector > 1 else ())


def test_sliced_rows_not_multiple_of_the_vector():
    x = torch.empty(64, 1030, dtype=torch.bfloat16)[:, :1024]
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), [1]))
    st = Setup(fd, [x], "h100", 16)
    p = reduction.compute_heuristics(st.fusion, st.info)
    assert p.vector == 1          # row stride 1030 is not a multiple of 4 elements... nor of 8


def test_forced_heuristic_shapes_the_loops():
    fd = catalogue.define("row_sum", "fp32")
    ins = catalogue.make_inputs("row_sum", 3, 1032, "fp32", seed=0)
    p = ReductionParams(True, 4, 32, 2, 2, (0,), 2)
    st, sch, params, k = schedule_and_lower(fd, ins, params=p, scheduler=reduction)
    assert params is p
    (o,), it = interpret(k, st.bindings, ins)
    assert it.grid[:2] == [2, 2] and it.block == [32, 2, 1]
    torch.testing.assert_close(o, reference(fd, ins)[0])


# can_schedule -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "rmsnorm_fwd", "add_rmsnorm_fwd",
                                  "layernorm_fwd"])
def test_refuses_normalizations(name):
    ok, why = reduction.can_schedule(catalogue.define(name).fusion)
    assert not ok and "is broadcast back to the reduced shape (a normalization)" in why


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
def test_refuses_mixed_inner_and_outer_reductions(name):
    ok, why = reduction.can_schedule(catalogue.define(name).fusion)
    assert not ok
    assert why == "reductions over different dims" or "broadcast back" in why


def test_refuses_reductions_over_different_dims():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    assert reduction.can_schedule(fd.fusion) == (False, "reductions over different dims")


def test_interleaved_dims_are_scheduled_from_memory_order():
    """A sum over dims (0, 2) of a row-major [A, B, C] keeps B between reduced dims: C is
    innermost in memory, so it is an inner reduction of the merged A*C (no refusal)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        fd.add_output(fd.ops.sum(x, [0, 2]))
    assert reduction.can_schedule(fd.fusion) == (True, "inner reduction, results not broadcast back")
    lay = reduction.layout(reduction.reduction_tensors(fd.fusion)[0])
    assert lay.inner and not lay.full and lay.reduced == (0, 2) and lay.kept == (1,)


def test_channels_last_sum_over_n_h_w_is_an_outer_reduction():
    """A channels-last [N, C, H, W] has C innermost in memory: its sum over N, H, W is a column
    sum in memory (outer), whatever the logical NCHW order says; the reduced dims merge in
    memory order N, H, W."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], stride_order=[3, 0, 2, 1])
        fd.add_output(fd.ops.sum(x, [0, 2, 3]))
    assert reduction.can_schedule(fd.fusion) == (True, "outer reduction, results not broadcast back")
    lay = reduction.layout(reduction.reduction_tensors(fd.fusion)[0])
    assert not lay.inner and lay.reduced == (0, 2, 3) and lay.kept == (1,)


def test_a_column_major_column_sum_is_an_inner_reduction():
    """x [M, N] stored column-major: its sum over dim 0 reads contiguous memory (inner), its
    sum over dim 1 strides (outer)."""
    for dim, inner in ((0, True), (1, False)):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1, -1], stride_order=[0, 1])
            fd.add_output(fd.ops.sum(x, [dim]))
        lay = reduction.layout(reduction.reduction_tensors(fd.fusion)[0])
        assert lay.inner == inner, dim


@pytest.mark.parametrize("shape,dims", [([-1, -1], [0, 1]), ([-1], [0]), ([-1, -1, -1], [0, 1, 2])])
def test_accepts_full_reductions(shape, dims):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape)
        fd.add_output(fd.ops.sum(x, dims))
    assert reduction.can_schedule(fd.fusion) == (True, "full reduction, results not broadcast back")


def test_takes_several_reductions_of_the_same_dims():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.max(x, [1]))
    assert reduction.can_schedule(fd.fusion) == (True, "inner reduction, results not broadcast back")


@pytest.mark.parametrize("dims, params", [
    ([1], ReductionParams(True, 4, 32, 2, 2, (0,), grid_split=4)),
    ([0], ReductionParams(False, 4, 8, 16, 2, (0,), grid_split=4)),
    ([0, 1], ReductionParams(True, 4, 64, 1, 2, (0,), grid_split=5, full=True)),
    ([0, 1], ReductionParams(True, 4, 64, 1, 2, (0,), grid_split=5, full=True,
                             interleave=True)),
], ids=["inner", "outer", "full", "full_interleaved"])
def test_several_reductions_split_over_blocks(dims, params):
    """sum(x), max(x) and sum(x * x) of one input, each split over blockIdx.y: every reduction
    writes its own partials to the workspace and the last block combines each of them."""
    x = torch.randn(36, 1000) + 0.5
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(tx, dims))
        fd.add_output(fd.ops.max(tx, dims))
        fd.add_output(fd.ops.sum(fd.ops.mul(tx, tx), dims))
    assert reduction.can_schedule(fd.fusion)[0]
    run_and_check(fd, [x], scheduler="reduction",
                  options={"enable": ["interpret"], "heuristic": params})


def test_refuses_reductions_of_unrelated_tensors():
    """Two sums over dim 1 of two inputs: as many dims, not the same dims (their extents may
    differ), so the first reduction's loops are not the second's."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.sum(y, [1]))
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and "reduce tensors of different dims" in why, why


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shape", [(5, 67), (64, 8), (3, 1000)])
def test_sibling_reductions_of_one_input_lower(dim, shape):
    """Forced onto the reduction scheduler, a sum and a max of one input share its loops."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [dim]))
        fd.add_output(fd.ops.max(x, [dim]))
    xs = torch.randn(*shape)
    st, sch, p, k = schedule_and_lower(fd, [xs], scheduler=reduction)
    outs, _ = interpret(k, st.bindings, [xs])
    for o, r in zip(outs, reference(fd, [xs])):
        torch.testing.assert_close(o, r)


def test_disconnected_sibling_reductions_lower():
    # reduction.schedule propagates from the first reduction's rfactor only through tensors
    # connected to it: the reduction of the other input keeps unsplit serial loops (run by one
    # thread, correct but slow; it used to fail, its unsplit axis asked to be vectorized), so
    # can_schedule refuses several reductions until the schedule covers them all.
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.sum(y, [1]))
    ins = [torch.randn(7, 130), torch.randn(7, 130)]
    st, sch, p, k = schedule_and_lower(fd, ins, scheduler=reduction)
    outs, _ = interpret(k, st.bindings, ins)
    for o, r in zip(outs, reference(fd, ins)):
        torch.testing.assert_close(o, r)


def _weighted_row_sum(fd, x, w):
    fd.add_output(fd.ops.sum(fd.ops.mul(x, w), [1]))


def _row_sum_plus_bias(fd, x, b):
    fd.add_output(fd.ops.add(fd.ops.sum(x, [1]), b))


def _column_sum_of_weighted_rows(fd, x, w):
    fd.add_output(fd.ops.sum(fd.ops.mul(x, fd.ops.broadcast(w, [False, True])), [0]))


def _full_sum_of_weighted_rows(fd, x, w):
    fd.add_output(fd.ops.sum(fd.ops.mul(x, w)))


def _channel_mean_and_running_mean(fd, x, rm):
    mean = fd.ops.mean(x, [0, 2, 3])
    fd.add_output(mean)
    fd.add_output(fd.ops.add(fd.ops.mul(rm, 0.9), fd.ops.mul(mean, 0.1)))


@pytest.mark.parametrize("build, shapes", [
    (_weighted_row_sum, [(37, 1003), (1003,)]),
    (_weighted_row_sum, [(37, 1024), (1024,)]),
    (_row_sum_plus_bias, [(37, 1003), (37,)]),
    (_column_sum_of_weighted_rows, [(1003, 37), (1003,)]),
    (_full_sum_of_weighted_rows, [(37, 1003), (1003,)]),
    (_channel_mean_and_running_mean, [(4, 16, 7, 9), (16,)]),
], ids=["weighted_rows", "weighted_rows_vec", "bias", "column_weights", "full", "running_mean"])
def test_takes_inputs_of_fewer_dims_over_kept_or_reduced_dims(build, shapes):
    """An input of fewer dims than the reduction's input, broadcast in the fusion, over reduced
    dims only (a weight of a weighted sum) or kept dims only (a bias, a running statistic in
    the epilogue): one reduction kernel, equal to float64 on the interpreter (these were a
    pointwise kernel writing the [M, N] product, then the reduction)."""
    inputs = [torch.randn(s) for s in shapes]
    with FusionDefinition() as fd:
        build(fd, *(fd.from_pytorch(t) for t in inputs))
    assert reduction.can_schedule(fd.fusion)[0]
    run_and_check(fd, inputs, scheduler="reduction", options={"enable": ["interpret"]})


@pytest.mark.parametrize("shape", [(8, 1024, 28, 28), (3, 16, 7, 9)])
def test_per_channel_fp32_inputs_keep_16_byte_loads_of_a_bf16_image(shape):
    """sum((x - mean[C]) * dy) over N, H, W of channels-last bf16 images (BatchNorm backward's
    statistics): the fp32 mean, read once per column, is read in two 4-wide loads; the images
    keep 8-wide (16-byte) loads (it had halved the width of every access: vector 4). 1024
    channels: 256 would take the few-columns rule, which reads 2-byte elements 4-wide on
    purpose (test_few_columns_heuristic_streams_interleaves_and_keeps_the_unroll)."""
    x, dy = (torch.randn(shape).bfloat16().contiguous(memory_format=torch.channels_last)
             for _ in range(2))
    mean = torch.randn(shape[1])
    with FusionDefinition() as fd:
        tx, tdy, tm = (fd.from_pytorch(t) for t in (x, dy, mean))
        xf = fd.ops.sub(fd.ops.cast(tx, "float32"), fd.ops.broadcast(tm, [True, False, True, True]))
        fd.add_output(fd.ops.sum(fd.ops.mul(xf, fd.ops.cast(tdy, "float32")), [0, 2, 3]))
    st = Setup(fd, [x, dy, mean], "h100", 16)
    p = reduction.compute_heuristics(st.fusion, st.info)
    assert not p.inner and p.vector == 8 and p.vector_inputs == (0, 1, 2), p
    if shape[0] < 8:
        run_and_check(fd, [x, dy, mean], scheduler="reduction", options={"enable": ["interpret"]})


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_two_streamed_inputs_share_the_loads_of_a_step(channels_last):
    """BatchNorm backward's sum(dy) and sum(dy * (x - mean) * rstd): x and dy are read at every
    serial step, so each gets 2 unrolled loads (LOADS_PER_STEP 4 shared; measured best over 4),
    and the NCHW rows are not split over blocks for it (the split lost, H200); mean and rstd
    [C] are not read per step and do not count. One input keeps 4."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, dy = (torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(memory_format=fmt)
             for _ in range(2))
    mean, rstd = torch.empty(256), torch.empty(256)
    per_channel = [True, False, True, True]
    for streamed in (1, 2):
        with FusionDefinition() as fd:
            tx, tdy, tm, tr = (fd.from_pytorch(t) for t in (x, dy, mean, rstd))
            xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(tx, "float32"),
                                         fd.ops.broadcast(tm, per_channel)),
                              fd.ops.broadcast(tr, per_channel))
            if streamed == 2:
                xhat = fd.ops.mul(xhat, fd.ops.cast(tdy, "float32"))
            fd.add_output(fd.ops.sum(xhat, [0, 2, 3]))
        st = Setup(fd, [x, dy, mean, rstd], "h200", 16)
        p = reduction.compute_heuristics(st.fusion, st.info)
        assert p.unroll == (4 if streamed == 1 else 2), p
        assert p.grid_split == (64 if channels_last else 1), p


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_outer_unroll_fits_the_registers_of_a_thread(channels_last):
    """BatchNorm backward's two sums, sum(dy) and sum(dy * (x - mean) * rstd), in one kernel: a
    thread of the channels-last outer reduction holds 8 columns of two accumulators, mean and
    rstd, and its loads of x and dy. At 8 columns, a 1024-thread block (64 registers) spilled at
    unroll 2 (68.6 us against 51.8 at unroll 1, H200); at 4 columns (32 threads of 8 bytes
    along each 256-byte row segment) it keeps unroll 2 in 58 registers (38.8-39.6 us, against
    42.8 for 512 threads of 8 columns; session 31). The NCHW inner reduction holds one mean and
    rstd per row and keeps 2 in its own blocks."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, dy = (torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(memory_format=fmt)
             for _ in range(2))
    mean, rstd = torch.empty(256), torch.empty(256)
    per_channel = [True, False, True, True]
    with FusionDefinition() as fd:
        tx, tdy, tm, tr = (fd.from_pytorch(t) for t in (x, dy, mean, rstd))
        dyf = fd.ops.cast(tdy, "float32")
        xhat = fd.ops.mul(fd.ops.sub(fd.ops.cast(tx, "float32"), fd.ops.broadcast(tm, per_channel)),
                          fd.ops.broadcast(tr, per_channel))
        fd.add_output(fd.ops.sum(dyf, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(dyf, xhat), [0, 2, 3]))
    st = Setup(fd, [x, dy, mean, rstd], "h200", 16)
    p = reduction.compute_heuristics(st.fusion, st.info)
    assert p.unroll == 2, p
    if channels_last:
        assert (p.bdimx, p.bdimy, p.vector) == (32, 32, 4), p


def test_unroll_in_registers_halves_until_the_step_fits():
    fit = functools.partial(reduction._unroll_in_registers, registers=65536, vector=8)
    # 1024 threads: 64 registers, 40 after OTHER_REGISTERS.
    assert fit(2, 1024, held=4, streamed_bytes=4) == 1      # 32 held + 16 in flight
    assert fit(4, 1024, held=1, streamed_bytes=2) == 4      # 8 held + 16 in flight
    assert fit(4, 1024, held=3, streamed_bytes=4) == 2      # 24 + 8 per unrolled step
    assert fit(4, 512, held=4, streamed_bytes=4) == 4       # 128 registers a thread
    assert fit(1, 1024, held=8, streamed_bytes=8) == 1      # never below 1


def test_takes_an_input_of_fewer_dims_over_reduced_and_kept_dims():
    """x [M, K] times w [N, K] summed over K (a matmul of few rows as a reduction): x spans a
    kept dim and the reduced one. It was refused, and the segmenter wrote the broadcast
    product [M, N, K] to global memory for a second kernel; now one reduction kernel reads x
    at its index along the merged kept loop."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        w = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(fd.ops.mul(x, w), [1]))
    ok, why = reduction.can_schedule(fd.fusion)
    assert ok, why
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1, -1])
        xb = fd.ops.broadcast(x, [False, True, False])
        wb = fd.ops.broadcast(w, [True, False, False])
        fd.add_output(fd.ops.sum(fd.ops.mul(xb, wb), [2]))
    for m, n, k in [(3, 40, 72), (2, 33, 1001), (5, 7, 16)]:
        xs, ws = torch.randn(m, k), torch.randn(n, k)
        run_and_check(fd, [xs, ws], kernels=1, options={"enable": ["interpret"]})
        assert fd.last_run.schedulers == ("reduction",), fd.last_run


def test_refuses_an_input_whose_size_one_dim_stands_for_a_size_one_kept_dim():
    """x [1, K] (a size-1 dim in its definition) broadcast to [1, 1, K] against w [1, N, K],
    summed over K (fuzz 2530:53): x's size-1 dim is the reduction input's size-1 kept dim,
    beside N. Taken, x's cache could not be inlined into the merged kept loop (a LoweringError:
    a register buffer of runtime size). Refused, the segmenter splits; squeezed first (x [K]
    broadcast to [1, 1, K]), it is a row's weight and taken."""
    def build(squeeze: bool):
        with FusionDefinition() as fd:
            x = fd.define_tensor([1, -1])
            w = fd.define_tensor([-1, -1])
            xs = fd.ops.squeeze(x, [0]) if squeeze else x
            xb = fd.ops.broadcast(xs, [True, True, False] if squeeze else [False, True, False])
            fd.add_output(fd.ops.sum(fd.ops.mul(xb, fd.ops.broadcast(w, [True, False, False])),
                                     [2]))
        return fd
    ok, why = reduction.can_schedule(build(False).fusion)
    assert not ok and "a size-1 dim among the kept ones" in why, why
    fd = build(True)
    assert reduction.can_schedule(fd.fusion)[0]
    run_and_check(fd, [torch.randn(1, 177), torch.randn(23, 177)], kernels=1,
                  options={"enable": ["interpret"]})


def test_refuses_an_output_over_a_reshape_of_the_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.reshape(fd.ops.neg(x), [-1]))
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and why.startswith("an output whose dims are not the reduction's dims")


def test_accepts_plain_row_and_column_sums():
    assert reduction.can_schedule(catalogue.define("row_sum").fusion) == (
        True, "inner reduction, results not broadcast back")
    assert reduction.can_schedule(catalogue.define("col_sum").fusion) == (
        True, "outer reduction, results not broadcast back")
    assert reduction.can_schedule(catalogue.define("silu_mul").fusion) == (False, "no reductions")


def test_a_reduction_whose_kept_dims_are_all_broadcasts_is_a_full_reduction():
    """max over dim 0 of a softmax over the size-1 dim of x [M, 1] (fuzz 20261124:688, GPU
    20261129:1040): the kept dim is a broadcast, so one element is left, as in a full
    reduction. Scheduled as an outer reduction it failed to lower ("a register buffer of
    runtime size": the broadcast dim's block and thread loops came first, and the squeeze of it
    upstream could not be inlined). Scheduled as a full reduction the broadcast is merged into
    the reduced dim, which a merge with a broadcast forwards, so the squeezed tensors share the
    same loops: one kernel, right values."""
    from pyfuser.testing import run_and_check
    x = torch.randn(2, 1)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        v1 = fd.ops.sub(t0, fd.ops.max(t0, [1], keepdim=True))
        v2 = fd.ops.exp(v1)
        v4 = fd.ops.div(v2, fd.ops.sum(v2, [1], keepdim=True))
        fd.add_output(v4)
        fd.add_output(fd.ops.max(v4, [0], keepdim=False))
    assert reduction.can_schedule(fd.fusion) == (True, "full reduction, results not broadcast back")
    for m in (2, 7, 1000):
        run_and_check(fd, [torch.randn(m, 1)], scheduler="reduction",
                      options={"enable": ["interpret"]})
        assert fd.last_run.heuristics[0].full


@pytest.mark.parametrize("M, N, dtype, few", [
    (100352, 256, "bf16", True), (16384, 512, "bf16", True), (65536, 128, "bf16", True),
    (16384, 256, "fp32", True), (8192, 64, "bf16", False), (262144, 32, "bf16", False),
    (16384, 8192, "bf16", False)])
def test_outer_reduction_of_few_columns(M, N, dtype, few):
    """16 to 64 column vectors: 16 vectors by 64 rows per block, the rows split until the grid
    is about one block per SM (swept on the H100: 1.10-1.90x the general rule's GB/s); bf16
    as 32 threads of 4 elements by 32 rows (H200: 1.11-1.19x the 16 x 16-byte rule's, session
    31); narrower and wider rows keep the general rule."""
    p = heur("col_sum", M, N, dtype)
    assert not p.inner
    if few:
        assert (p.bdimx, p.bdimy, p.vector) == ((16, 64, 4) if dtype == "fp32" else
                                                (32, 32, 4)), p
        # At most one block per SM, each with 4 steps of 64 x 4 rows or more.
        assert _blocks(p, M, N) <= SMS and M // (p.bdimy * p.unroll * p.grid_split) >= 4, p
    else:
        assert p.bdimx * p.bdimy <= 512, p
    reduction.FEW_COLUMNS_RULE = False
    try:
        assert (heur("col_sum", M, N, dtype) == p) is not few
    finally:
        reduction.FEW_COLUMNS_RULE = True


def test_batchnorm_statistics_of_a_channels_last_image_take_the_few_columns_rule():
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), "float32"), [0, 2, 3]))
    st = Setup(fd, [x], "h100", 16)
    p = reduction.compute_heuristics(st.fusion, st.info)
    assert (p.inner, p.bdimx, p.bdimy, p.vector, p.grid_split) == (False, 32, 32, 4, 64), p


@pytest.mark.parametrize("M,N,unswitch", [(16383, 1001, True), (4096, 50257, True),
                                          (16384, 8192, False), (8, 1 << 20, True)])
def test_rows_of_several_steps_run_their_steps_in_bounds_unchecked(M, N, unswitch,
                                                                   monkeypatch):
    # 1001 bf16 in steps of 32 x 8 elements: 4 steps, 3 unchecked; a row read in one step
    # (8192 in 512 x 2 vectors of 8) has none to spare. Off by default (UNSWITCH_STEPS:
    # measured no faster).
    assert not heur("row_sum", M, N, device="h200").unswitch
    monkeypatch.setattr(reduction, "UNSWITCH_STEPS", True)
    p = heur("row_sum", M, N, device="h200")
    assert p.unswitch == unswitch
    assert ("steps in bounds unchecked" in p.describe()) == unswitch
    from pyfuser.codegen.cuda import generate_cuda
    _, _, _, kernel = schedule_and_lower(catalogue.define("row_sum"),
                                         empty_inputs("row_sum", M, N), device="h200")
    src = generate_cuda(kernel)
    # The row's load in the unchecked and the checked version, or once.
    assert src[src.index("__global__"):].count("T0[") == (2 if unswitch else 1)


@pytest.mark.parametrize("N", [1001, 7, 96, 2050])
@pytest.mark.parametrize("grid_split", [1, 2])
def test_unswitched_steps_on_the_interpreter(N, grid_split):
    # 32 threads x 2 elements a step: the steps in bounds unchecked, the last checked (7 and
    # 96 rows: no step in bounds, or every one); shared by two blocks, each its own steps.
    vector = 2 if N % 2 == 0 else 1
    params = ReductionParams(True, vector, 32, 2, 2, (0,) if vector > 1 else (),
                             grid_split=grid_split, unswitch=True)
    fd = catalogue.define("row_sum", "fp32")
    run_and_check(fd, catalogue.make_inputs("row_sum", 5, N, "fp32", seed=N),
                  scheduler="reduction", options={"enable": ["interpret"], "heuristic": params})


@pytest.mark.parametrize("one_pass", [True, False], ids=["float64-sums", "float32-sums"])
def test_float64_sums_of_few_columns_take_half_the_vector(one_pass):
    """BatchNorm's one-pass statistics of a channels-last image, float64 sums of x and x * x:
    their accumulators take 32 of a 1024-thread block's 40 registers and cut the unroll, so a
    thread takes 4 columns and a block 16x32 threads at the full unroll (H200: 34.0-34.8 us
    against 40.7-41.5 at 16x64 vector 8 unroll 2). Two float32 sums take 4 columns a thread too,
    as 32 threads along each 256-byte row segment (the few-columns rule for 2-byte elements)."""
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    acc = "float64" if one_pass else "float32"
    with FusionDefinition() as fd:
        xd = fd.ops.cast(fd.from_pytorch(x), acc)
        fd.add_output(fd.ops.sum(xd, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(xd, xd), [0, 2, 3]))
    st = Setup(fd, [x], "h200", 16)
    p = reduction.compute_heuristics(st.fusion, st.info)
    if one_pass:
        assert (p.vector, p.bdimx, p.bdimy, p.unroll, p.grid_split) == (4, 16, 32, 4, 64), p
        # Two blocks of 512 threads an SM: 4 column tiles x 64 row splits.
        assert _blocks(p, 100352, 256) == 256, p
    else:
        assert (p.vector, p.bdimx, p.bdimy, p.unroll, p.grid_split) == (4, 32, 32, 4, 64), p


def test_float64_sums_at_4_columns_a_thread_on_the_interpreter():
    """The few-columns rule at half the vector (the float64 sums of x and x * x of a
    channels-last image of 256 channels, 256 rows: 16x32 threads, unroll 4), outputs poisoned,
    against float64."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 256, 8, 8, generator=g) * 3 + 20).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        xd = fd.ops.cast(fd.from_pytorch(x), "float64")
        fd.add_output(fd.ops.sum(xd, [0, 2, 3]))
        fd.add_output(fd.ops.sum(fd.ops.mul(xd, xd), [0, 2, 3]))
    run_and_check(fd, [x], scheduler="reduction",
                  options={"enable": ["interpret", "poison_outputs"]})
    p = fd.last_run.heuristics[0]
    assert (p.inner, p.vector, p.bdimx, p.bdimy, p.unroll) == (False, 4, 16, 32, 4), p


@pytest.mark.parametrize("n", [8 * 4096 + 24, 1000, 3 * 2048])
def test_full_reduction_steps_interleaved_over_the_blocks(n):
    """A full reduction whose blocks take chunks s * G + g in turn (ReductionParams.interleave):
    every element summed once, ragged tails included (the last chunk of the sweep partial or
    past the end for some blocks), against float64 on the interpreter."""
    x = torch.randn(n, dtype=torch.bfloat16)
    y = torch.randn(n, dtype=torch.bfloat16)
    with FusionDefinition() as fd:
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        d = fd.ops.sub(fd.ops.cast(tx, F32), fd.ops.cast(ty, F32))
        fd.add_output(fd.ops.sum(fd.ops.mul(d, d), [0]))
    p = ReductionParams(True, 8, 128, 1, 2, (0, 1), grid_split=6, full=True, interleave=True)
    run_and_check(fd, [x, y], scheduler="reduction",
                  options={"enable": ["interpret"], "heuristic": p})
    assert "blocks' steps interleaved" in fd.last_run.heuristics[0].describe()


@pytest.mark.parametrize("n, inputs, streamed", [
    (2048 * 4096, 2, True),          # 4 serial steps a block
    (8192 * 4096, 2, True),          # 8
    (8192 * 8192, 1, True),          # 16
    (16384 * 8192, 2, False),        # 32: measured slower past L1
])
def test_full_reductions_of_few_steps_stream_their_inputs(n, inputs, streamed):
    p = reduction._full_heuristics(n, 8, tuple(range(inputs)), SMS)
    steps = -(-(n // 8) // (p.bdimx * p.unroll * p.grid_split))
    assert (steps <= reduction.FULL_STREAM_MAX_STEPS) == streamed
    assert p.stream_rows == streamed and ("inputs streamed past L1" in p.describe()) == streamed
    assert p.interleave == (steps > reduction.FULL_STREAM_MAX_STEPS)


def test_a_full_reduction_without_vector_loads_keeps_contiguous_shares():
    """Few steps and no vector input (an odd length): neither streamed nor interleaved."""
    p = reduction._full_heuristics(1001 * 4099, 1, (), SMS)
    assert not p.stream_rows and not p.interleave


def test_a_streamed_full_reduction_loads_past_l1():
    """mse_mean of [8192, 4096]: both inputs loaded ld.global.nc.L1::no_allocate."""
    fd = catalogue.define("mse_mean", "bf16")
    meta = torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta")
    seg = fd.explain([meta, meta], device="h100", compile=True).segments[0]
    src = seg.kernel.kernel.source
    assert src.count("pf::LoadHint::ReadOnlyNoAllocate") == 2, src


@pytest.mark.parametrize("params", [
    ReductionParams(False, 4, 4, 8, 1, (0, 1), grid_split=3, interleave=True),
    ReductionParams(False, 4, 4, 8, 2, (0, 1), grid_split=3, interleave=True, stream_rows=True),
    ReductionParams(False, 4, 4, 8, 2, (0, 1), grid_split=1, interleave=True),
], ids=["interleaved", "interleaved_unrolled_streamed", "one_block_a_column"])
def test_outer_sums_with_interleaved_steps(params):
    """Outer reductions whose blocks' steps interleave (block g's step s takes rows chunk
    s * G + g), on the interpreter against float64. 70 rows (2 x 5 x 7) fill no step evenly:
    the last steps are partial and some blocks' last step is empty; 24 channels are 6
    vectors over column tiles of 4, the second ragged."""
    fd = batchnorm_backward_sums()
    cl = torch.channels_last
    x = torch.randn(2, 24, 5, 7).contiguous(memory_format=cl)
    dy = torch.randn(2, 24, 5, 7).contiguous(memory_format=cl)
    mean, rstd = torch.randn(24), torch.rand(24) + 0.5
    run_and_check(fd, [x, dy, mean, rstd], scheduler="reduction",
                  options={"enable": ["interpret"], "heuristic": params})


def test_interleaved_outer_steps_index_the_rows_by_step_then_block():
    """The interleaved outer schedule's row of a load: ((step * G + block) * U + u) * By + ty
    (chunk s * G + g of U * By rows), against the contiguous share's (block * share + ...)."""
    from pyfuser.codegen.cuda import generate_cuda
    fd = batchnorm_backward_sums(DataType.BFloat16)
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    inputs = [x, torch.empty_like(x), torch.empty(256), torch.empty(256)]
    rows = {}
    for interleave in (False, True):
        params = ReductionParams(False, 8, 16, 32, 2, (0, 1), grid_split=64,
                                 interleave=interleave)
        _, _, _, kernel = schedule_and_lower(fd, inputs, scheduler=reduction, params=params)
        body = generate_cuda(kernel).split("__global__", 1)[1]
        load = next(line for line in body.splitlines() if "load_global_vec<" in line
                    and "pf::bf16, 8>" in line)
        rows[interleave] = load
    # G = 64 blocks, U = 2 rows of By = 32 threads a step.
    assert re.search(r"\(\(\(\(j\d+ \* 64\) \+ pf_bidy\) \* 2\) \+ j\d+\) \* 32\) \+ pf_tidy",
                     rows[True]), rows[True]
    assert "pf_bidy * pf::ceil_div(" in rows[False], rows[False]


def test_few_columns_heuristic_streams_interleaves_and_keeps_the_unroll():
    """BatchNorm's channels-last sums: the rows streamed past L1 and interleaved over the
    blocks; bf16 elements read 4-wide by 32 threads along each 256-byte row segment, 1024-thread
    blocks over 64 splits: the backward's two sums beside the per-channel mean and rstd keep
    their unroll of 2 (at 8-wide loads, 1024 threads cut it to 1), a sum alone unrolls 4."""
    fd = batchnorm_backward_sums(DataType.BFloat16)
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    for device in ("h100", "h200"):
        st = Setup(fd, [x, torch.empty_like(x), torch.empty(256), torch.empty(256)],
                   device=device)
        p = reduction.compute_heuristics(st.fusion, st.info)
        assert not p.inner and p.stream_rows and p.interleave, p
        assert (p.bdimx, p.bdimy, p.vector, p.unroll, p.grid_split) == (32, 32, 4, 2, 64), p
    with FusionDefinition() as one:
        t = one.define_tensor([-1, -1, -1, -1], dtype=DataType.BFloat16,
                              stride_order=[3, 0, 2, 1])
        one.add_output(one.ops.sum(one.ops.cast(t, DataType.Float), [0, 2, 3]))
    st = Setup(one, [x])
    p = reduction.compute_heuristics(st.fusion, st.info)
    assert (p.bdimx, p.bdimy, p.vector, p.unroll, p.stream_rows, p.interleave) == (
        32, 32, 4, 4, True, True), p
