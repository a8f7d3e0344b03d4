"""The reduction scheduler's full reductions (one value: a grid reduction along blockIdx.y) and
its memory-order schedules (reduced dims interleaved with kept ones, channels-last inputs):
heuristics against the device table, kernels on the interpreter against float64 at odd sizes,
NVRTC for sm_90a with the ptxas report, and the plan of amax-then-scale (issue 16)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import Setup, schedule_and_lower  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.runtime.device import DEVICE_TABLE  # noqa: E402
from pyfuser.schedule.segmenter import segment  # noqa: E402
from pyfuser.schedule.schedulers import reduction  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

INTERPRET = {"enable": ["interpret"]}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SMS = DEVICE_TABLE["h100"].sm_count


def _reduce(fd, op, t, dims):
    return {"sum": fd.ops.sum, "max": fd.ops.max, "min": fd.ops.min}[op](t, dims)


def prologue_reduction(x: torch.Tensor, dims, op="sum"):
    """op over `dims` of exp(x) * 0.5 + x, computed in float32 (a cast of a 16-bit input)."""
    from pyfuser.ir.dtype import from_torch
    from pyfuser.runtime.inputs import tensor_descriptor
    # Symbolic sizes (not from_pytorch's size-1 broadcasts): a dim of size 1 at run time is
    # still reduced, so [1] is a full reduction of one element.
    _, _, order, _ = tensor_descriptor(x.shape, x.stride())
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * x.dim(), dtype=from_torch(x.dtype), stride_order=order)
        if x.dtype != torch.float32:
            t = fd.ops.cast(t, DataType.Float)
        y = fd.ops.add(fd.ops.mul(fd.ops.exp(t), 0.5), t)
        fd.add_output(_reduce(fd, op, y, dims))
    return fd


def _heuristic(fd, inputs, device="h100"):
    st = Setup(fd, inputs, device, 16)
    return reduction.compute_heuristics(st.fusion, st.info)


# Heuristics ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["h100", "h200"])
def test_full_reduction_covers_the_sms_with_several_steps_each(device):
    x = torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta")
    p = _heuristic(prologue_reduction(x, [0, 1]), [x], device)
    sms = DEVICE_TABLE[device].sm_count
    assert p.full and p.inner and p.vector == 8 and p.vector_inputs == (0,)
    assert (p.bdimx, p.bdimy, p.unroll) == (512, 1, 4)
    assert p.grid_split == reduction.FULL_BLOCKS_PER_SM * sms
    steps = 8192 * 4096 // (p.vector * p.bdimx * p.unroll * p.grid_split)
    assert steps >= reduction.FULL_MIN_STEPS


@pytest.mark.parametrize("n", [1, 7, 1000, 4099, 1 << 16])
def test_small_full_reductions_keep_few_blocks(n):
    """Each block keeps FULL_MIN_STEPS serial steps: small inputs use one block (no grid
    reduction at all), and the vector divides the innermost extent."""
    x = torch.empty(n, device="meta")
    p = _heuristic(prologue_reduction(x, [0]), [x])
    assert p.full
    assert n % p.vector == 0
    vecs = -(-n // p.vector)
    assert p.grid_split == max(1, min(2 * SMS, vecs // (p.bdimx * p.unroll * 4)))
    assert (p.grid_split == 1) == (n < 1 << 16)


def test_the_vector_divides_the_innermost_dim_only():
    """[3, 5, 8] reduced over (0, 2): the merged A*C has 24 elements, a multiple of 8, but C
    has 8: a vector of 4 fp32 lies within C. [3, 5, 6]: C = 6, a vector of 2."""
    for c, v in ((8, 4), (6, 2), (7, 1)):
        x = torch.empty(3, 5, c, device="meta")
        p = _heuristic(prologue_reduction(x, [0, 2]), [x])
        assert p.inner and not p.full and p.vector == v, (c, p)


def test_channels_last_sum_over_n_h_w_vectorizes_along_c():
    x = torch.empty(8, 64, 5, 7, device="meta").to(memory_format=torch.channels_last)
    p = _heuristic(prologue_reduction(x, [0, 2, 3]), [x])
    assert not p.inner and p.vector == 4 and p.vector_inputs == (0,)
    # The same tensor in NCHW: the innermost dim W is reduced, an inner reduction.
    y = torch.empty(8, 64, 5, 8, device="meta")
    q = _heuristic(prologue_reduction(y, [0, 2, 3]), [y])
    assert q.inner and q.vector == 4


# can_schedule and the plan ------------------------------------------------------------------------
def test_kept_broadcasts_leave_a_full_reduction():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 1])
        fd.add_output(fd.ops.sum(fd.ops.exp(x), [0]))
    lay = reduction.layout(reduction.reduction_tensors(fd.fusion)[0])
    assert lay.full and lay.reduced == (0,)
    assert reduction.can_schedule(fd.fusion) == (True, "full reduction, results not broadcast back")
    run_and_check(fd, [torch.randn(1000, 1)], scheduler="reduction", options=INTERPRET)


def test_rfactor_replays_the_merge_of_kept_broadcasts_into_a_full_reduction():
    """[1, 1, N] averaged over N (fuzz 20261310:2218): the two kept broadcasts are merged
    together, then into the reduced dim; rfactor replayed only the merges that take a
    reduction ID, so the second found its broadcast input missing (KeyError)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, 1, -1])
        fd.add_output(fd.ops.mean(x, [2]))
    assert reduction.layout(reduction.reduction_tensors(fd.fusion)[0]).full
    run_and_check(fd, [torch.rand(1, 1, 256) + 0.5], scheduler="reduction", options=INTERPRET)
    assert fd.last_run.heuristics[0].full


