"""Pointwise fusions whose outputs are 0-dim or of different ranks, and calls with empty dims
beside elements: kernels on the kernel-IR interpreter against float64, no reference fallback.

- 0-dim outputs only (scalars as tensors): one pointwise kernel of one thread; NVRTC compiles it.
- Outputs of a lower rank whose dims are the largest output's ([N], [M] or a 0-dim one beside
  [M, N]): one pointwise kernel over the largest, each element of the smaller written once
  (the interpreter refuses a second write), as nvFuser's pointwise reference is its largest
  output.
- Outputs of unrelated shapes and ranks: the segmenter's plan of pointwise kernels.
- A sum of x [1] read back (a squeeze to rank 0): one pointwise kernel.
- Empty outputs beside others, a sum over a dim of size 0 reaching an output: kernels of the
  fusion specialized to what has elements (runtime/empty_dims.py), named in RunInfo.reason.

Each fusion is a minimized fuzz case (seed 20261303) where one was found, named after it.
"""
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import compile_clean, schedule_and_lower  # noqa: E402

from pyfuser import DataType, FusionDefinition  # noqa: E402
from pyfuser.runtime.executor import FallbackWarning  # noqa: E402
from pyfuser.schedule.schedulers import pointwise, registry  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

INTERPRET = {"enable": ["interpret"]}
PW = ("kernel", "pointwise")


def _check(fd, inputs, **expect):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        outs = run_and_check(fd, inputs, options=INTERPRET, **expect)
    run = fd.last_run
    assert run.kind == "kernels" and run.backend == "interpreter" and not run.internal_error, run
    return outs, run


# 0-dim outputs only ------------------------------------------------------------------------------
def where_of_scalars(fd):
    """Case 20261303:43: where(t == 0.5, t, u) of two 0-dim inputs, and its bf16 cast."""
    t = fd.define_tensor([], dtype=DataType.Float)
    u = fd.define_tensor([], dtype=DataType.Float)
    v = fd.ops.where(fd.ops.eq(t, 0.5), t, fd.ops.exp(u))
    fd.add_output(v)
    fd.add_output(fd.ops.cast(v, DataType.BFloat16))


def scalar_inputs():
    return [torch.tensor(0.5), torch.tensor(-1.25)], [torch.tensor(0.75), torch.tensor(2.0)]


@pytest.mark.parametrize("which", [0, 1])
def test_0_dim_fusion_is_a_one_thread_pointwise_kernel(which):
    with FusionDefinition() as fd:
        where_of_scalars(fd)
    inputs = scalar_inputs()[which]
    _, run = _check(fd, inputs, scheduler="pointwise")
    assert run.segments == () and run.heuristics[0].threads == 1
    assert "0-dim" in run.heuristics[0].note


def test_0_dim_kernel_launches_one_thread_and_compiles():
    with FusionDefinition() as fd:
        where_of_scalars(fd)
    inputs = scalar_inputs()[0]
    _, _, params, kernel = schedule_and_lower(fd, inputs, scheduler=pointwise,
                                              device="h100-4sm")
    assert params.threads == 1
    assert kernel.launch_description.launch_dims(inputs) == ((1, 1, 1), (1, 1, 1))
    from pyfuser.codegen.cuda import generate_cuda
    rep = compile_clean(generate_cuda(kernel))
    assert rep.registers > 0


# Lower-rank outputs inside the largest output's loop ---------------------------------------------
def row_beside_rows(fd):
    """c [N] doubled beside x [M, N] + c: c's output in the flat loop, written by row 0."""
    x = fd.define_tensor([-1, -1])
    c = fd.define_tensor([-1])
    fd.add_output(fd.ops.add(x, fd.ops.broadcast(c, [True, False])))
    fd.add_output(fd.ops.mul(c, 2.0))


def column_beside_rows(fd):
    """c [M] beside x [M, N] * c[:, None]: written at column 0 (lanes run along N)."""
    x = fd.define_tensor([-1, -1])
    c = fd.define_tensor([-1])
    fd.add_output(fd.ops.neg(c))
    fd.add_output(fd.ops.mul(x, fd.ops.broadcast(c, [False, True])))


