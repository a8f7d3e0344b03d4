"""Vector accesses on the GPU against float64: each tensor read and written with the width of its
own dtype along its own stride-1 dim, or element-wise (the failures users met on the H100:
norm statistics refused as 32-byte accesses, a [1] input read 4-wide, a permuted input read
along the output's innermost dim, AdamW over parameters of several sizes). The same cases run
on the CPU in tests/lower/test_interpret_vectorization.py."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF16, F32 = DataType.BFloat16, DataType.Float


def _cuda(*ts):
    return [t.cuda() for t in ts]


# Norm forward with fp32 statistics or outputs from bf16 rows --------------------------------------
def _rmsnorm(out_dtype=BF16, stats=True):
    with FusionDefinition("rmsnorm_stats") as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True), 1e-5))
        y = fd.ops.mul(fd.ops.mul(xf, rstd), fd.ops.cast(w, F32))
        fd.add_output(fd.ops.cast(y, out_dtype) if out_dtype != F32 else y)
        if stats:
            fd.add_output(rstd)
    return fd


def _layernorm(out_dtype=BF16, stats=True):
    with FusionDefinition("layernorm_stats") as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        b = fd.define_tensor([-1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        var, mean = fd.ops.var_mean(xf, [1], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        y = fd.ops.add(fd.ops.mul(fd.ops.mul(fd.ops.sub(xf, mean), rstd), fd.ops.cast(w, F32)),
                       fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(y, out_dtype) if out_dtype != F32 else y)
        if stats:
            fd.add_output(mean)
            fd.add_output(rstd)
    return fd


def _norm_inputs(fd, M, N):
    return _cuda(torch.randn(M, N).to(torch.bfloat16),
                 *[torch.randn(N).to(torch.bfloat16) for _ in fd.fusion.inputs[1:]])


@pytest.mark.parametrize("make", [_rmsnorm, _layernorm])
@pytest.mark.parametrize("M,N", [(7, 1000), (64, 4096), (2048, 4096), (16384, 1024)])
def test_norm_with_fp32_statistics(make, M, N):
    fd = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, _norm_inputs(fd, M, N), scheduler="inner_persistent")


@pytest.mark.parametrize("make", [_rmsnorm, _layernorm])
@pytest.mark.parametrize("M,N", [(7, 1000), (5, 1032), (64, 4096), (33, 12288)])
def test_norm_fp32_output_of_bf16_rows(make, M, N):
    fd = make(F32, stats=False)
    run_and_check(fd, _norm_inputs(fd, M, N), scheduler="inner_persistent")
    assert fd.last_run.heuristics[0].vector == 8


@pytest.mark.parametrize("N", [1024, 40, 7])
def test_norm_backward_with_an_fp32_dx(N):
    with FusionDefinition("rmsnorm_bwd_fp32_dx") as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        dy = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        rstd = fd.define_tensor([-1, 1], dtype=F32)
        xhat = fd.ops.mul(fd.ops.cast(x, F32), rstd)
        g = fd.ops.mul(fd.ops.cast(dy, F32), fd.ops.cast(w, F32))
        c = fd.ops.mean(fd.ops.mul(g, xhat), [1], keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(g, fd.ops.mul(xhat, c)), rstd))
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(dy, F32), xhat), [0]))
    M = 257
    ins = _cuda(torch.randn(M, N).to(torch.bfloat16), torch.randn(M, N).to(torch.bfloat16),
                torch.randn(N).to(torch.bfloat16), torch.rand(M, 1) + 0.5)
    run_and_check(fd, ins, scheduler="inner_outer_persistent")


# A [1]-shaped input ---------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["minimum", "maximum"])
@pytest.mark.parametrize("n", [256, 1000, 37, 2 ** 20 + 4])
def test_size_1_input(op, n):
    with FusionDefinition("size_1_input") as fd:
        a = fd.define_tensor([-1])
        b = fd.define_tensor([1])
        fd.add_output(getattr(fd.ops, op)(a, b))
    run_and_check(fd, _cuda(torch.randn(n), torch.randn(1)), scheduler="pointwise")


# Layout changes -------------------------------------------------------------------------------
@pytest.mark.parametrize("via_set", [True, False])
@pytest.mark.parametrize("shape", [(2, 8, 4, 8), (3, 16, 5, 7), (8, 64, 56, 56)])
def test_nchw_to_nhwc(via_set, shape):
    x = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    with FusionDefinition("nchw_to_nhwc") as fd:
        p = fd.ops.permute(fd.from_pytorch(x), [0, 2, 3, 1])
        fd.add_output(fd.ops.set(p) if via_set else p)
    # Input and output innermost along different dims: the transpose scheduler's tiles (its flat
    # loop where a tile dim is under 16 elements).
    run_and_check(fd, [x], scheduler="transpose")
    assert fd.last_run.heuristics[0].vector_inputs == ()


@pytest.mark.parametrize("shape", [(2, 8, 4, 8), (3, 16, 5, 7), (8, 64, 56, 56)])
def test_channels_last_input_to_nchw(shape):
    x = torch.randn(*shape, device="cuda").to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    with FusionDefinition("channels_last_to_nchw") as fd:
        fd.add_output(fd.ops.set(fd.from_pytorch(x)))
    outs = run_and_check(fd, [x], scheduler="transpose")
    assert outs[0].is_contiguous()


@pytest.mark.parametrize("stride_order", [[0, 1, 2], [1, 0, 2], [2, 0, 1], [0, 2, 1]])
def test_stride_order_input_added_to_a_contiguous_one(stride_order):
    shape = (6, 37, 40)
    order = sorted(range(3), key=lambda d: -stride_order[d])
    x = torch.randn(*[shape[d] for d in order], device="cuda").permute(
        *[order.index(d) for d in range(3)])
    y = torch.randn(*shape, device="cuda")
    with FusionDefinition("stride_order") as fd:
        a = fd.define_tensor([-1, -1, -1], stride_order=stride_order)
        fd.add_output(fd.ops.add(fd.ops.mul(a, 2.0), fd.from_pytorch(y)))
    # y is innermost along dim 2; `a` in each of these orders along another dim (stride_order[k]
    # is dim k's stride rank, 0 innermost): tiles of the transpose scheduler.
    run_and_check(fd, [x, y], scheduler="transpose")


# Outputs of unrelated shapes ------------------------------------------------------------------
def _adamw(shapes):
    with FusionDefinition("adamw") as fd:
        for shape in shapes:
            p, g, m, v = [fd.define_tensor([-1] * len(shape)) for _ in range(4)]
            m2 = fd.ops.add(fd.ops.mul(m, 0.9), fd.ops.mul(g, 0.1))
            v2 = fd.ops.add(fd.ops.mul(v, 0.999), fd.ops.mul(fd.ops.mul(g, g), 0.001))
            upd = fd.ops.div(m2, fd.ops.add(fd.ops.sqrt(v2), 1e-8))
            p2 = fd.ops.sub(fd.ops.mul(p, 1 - 1e-5), fd.ops.mul(upd, 1e-3))
            for o in (p2, m2, v2, fd.ops.mul(p2, 1.0)):
                fd.add_output(o)
    ins = []
    for shape in shapes:
        ins += _cuda(torch.randn(*shape), torch.randn(*shape), torch.randn(*shape),
                     torch.rand(*shape))
    return fd, ins


@pytest.mark.parametrize("shapes", [[(1000,), (185,)], [(1000,), (37, 5)]])
def test_adamw_over_parameters_of_different_sizes_is_a_plan_of_pointwise_kernels(shapes):
    """One pointwise kernel cannot loop over parameters of unrelated sizes: the segmenter
    makes one pointwise segment per parameter (it fell back to the reference before)."""
    fd, ins = _adamw(shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, ins, kernels=len(shapes),
                      segments=tuple(("kernel", "pointwise") for _ in shapes))
    assert fd.last_run.backend == "cuda" and not fd.last_run.internal_error


def test_adamw_of_one_parameter():
    fd, ins = _adamw([(1000003,)])
    run_and_check(fd, ins, scheduler="pointwise")


# Mixed dtypes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("other", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("shape", [(7, 1000), (3, 4097), (64, 1024)])
def test_pointwise_bf16_with_another_dtype(other, shape):
    x = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    y = (torch.randint(-50, 50, shape, device="cuda") if other == torch.int64 else
         torch.rand(*shape, device="cuda") > 0.5 if other == torch.bool else
         torch.randn(*shape, device="cuda"))
    with FusionDefinition("mixed") as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        s = fd.ops.add(fd.ops.cast(a, F32), fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(s, BF16))
        fd.add_output(s)
    run_and_check(fd, [x, y], scheduler="pointwise")


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shape", [(1000, 64), (33, 4104), (4096, 40)])
def test_sum_of_bf16_into_fp32(dim, shape):
    x = torch.randn(*shape, device="cuda").to(torch.bfloat16)
    with FusionDefinition("sum_fp32") as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), F32), [dim]))
    run_and_check(fd, [x], scheduler="reduction")


@pytest.mark.parametrize("layout", ["sliced", "expanded"])
def test_pointwise_sliced_and_expanded_inputs(layout):
    y = torch.randn(64, 1001, device="cuda")
    x = (torch.randn(64, 1006, device="cuda")[:, 3:1004] if layout == "sliced"
         else torch.randn(64, 1, device="cuda").expand(64, 1001))
    with FusionDefinition("layouts") as fd:
        fd.add_output(fd.ops.mul(fd.ops.sigmoid(fd.from_pytorch(x)), fd.from_pytorch(y)))
    run_and_check(fd, [x, y], scheduler="pointwise")


@pytest.mark.parametrize("case", ["expand", "sum_of_expanded"])
def test_expanded_outputs_hold_every_element(case):
    """Outputs with an expanded broadcast dim are allocated expanded (stride 0): every element
    reads the one the kernel wrote (they were dense, written at one position of that dim)."""
    x = (torch.randn(1000, 1, device="cuda") if case == "expand"
         else torch.randn(1000, 1, device="cuda").expand(1000, 4099))
    with FusionDefinition("expanded_output") as fd:
        a = fd.from_pytorch(x)
        fd.add_output(fd.ops.expand(fd.ops.exp(a), [-1, 4099]) if case == "expand"
                      else fd.ops.sum(a, [0]))
    run_and_check(fd, [x], scheduler="pointwise" if case == "expand" else "reduction")