@pytest.mark.parametrize("drop", ["squeeze", "reshape"])
def test_a_squeezed_row_beside_row_sums_is_its_own_segment(drop):
    """sum(x + a, 1) beside a * 2 squeezed from [1, N] to [N] (fuzz 20261310:1533): the output
    over the reduced dim alone lacks the kept dim's loops, so the reduction kernel leaves it
    to a pointwise segment."""
    x, a = torch.randn(37, 300), torch.randn(1, 300)
    with FusionDefinition() as fd:
        tx, ta = fd.from_pytorch(x), fd.from_pytorch(a)
        fd.add_output(fd.ops.sum(fd.ops.add(tx, ta), [1]))
        m = fd.ops.mul(ta, 2.0)
        fd.add_output(fd.ops.squeeze(m, [0]) if drop == "squeeze" else fd.ops.reshape(m, [300]))
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and "lacks the kept ones" in why
    run_and_check(fd, [x, a], kernels=2, options=INTERPRET,
                  segments=(("kernel", "reduction"), ("kernel", "pointwise")))


def test_an_output_over_part_of_the_reduced_dims_is_its_own_segment():
    """mean over [C, H, W] beside a [1, C, H, 1] input's compare (fuzz 20261328:431): the
    output's loop forwards its broadcast W, so its share of the grid-split reduced loop had
    another extent and blocks wrote each other's elements. The reduction scheduler leaves it
    to a pointwise segment."""
    x, a = torch.randn(2, 8, 247, 22), torch.randn(1, 8, 247, 1)
    with FusionDefinition() as fd:
        tx, ta = fd.define_tensor([-1, -1, -1, -1]), fd.from_pytorch(a)
        fd.add_output(fd.ops.sum(fd.ops.where(fd.ops.gt(ta, 0.5), ta, tx), [1, 2, 3]))
        fd.add_output(fd.ops.ge(ta, -0.75))
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and "iterates some of the reduced dims" in why
    run_and_check(fd, [x, a], kernels=2, options=INTERPRET,
                  segments=(("kernel", "reduction"), ("kernel", "pointwise")))


@pytest.mark.parametrize("through", ["input", "intermediate"])
def test_the_input_beside_its_full_sum_is_one_kernel(through):
    """sum(x) beside x < 0.5 over all of x (fuzz 20263002:259): the input's cache fed the
    reduction's loops and the output's loops, one buffer of runtime size for both (a
    LoweringError, then the reference). Each path now has its own copy of the chain, loads
    included; one reduction kernel. Through an intermediate (x * 3 feeding both) too."""
    x = torch.randn(1163, 32, 1)
    bias = torch.randn(1, 1, 1).bfloat16()
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1, -1])
        tb = fd.define_tensor([1, 1, 1], dtype=DataType.BFloat16)
        src = tx if through == "input" else fd.ops.mul(tx, 3.0)
        total = fd.ops.sum(src, [0, 1, 2], keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.maximum(total, tb), 0.0625))
        fd.add_output(fd.ops.logical_and(fd.ops.lt(src, 0.5), fd.ops.ne(tb, 0.5)))
    run_and_check(fd, [x, bias], scheduler="reduction", options=INTERPRET)
    assert fd.last_run.heuristics[0].full