def scalar_beside_a_3d_output(fd):
    """Case 20261303:122: not(not(s > 0.5)) of a 0-dim fp16 s beside a bool x [A, B, C] times
    zeros: the scalar is written once, by the first iteration."""
    x = fd.define_tensor([-1, -1, -1], dtype=DataType.Bool)
    s = fd.define_tensor([], dtype=DataType.Half)
    fd.add_output(fd.ops.logical_not(fd.ops.logical_not(fd.ops.gt(s, 0.5))))
    fd.add_output(fd.ops.mul(x, fd.ops.zeros([7, 9, 5], dtype=DataType.Half)))


def channels_beside_a_column_major_3d(fd, x_like):
    """w [C] scaled beside x [A, B, C] * w laid out with A innermost: the reference's loop runs
    along A, and w's output is written where A and B are 0."""
    x = fd.from_pytorch(x_like)
    w = fd.define_tensor([-1], dtype=DataType.BFloat16)
    fd.add_output(fd.ops.mul(x, w))
    fd.add_output(fd.ops.mul(w, 3.0))


ONE_KERNEL = {
    "row_beside_rows": (row_beside_rows, lambda: [torch.randn(7, 33), torch.randn(33)]),
    "row_beside_rows_vectorized": (row_beside_rows, lambda: [torch.randn(8, 64),
                                                             torch.randn(64)]),
    "column_beside_rows": (column_beside_rows, lambda: [torch.randn(13, 40), torch.randn(13)]),
    "scalar_beside_a_3d_output": (scalar_beside_a_3d_output, lambda: [
        torch.rand(7, 9, 5) < 0.5, torch.tensor(0.75, dtype=torch.float16)]),
}


@pytest.mark.parametrize("name", list(ONE_KERNEL))
def test_lower_rank_outputs_run_in_the_largest_outputs_loop(name):
    build, make = ONE_KERNEL[name]
    with FusionDefinition() as fd:
        build(fd)
    ok, why = pointwise.can_schedule(fd.fusion)
    assert ok, why
    _, run = _check(fd, make(), scheduler="pointwise")
    assert run.segments == ()


def test_channels_beside_a_column_major_3d_output():
    x = torch.randn(5, 6, 17).permute(2, 1, 0).contiguous().permute(2, 1, 0)
    w = torch.randn(17).to(torch.bfloat16)
    with FusionDefinition() as fd:
        channels_beside_a_column_major_3d(fd, x)
    # x runs along its dim 0 in memory, the output along dim 2: a transpose.
    _, run = _check(fd, [x, w], scheduler="transpose")
    assert run.segments == ()


# Unrelated shapes: a plan of pointwise kernels -------------------------------------------------
def three_unrelated_outputs(fd):
    """Case 20261303:490: exp of x [A, B] (column-major), y [C, D] < 0.5, 1 / s of a 0-dim s:
    no output iterates another's dims."""
    x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16, stride_order=[0, 1])
    y = fd.define_tensor([-1, -1], dtype=DataType.Double)
    s = fd.define_tensor([], dtype=DataType.BFloat16)
    fd.add_output(fd.ops.exp(x))
    fd.add_output(fd.ops.lt(y, 0.5))
    fd.add_output(fd.ops.reciprocal(s))


def test_unrelated_outputs_of_different_ranks_are_pointwise_segments():
    with FusionDefinition() as fd:
        three_unrelated_outputs(fd)
    choice = registry.choose(fd.fusion)
    assert choice.scheduler is None and "does not iterate the elements" in choice.reason
    inputs = [torch.randn(64, 786).to(torch.bfloat16).t(), torch.randn(6, 307).double(),
              torch.tensor(1.5).to(torch.bfloat16)]
    _, run = _check(fd, inputs, kernels=0)
    assert {s.kind for s in run.segments} == {"kernel"}, run.segments
    # exp(x) of the column-major x is a transpose; the others are flat loops.
    assert all(s.name in ("pointwise", "transpose") for s in run.segments)
    assert len(run.segments) >= 2


