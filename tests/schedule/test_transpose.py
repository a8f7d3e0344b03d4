"""The transpose scheduler: pointwise fusions whose inputs and outputs run along different dims
in memory, through padded shared-memory tiles. Which fusions it takes and why not, its
heuristic against the H100 entry of the device table, its kernels on the interpreter against
float64 on odd sizes, the bank pattern of its tile accesses, and the NVRTC compile of the bar
shape."""
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import compile_clean, loop_points, ops, schedule_and_lower, setup  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.ir.iter_domain import ParallelType as PT  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.runtime.interpreter import eval_expr  # noqa: E402
from pyfuser.schedule.schedulers import registry  # noqa: E402
from pyfuser.schedule.schedulers import transpose as tp  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

DT = {"fp32": DataType.Float, "bf16": DataType.BFloat16, "fp16": DataType.Half}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INTERPRET = {"enable": ["interpret"]}
CHANNELS_LAST = [3, 0, 2, 1]


def nchw_to_nhwc(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=DT[dt])
        fd.add_output(fd.ops.stride_order(x, CHANNELS_LAST))
    return fd


def scale_shift_relu_channels_last(dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=DT[dt])
        scale = fd.define_tensor([-1], dtype=DataType.Float)
        shift = fd.define_tensor([-1], dtype=DataType.Float)
        c = [True, False, True, True]
        y = fd.ops.add(fd.ops.mul(fd.ops.cast(x, DataType.Float), fd.ops.broadcast(scale, c)),
                       fd.ops.broadcast(shift, c))
        fd.add_output(fd.ops.stride_order(fd.ops.cast(fd.ops.relu(y), DT[dt]), CHANNELS_LAST))
    return fd