def test_an_input_with_a_size_one_kept_dim_beside_a_middle_sum_is_its_own_segment():
    """x [64, 168, 2, 2] (padded rows) + w [2, 1], summed over dim 2 (fuzz 20263006:1396):
    w's size-1 dim stands for the kept dim 3, which the schedule merges with dims 0 and 1; its
    cache's replayed loops did not line up with the merged loop (a register buffer of runtime
    size, then the reference). The reduction scheduler leaves the add to a pointwise segment."""
    g = torch.Generator().manual_seed(1396)
    base = torch.rand(64 * 2024, generator=g).bfloat16() + 0.5
    x = base.as_strided((64, 168, 2, 2), (2024, 12, 6, 1))
    w = torch.randn(2, 1, generator=g).half()
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        tw = fd.define_tensor([-1, 1], dtype=DataType.Half)
        fd.add_output(fd.ops.sum(fd.ops.add(tx, tw), [2]))
    ok, why = reduction.can_schedule(fd.fusion)
    assert not ok and "size-1 dim among the kept ones" in why, why
    run_and_check(fd, [x, w], kernels=2, options=INTERPRET,
                  segments=(("kernel", "pointwise"), ("kernel", "reduction")))


def amax_scale_fusion():
    fd = catalogue.define("amax_scale", "bf16")
    return fd


def test_amax_then_scale_is_a_reduction_kernel_then_a_pointwise_kernel():
    """amax over all of x, then x * (448 / amax): the scale is broadcast back over x, so no
    scheduler takes it whole; the plan is the full reduction (with 448 / amax as its rank-0
    epilogue) and a pointwise kernel, no reference segment."""
    fd = amax_scale_fusion()
    seg = segment(fd.fusion)
    assert [(s.kind, s.name) for s in seg.segments] == [("kernel", "reduction"),
                                                        ("kernel", "pointwise")]
    plan = fd.explain([torch.empty(8192, 8192, dtype=torch.bfloat16, device="meta")],
                      device="h100")
    assert [(s.kind, s.name) for s in plan.segments] == [("kernel", "reduction"),
                                                         ("kernel", "pointwise")]
    assert "reduction (full)" in str(plan) and "reference evaluator" not in str(plan)
    x = torch.randn(37, 129).bfloat16()
    run_and_check(fd, [x], kernels=2, options=INTERPRET,
                  segments=(("kernel", "reduction"), ("kernel", "pointwise")))


def test_mean_of_squared_error_is_one_kernel():
    fd = catalogue.define("mse_mean", "bf16")
    ins = catalogue.make_inputs("mse_mean", 33, 1000, "bf16", seed=0)
    run_and_check(fd, ins, scheduler="reduction", options=INTERPRET)
    assert fd.last_run.heuristics[0].full


# Interpreter against float64 ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1,), (7,), (1000,), (4099,), (3, 5, 7), (64, 1024)])
def test_full_reduction_on_the_interpreter(shape, dtype, op):
    x = torch.randn(*shape).to(TORCH[dtype])
    fd = prologue_reduction(x, list(range(len(shape))), op)
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
    assert fd.last_run.heuristics[0].full


def test_a_grid_split_full_reduction_on_the_interpreter():
    """Large enough for several blocks along blockIdx.y: partials in the workspace, the last
    block combines them."""
    x = torch.randn(256, 1024)
    fd = prologue_reduction(x, [0, 1])
    p = _heuristic(fd, [x])
    assert p.grid_split > 1
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
    assert fd.last_run.heuristics[0] == p
    (k,) = fd.kernels(last_run=True)
    assert "grid reduction over blockIdx.y" in k.source


def test_a_forced_grid_split_of_an_odd_size():
    """G blocks over 4099 elements in 4-wide vectors... of a size no vector divides: the last
    block's share is partial, and the predicates keep every element counted once."""
    x = torch.randn(4099)
    fd = prologue_reduction(x, [0])
    p = reduction.ReductionParams(True, 1, 32, 1, 2, (), 7, full=True)
    run_and_check(fd, [x], scheduler="reduction", options={**INTERPRET, "heuristic": p})
    y = torch.randn(4096)
    fd = prologue_reduction(y, [0])
    p = reduction.ReductionParams(True, 4, 32, 1, 4, (0,), 5, full=True)
    run_and_check(fd, [y], scheduler="reduction", options={**INTERPRET, "heuristic": p})


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape,dims", [((3, 5, 7), [0, 2]), ((3, 5, 8), [0, 2]),
                                        ((4, 6, 8), [1]), ((2, 9, 3, 16), [0, 2]),
                                        ((5, 4, 3, 7), [1, 3])])