# A squeeze to rank 0 read back -----------------------------------------------------------------
def test_sum_of_one_element_kept_is_one_pointwise_kernel():
    """Case 20261303:184: sum(x [1], keepdim) in fp32 of a bf16 x: the frontend squeezes x to
    rank 0 and broadcasts it back; pointwise refused that chain (one-iteration loops lowering
    did not merge), it now runs as one kernel."""
    x = torch.tensor([1.625]).to(torch.bfloat16)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), keepdim=True, dtype=DataType.Float))
    _, run = _check(fd, [x], scheduler="pointwise")
    assert run.segments == ()


def test_mean_of_one_element_beside_its_chain():
    """Case 20261303:724: mean over dim 0 of t * (t + 2) for t [1] (fp16)."""
    x = torch.tensor([-0.75]).to(torch.float16)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mean(fd.ops.mul(t, fd.ops.add(t, 2.0)), [0], keepdim=False))
    _check(fd, [x], scheduler="pointwise")


@pytest.mark.parametrize("n", [1, 5, 300])
def test_rank_0_statistic_of_one_element_read_in_the_output_loops(n):
    """Case 20261603:953: RMSNorm of x [1] times w [n]: the mean of x * x is a squeeze to rank
    0 between x * x and rsqrt(...) * x, which the pointwise kernel computes in its blockIdx.x
    and threadIdx.x loops over w: "cyclic dependency between loops" (the squeeze at the top of
    the kernel, its producer and its readers inside the loops). The rank-0 tensor now runs in
    those loops, once per thread; also compiled with NVRTC."""
    x, w = torch.randn(1), torch.randn(n + 2)[2:]
    with FusionDefinition() as fd:
        t, tw = fd.from_pytorch(x), fd.define_tensor([-1], contiguity=[True])
        rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(t, t), [0], keepdim=True), 1e-6))
        fd.add_output(fd.ops.mul(fd.ops.mul(t, rstd), tw))
    _check(fd, [x, w], scheduler="pointwise")
    from pyfuser.codegen.cuda import generate_cuda
    *_, kernel = schedule_and_lower(fd, [x, w], scheduler=pointwise)
    compile_clean(generate_cuda(kernel))


# Empty dims beside elements ----------------------------------------------------------------------
def test_empty_outputs_beside_unrelated_outputs_with_elements():
    """Case 20261303:170 (AdamW of two parameters, the first with no rows): the first
    parameter's updates are allocated, the second's computed by a pointwise kernel."""
    with FusionDefinition() as fd:
        for _ in range(2):
            p, g = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
            fd.add_output(fd.ops.sub(p, fd.ops.mul(g, 1e-3)))
    inputs = [torch.randn(0, 189), torch.randn(0, 189), torch.randn(3, 6), torch.randn(3, 6)]
    outs, run = _check(fd, inputs, scheduler="pointwise")
    assert outs[0].shape == (0, 189)
    assert run.reason.startswith("output 0 has no elements: allocated, not computed"), run


def test_sum_over_an_empty_dim_feeds_a_pointwise_kernel():
    """y = x + sum(e [M, 0], 1)[:, None]: the sum is a fill of 0, one pointwise kernel writes y."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, fd.ops.sum(e, [1], keepdim=True)))
    _, run = _check(fd, [torch.randn(6, 35), torch.randn(6, 0)], scheduler="pointwise")
    assert run.reason.startswith("T2 sums over a dim of size 0: a fill of 0"), run


def test_sums_over_an_empty_dim_beside_a_variance_of_it():
    """The same beside var over the empty dim of e (case 20261303:423): two fills, whose M dims
    the ID graph no longer relates (a fill has no producer), so a plan of pointwise kernels."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, fd.ops.sum(e, [1], keepdim=True)))
        fd.add_output(fd.ops.var(e, [1], keepdim=True, correction=1))
    _, run = _check(fd, [torch.randn(6, 35), torch.randn(6, 0)], kernels=0)
    assert run.schedulers and set(run.schedulers) == {"pointwise"}, run
    assert "sum over a dim of size 0: a fill of 0" in run.reason, run