def transposed_plus(dt):
    """x.t() + y: x [N, M] row-major read as [M, N] (dim 0 innermost), y [M, N] row-major."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DT[dt], stride_order=[0, 1])
        y = fd.define_tensor([-1, -1], dtype=DT[dt])
        fd.add_output(fd.ops.add(x, y))
    return fd


# Which fusions it takes ---------------------------------------------------------------------------
def test_takes_a_layout_change_before_the_pointwise_scheduler():
    for fd in (nchw_to_nhwc("bf16"), scale_shift_relu_channels_last("bf16"),
               transposed_plus("fp32")):
        choice = registry.choose(fd.fusion)
        assert choice.scheduler is tp, choice.reason
        assert "tiles through shared memory" in choice.reason
    names = [s.NAME for s in registry.SCHEDULERS]
    assert names.index("transpose") < names.index("pointwise")
    ok, why = tp.can_schedule(nchw_to_nhwc("bf16").fusion)
    assert ok and why.startswith("inputs [0] run along dims [2, 3] in memory, the output along [1]")


def test_refusals_and_their_reasons():
    with FusionDefinition() as fd:                      # same layout everywhere: nothing to do
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
    assert tp.can_schedule(fd.fusion) == (
        False, "no input has its innermost memory dim different from the output's (nothing "
               "to transpose)")
    assert registry.choose(fd.fusion).scheduler.NAME == "pointwise"
    with FusionDefinition() as fd:                      # a reduction
        x = fd.define_tensor([-1, -1], dtype=DataType.Float, stride_order=[0, 1])
        fd.add_output(fd.ops.sum(x, [1]))
    assert tp.can_schedule(fd.fusion) == (False, "the fusion has reductions")
    with FusionDefinition() as fd:                      # a known tile dim of 4 elements
        x = fd.define_tensor([4, -1], dtype=DataType.Float, stride_order=[0, 1])
        fd.add_output(fd.ops.exp(x))
    ok, why = tp.can_schedule(fd.fusion)
    assert not ok and "has 4 elements, fewer than 16" in why
    assert registry.choose(fd.fusion).scheduler.NAME == "pointwise"
    with FusionDefinition() as fd:                      # a broadcast row is no transpose
        x = fd.define_tensor([1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, y))
    assert not tp.can_schedule(fd.fusion)[0]


# Heuristic ----------------------------------------------------------------------------------------
def _params(fd, inputs):
    st = setup(fd, inputs)
    return tp.compute_heuristics(st.fusion, st.info)


def test_heuristic_of_the_bar_shapes():
    p = _params(nchw_to_nhwc("bf16"), [torch.empty(32, 256, 56, 56, dtype=torch.bfloat16)])
    # H and W lie next to each other in both layouts: one tile dim of 3136, C the other.
    assert (p.a_dims, p.b_dims, p.tiled_inputs) == ((2, 3), (1,), (0,))
    assert (p.tile, p.vector, p.rows, p.vector_loads, p.vector_stores) == (64, 8, 32, True, True)
    # 3136 = 49 x 64 and 256 = 4 x 64: every tile is whole, so no access is guarded.
    assert p.full_tiles and "full tiles" in p.describe()
    p = _params(nchw_to_nhwc("fp32"), [torch.empty(32, 256, 56, 56)])
    assert (p.tile, p.vector, p.rows, p.full_tiles) == (32, 4, 32, True)
    # 28 x 28 = 784 is not a multiple of 64: guarded tiles.
    p = _params(nchw_to_nhwc("bf16"), [torch.empty(32, 256, 28, 28, dtype=torch.bfloat16)])
    assert (p.tile, p.full_tiles) == (64, False)
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16)
    p = _params(scale_shift_relu_channels_last("bf16"), [x, torch.empty(256), torch.empty(256)])
    # The fp32 scale and shift are read along C with two 4-wide loads per 8 elements; the
    # bf16 image and output decide V.
    assert (p.tile, p.vector, p.tiled_inputs, p.vector_inputs) == (64, 8, (0,), (1, 2))


def test_heuristic_of_odd_sizes_reads_element_wise():
    p = _params(nchw_to_nhwc("bf16"), [torch.empty(2, 17, 33, 17, dtype=torch.bfloat16)])
    assert (p.tile, p.vector, p.rows, p.vector_loads, p.flat) == (32, 1, 8, False, None)


def test_heuristic_of_a_thin_tile_dim_is_the_flat_loop():
    # 3 channels: a 32 x 32 tile would hold 3 x 32 elements; the pointwise flat loop instead.
    p = _params(nchw_to_nhwc("bf16"), [torch.empty(2, 3, 33, 17, dtype=torch.bfloat16)])
    assert p.flat is not None and type(p.flat).__name__ == "PointwiseParams"
    assert "tile dims of 561 x 3 elements" in p.describe()
    p = _params(transposed_plus("fp32"), [torch.empty(3, 1000).t(), torch.empty(1000, 3)])
    assert p.flat is not None
    # A misaligned view: vectors would fit the sizes but not the pointer.
    x = torch.empty(2 * 64 * 8 * 8 + 1)[1:].view(2, 64, 8, 8)
    p = _params(nchw_to_nhwc("fp32"), [x])
    assert p.vector == 4 and not p.vector_loads


# Kernels on the interpreter -----------------------------------------------------------------------
def _randn(shape, dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(TORCH[dt])


@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 3, 33, 17), (2, 17, 33, 17), (2, 40, 8, 8),
                                   (1, 70, 9, 13), (2, 64, 8, 8)])
def test_nchw_to_nhwc_on_the_interpreter(dt, shape):
    fd = nchw_to_nhwc(dt)
    x = _randn(shape, dt)
    (out,) = run_and_check(fd, [x], scheduler="transpose", options=INTERPRET)
    assert out.is_contiguous(memory_format=torch.channels_last) and torch.equal(out, x)
    assert fd.last_run.segments == ()
    (p,) = fd.last_run.heuristics
    assert (p.flat is None) == (shape[1] >= tp.MIN_TILE_EXTENT)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 3, 33, 17), (2, 19, 5, 7), (2, 64, 8, 8)])
def test_scale_shift_relu_written_channels_last(dt, shape):
    fd = scale_shift_relu_channels_last(dt)
    inputs = [_randn(shape, dt), _randn(shape[1], "fp32", 1), _randn(shape[1], "fp32", 2)]
    (out,) = run_and_check(fd, inputs, scheduler="transpose", options=INTERPRET)
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1000, 3), (3, 1000), (65, 129), (64, 128)])
def test_transposed_plus_row_major(dt, shape):
    M, N = shape
    fd = transposed_plus(dt)
    x, y = _randn((N, M), dt).t(), _randn((M, N), dt, 1)
    (out,) = run_and_check(fd, [x, y], scheduler="transpose", options=INTERPRET)
    assert out.stride() == (N, 1)
    (p,) = fd.last_run.heuristics
    assert (p.flat is None) == (min(M, N) >= tp.MIN_TILE_EXTENT)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(256, 1, 837), (65, 1, 129), (64, 1, 128)])
def test_a_squeezed_size_one_dim_of_a_transposed_input(dt, shape):
    """Fuzz case 5:79: a sum over the size-1 dim of an [M, 1, N] input whose M is innermost,
    a squeeze with the innermost dim changing. The input's tile kept the size-1 broadcast after
    [grid, Ta, Tb] and the schedule refused it (execute() then ran the pointwise kernel); the
    broadcast is merged into the grid axis, and the transpose runs."""
    M, _, N = shape
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1, -1], dtype=DT[dt], stride_order=[0, 2, 1])
        fd.add_output(fd.ops.cast(fd.ops.sum(x, [-2]), DT[dt]))
    xs = _randn(M * N, dt).as_strided((M, 1, N), (1, M, M))
    (out,) = run_and_check(fd, [xs], scheduler="transpose", options=INTERPRET)
    assert out.stride() == (N, 1)
    assert torch.equal(out, xs.reshape(M, N)), (out - xs.reshape(M, N)).abs().max()
    (p,) = fd.last_run.heuristics
    assert p.flat is None and p.tiled_inputs == (0,), p
    if shape == (256, 1, 837):      # NVRTC compiles it for sm_90a without spills
        _, _, _, kernel = schedule_and_lower(fd, [xs], scheduler=tp)
        compile_clean(generate_cuda(kernel))


def test_catalogue_entries_run_as_transposes():
    for name in ("nchw_to_nhwc", "scale_shift_relu_cl"):
        assert catalogue.get(name).kind == "transpose"
        fd = catalogue.define(name, "bf16")
        inputs = catalogue.make_inputs(name, 2 * 3136, 24, "bf16", seed=0)   # [2, 24, 56, 56]
        assert inputs[0].shape == (2, 24, 56, 56)
        outs = run_and_check(fd, inputs, scheduler="transpose", options=INTERPRET)
        want = catalogue.get(name).torch_reference(inputs, 1e-6)
        torch.testing.assert_close(outs[0].float(), want[0].float(), rtol=1e-2, atol=1e-2)
        assert outs[0].stride() == want[0].stride()
    # M not a multiple of 56 * 56: [1, N, 1, M].
    assert catalogue.make_inputs("nchw_to_nhwc", 7, 5, "fp32", seed=0)[0].shape == (1, 5, 1, 7)


# Shared-memory banks ------------------------------------------------------------------------------
def _max_bank_ways(fd, inputs, reads: bool) -> int:
    """The most distinct 4-byte words that the 32 lanes of one warp touch in one bank, in one
    access of the tile (shared-memory reads of the tile, or its writes), over block 0."""
    st, _, p, k = schedule_and_lower(fd, inputs)
    env0 = {k.ctx.names[s].name: v for s, v in st.bindings.items()
            if s in k.ctx.names and isinstance(k.ctx.names[s], K.Var)}
    lanes_x = p.tile // p.vector
    worst = 0
    for op in ops(k):
        targets = list(op.ins) if reads else [op.out]
        for t in targets:
            if not (isinstance(t, K.TensorIndex) and t.buffer.memory == "shared"):
                continue
            size = t.buffer.dtype.size
            words = defaultdict(set)
            for env in loop_points(k, op, env0):
                if env["blockIdx.x"] != 0:
                    continue
                tid = env["threadIdx.x"] + lanes_x * env["threadIdx.y"]
                serial = tuple(sorted((n, v) for n, v in env.items() if n.startswith("j")))
                word = eval_expr(t.index, env) * size // 4
                words[(serial, tid // 32, word % 32)].add(word)
            worst = max(worst, max(len(w) for w in words.values()))
    assert worst, "no shared-memory access found"
    return worst


@pytest.mark.parametrize("dt,shape", [("fp32", (1, 64, 8, 8)), ("fp32", (1, 33, 7, 9)),
                                      ("bf16", (1, 128, 8, 16))])
def test_tile_reads_and_writes_are_bank_conflict_free(dt, shape):
    """The transposed reads walk down a tile column: rows of T + 1 elements put a warp's
    column elements in distinct banks (rows of T put all 32 in one: 8 or more ways)."""
    fd = nchw_to_nhwc(dt)
    x = torch.empty(shape, dtype=TORCH[dt])
    assert _max_bank_ways(fd, [x], reads=True) == 1
    assert _max_bank_ways(fd, [x], reads=False) <= (2 if dt == "bf16" else 1)


def test_shared_tile_rows_are_padded():
    fd = nchw_to_nhwc("bf16")
    st, _, p, k = schedule_and_lower(fd, [torch.empty(32, 256, 56, 56, dtype=torch.bfloat16)])
    (tile,) = [s.buffer for s in K.walk(k.body) if isinstance(s, K.Allocate)
               and s.buffer.memory == "shared"]
    assert tile.size.value == 64 * 65


# NVRTC --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dt", [("nchw_to_nhwc", "bf16"), ("nchw_to_nhwc", "fp32"),
                                     ("scale_shift_relu_cl", "bf16")])
def test_bar_kernels_compile_clean(name, dt):
    fd = catalogue.define(name, dt)
    inputs = [torch.empty(x.shape, dtype=x.dtype) for x in
              catalogue.make_inputs(name, 32 * 3136, 256, dt, seed=0)]
    st, sch, p, k = schedule_and_lower(fd, inputs)
    assert sch is tp and p.vector_loads and p.vector_stores
    src = generate_cuda(k)
    assert "__syncthreads();" in src
    # Whole tiles (p.full_tiles) and H, W addressed as one run of H * W: no guard, and no
    # division by an extent (hw / W, hw % W) but those that split blockIdx.x into tiles.
    body = src[src.index("__global__"):]
    assert p.full_tiles and "if (" not in body
    assert not re.search(r"[/%] i\d", body), body
    rep = compile_clean(src)
    assert rep.registers <= 64, rep.summary()


# GPU ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nchw_to_nhwc", "scale_shift_relu_cl"])
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_bar_shapes_on_the_gpu(name, dt):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fd = catalogue.define(name, dt)
    inputs = catalogue.make_inputs(name, 32 * 3136, 256, dt, device="cuda", seed=0)
    outs = run_and_check(fd, inputs, scheduler="transpose")
    want = catalogue.get(name).torch_reference(inputs, 1e-6)
    assert outs[0].stride() == want[0].stride()


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", [(1000, 3), (65, 129), (4096, 8192)])
def test_transposed_plus_on_the_gpu(dt, shape):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    M, N = shape
    x = torch.randn(N, M, device="cuda").to(TORCH[dt]).t()
    y = torch.randn(M, N, device="cuda").to(TORCH[dt])
    run_and_check(transposed_plus(dt), [x, y], scheduler="transpose")


def test_pad_shared_rows_is_for_shared_buffers():
    from pyfuser.ir.tensor import MemoryType, ScheduleError
    from pyfuser.schedule import cache_after, pad_shared_rows
    fd = nchw_to_nhwc("fp32")
    f = fd.fusion
    local = cache_after(f.inputs[0])
    with pytest.raises(ScheduleError, match="only shared-memory buffers are padded"):
        pad_shared_rows(local, local.domain.loop[0], 1)
    shared = cache_after(local, memory_type=MemoryType.Shared)
    with pytest.raises(ScheduleError, match="none of its loop IDs"):
        pad_shared_rows(shared, local.domain.loop[0], 1)
    assert pad_shared_rows(shared, shared.domain.loop[3], 1).row_padding == (
        shared.domain.loop[3], 1)


def test_outputs_only_a_tile_leads_to_are_written_by_every_thread():
    """Fuzz 20261123:1352: a cast of the tiled input as a second output, beside a rank-3
    reference. Propagation from the reference stopped at the tile: the cast kept a serial
    [grid, 32, 32] loop run by thread 0 alone (correct, 1024 times slower, 255 registers and a
    3 KB stack in ptxas)."""
    from kir_testing import enclosing, op_writing
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float, stride_order=[0, 1])
        fd.add_output(fd.ops.cast(x, DataType.BFloat16))
        fd.add_output(fd.ops.broadcast_in_dim(fd.ops.neg(x), [-1, 1, -1], [0, 2]))
        fd.add_output(fd.ops.logical_not(fd.ops.ge(x, 0.5)))
    x = _randn((65, 31), "fp32").t()
    run_and_check(fd, [x], scheduler="transpose", options=INTERPRET)
    assert fd.last_run.heuristics[0].flat is None
    st, _, p, k = schedule_and_lower(fd, [x])
    for j in range(3):
        buf = next(q.buffer for q in k.params if q.source == ("output", j))
        op = op_writing(k, buf.name)
        bound = {s.loop.parallel for s in enclosing(k, op) if isinstance(s, K.ForLoop)}
        assert {PT.TIDx, PT.TIDy} <= bound, (j, bound)
    compile_clean(generate_cuda(k))


def test_an_output_reached_through_a_broadcast_row_gets_the_tile_loops():
    """Fuzz 20261331:1387 (wrong on the H100): x [8, 9, N] laid out N-outermost, b [N]; the
    outputs lt(x, b) + b and x + b. Propagation reached x + b from b's cache, which has only N:
    x's two other dims stayed whole serial loops, and each thread read tile elements that other
    blocks had loaded. It now replays the reference's tiles like any tile consumer."""
    from kir_testing import enclosing, op_writing
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=DataType.Float, stride_order=[1, 0, 2])
        b = fd.define_tensor([-1], dtype=DataType.Half)
        fd.add_output(fd.ops.add(fd.ops.lt(x, b), b))
        fd.add_output(fd.ops.add(x, b))
    x = _randn((746, 8, 9), "fp32").permute(1, 2, 0)
    inputs = [x, _randn(746, "fp16", 1)]
    run_and_check(fd, inputs, scheduler="transpose", options=INTERPRET)
    st, _, p, k = schedule_and_lower(fd, inputs)
    for j in range(2):
        buf = next(q.buffer for q in k.params if q.source == ("output", j))
        bound = {s.loop.parallel for s in enclosing(k, op_writing(k, buf.name))
                 if isinstance(s, K.ForLoop)}
        assert {PT.TIDx, PT.TIDy} <= bound, (j, bound)