def test_interleaved_reductions_on_the_interpreter(shape, dims, dtype, op):
    x = torch.randn(*shape).to(TORCH[dtype])
    fd = prologue_reduction(x, dims, op)
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)


@pytest.mark.parametrize("op", ["sum", "min"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 8, 5, 7), (3, 16, 4, 4)])
@pytest.mark.parametrize("dims", [[0, 2, 3], [1], [0, 1, 2, 3]])
def test_channels_last_reductions_on_the_interpreter(shape, dims, dtype, op):
    x = torch.randn(*shape).to(TORCH[dtype]).to(memory_format=torch.channels_last)
    fd = prologue_reduction(x, dims, op)
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
    p = fd.last_run.heuristics[0]
    assert p.full == (len(dims) == 4)
    if dims == [0, 2, 3]:
        assert not p.inner            # C is innermost in memory: a column sum
    if dims == [1]:
        assert p.inner                # C reduced, innermost in memory: a row sum


def test_column_major_sums_on_the_interpreter():
    x = torch.randn(40, 24).t()       # [24, 40] stored column-major
    for dim, inner in ((0, True), (1, False)):
        fd = prologue_reduction(x, [dim])
        run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
        assert fd.last_run.heuristics[0].inner == inner


def test_interleaved_outputs_keep_the_order_the_fusion_asks():
    """The kept dims are merged in memory order (C, A for this input), the output [A, C] is
    written in its own row-major order, each element once."""
    x = torch.randn(8, 5, 6).permute(2, 1, 0)      # [6, 5, 8], memory order (8, 5, 6)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [1]))
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)


# NVRTC ---------------------------------------------------------------------------------------------
def test_full_reduction_compiles_clean_for_sm90a():
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.codegen.cuda import generate_cuda
    from pyfuser.runtime.nvrtc import compile_to_cubin
    fd = catalogue.define("mse_mean", "bf16")
    ins = [torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta")] * 2
    st, sch, p, k = schedule_and_lower(fd, ins, scheduler=reduction)
    assert p.full and p.grid_split > 1 and p.vector == 8
    assert any(isinstance(s, K.GridReduce) for s in K.walk(k.body))
    src = generate_cuda(k)
    assert "pf::block_allreduce_x" in src and "grid reduction over blockIdx.y" in src
    mod = compile_to_cubin(src, k.name, arch="sm_90a")
    rep = mod.ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()


@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (2, 16, 1, 7), (1, 16, 5, 7), (1, 16, 1, 7)])
def test_a_channels_last_image_is_read_at_its_row_index(shape):
    """The N, H, W rows of a channels-last input lie in its contiguous tail (C innermost, unit
    stride): the merged row index times C addresses them, with no division or remainder per
    load (it was row / (H * W) * s_n + row % (H * W) / W * s_h + row % W * s_w, runtime strides).
    A dim of size 1 may carry any stride in torch: the run's stride is the product of the
    extents inside it, not torch's, so the kernel reads the right elements for those too."""
    base = torch.randn(*shape).to(memory_format=torch.channels_last)
    n, c, h, w = shape
    # Odd strides on size-1 dims N and H (torch says nothing of them; the contiguity check
    # allows them), the others channels-last. (A size-1 W with an odd stride reads as another
    # stride order to from_pytorch: W innermost.)
    strides = [h * w * c, 1, w * c, c]
    for d in (0, 2):
        if shape[d] == 1:
            strides[d] = 1000 + d
    x = base.as_strided(shape, strides)
    fd = prologue_reduction(x, [0, 2, 3])
    seg, = fd.explain([x]).segments
    source = seg.kernel.kernel.source
    loads = [ln.split("&T0[", 1)[1] for ln in source.splitlines() if "&T0[" in ln]
    assert loads and all("/" not in a and "%" not in a for a in loads), loads
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
    assert not fd.last_run.heuristics[0].inner