def test_a_broadcast_added_on_both_sides_of_the_permute_keeps_the_tile():
    """x [63, 449] + b [1] before the permute and the permuted result + b after it: b's one
    broadcast dim pairs with x's dim 1 in the first add and dim 0 in the second, so the
    permissive ID graph maps the tile's two dims to each other and inlining put the tile inside
    its readers' loops, where it had no row to pad (LoweringError, the reference ran it: fuzz
    20261378:204 and 20261404:933). The tile keeps its own loops inside the grid loop."""
    from pyfuser.testing import run_and_check
    x, b = torch.randn(63, 449), torch.randn(1).half()
    with FusionDefinition() as fd:
        tx, tb = fd.from_pytorch(x, static_sizes=True), fd.from_pytorch(b)
        y = fd.ops.mul(fd.ops.log(fd.ops.add(fd.ops.abs(tx), 0.5)),
                       fd.ops.sqrt(fd.ops.add(fd.ops.abs(fd.ops.add(tx, tb)), 1.0)))
        fd.add_output(fd.ops.add(fd.ops.permute(y, [1, 0]), tb))
    run_and_check(fd, [x, b], scheduler="transpose", options={"enable": ["interpret"]})


@pytest.mark.parametrize("rows", [1, 3])
def test_an_output_of_fewer_dims_is_written_by_the_first_tile_row_only(rows):
    """An [N] output (exp of a [N] input) beside a transposed [rows, 731, N] output: its loop is
    the tile's column loop inside the block's merged tile index, whose row part the loops
    around the write do not determine whole (the tile's rows are threadIdx.y's, not its).
    The write is guarded by the row tile index (pf_bidx / tiles per row) == 0; without it
    every tile row wrote it (fuzz 20261502:25; the interpreter counts writes)."""
    x = torch.rand(rows * 731 * 45).as_strided(
        (rows, 731, 45), (731, 1, 731 * rows))
    b = torch.randn(45).bfloat16()
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, 731, -1], contiguity=[True, True, True],
                              stride_order=[1, 0, 2])
        t1 = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
        v0 = fd.ops.cast(t1, DataType.Float)
        fd.add_output(fd.ops.maximum(fd.ops.mul(t0, v0), fd.ops.sigmoid(t0)))
        fd.add_output(fd.ops.exp(v0))
    run_and_check(fd, [x, b], scheduler="transpose", options=INTERPRET)
