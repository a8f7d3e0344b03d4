"""Matmuls of few rows as reductions (schedule/few_row_matmuls.py): which calls are rewritten,
and the rewritten plans on the interpreter against float64 with outputs poisoned."""
from __future__ import annotations

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.explain import explain_fusion
from pyfuser.schedule import few_row_matmuls
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
BF16 = DataType.BFloat16


def _linear(kind: str, dtype=BF16, rank: int = 2) -> FusionDefinition:
    with FusionDefinition(f"linear_{kind}") as fd:
        x = fd.define_tensor(shape=[-1] * rank, dtype=dtype)
        w = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        if kind == "bias_gelu":
            b = fd.define_tensor(shape=[-1], dtype=dtype)
            y = fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh")
        elif kind == "two_outputs":
            h = fd.ops.linear(x, w)
            fd.add_output(h)
            y = fd.ops.relu(h)
        elif kind == "residual":
            r = fd.define_tensor(shape=[-1] * rank, dtype=dtype)
            y = fd.ops.add(fd.ops.linear(x, w), r)
        else:
            y = fd.ops.linear(x, w)
        fd.add_output(y)
    return fd


def _matmul(rank_a: int) -> FusionDefinition:
    with FusionDefinition("matmul") as fd:
        a = fd.define_tensor(shape=[-1] * rank_a, dtype=BF16)
        b = fd.define_tensor(shape=[-1, -1], dtype=BF16, stride_order=[0, 1])   # w.t()
        fd.add_output(fd.ops.matmul(a, b))
    return fd


def _rows_kernel(fd) -> None:
    run = fd.last_run
    assert run.schedulers == ("reduction",), run
    assert "a row reduction of the products" in run.reason, run.reason


@pytest.mark.parametrize("k", [72, 1001, 4096])
def test_linear_bias_gelu_of_one_row_is_one_reduction_kernel(k):
    fd = _linear("bias_gelu")
    x, w, b = torch.randn(1, k).bfloat16(), torch.randn(40, k).bfloat16(), torch.randn(40).bfloat16()
    run_and_check(fd, [x, w, b], kernels=1, options=INTERPRET)
    _rows_kernel(fd)


@pytest.mark.parametrize("kind,dtype", [("residual", BF16), ("two_outputs", DataType.Float),
                                        ("bare", DataType.Half)])
def test_linear_epilogues_and_dtypes(kind, dtype):
    fd = _linear(kind, dtype, rank=3)
    t = {BF16: torch.bfloat16, DataType.Float: torch.float32, DataType.Half: torch.float16}[dtype]
    x, w = torch.randn(1, 1, 96).to(t), torch.randn(24, 96).to(t)
    ins = [x, w] + ([torch.randn(1, 1, 24).to(t)] if kind == "residual" else [])
    run_and_check(fd, ins, kernels=1, options=INTERPRET)
    _rows_kernel(fd)


def test_linear_of_a_vector():
    fd = _linear("bias_gelu", rank=1)
    x, w, b = torch.randn(64).bfloat16(), torch.randn(24, 64).bfloat16(), torch.randn(24).bfloat16()
    run_and_check(fd, [x, w, b], kernels=1, options=INTERPRET)
    _rows_kernel(fd)


@pytest.mark.parametrize("rank_a", [1, 2])
def test_matmul_with_a_transposed_weight(rank_a):
    fd = _matmul(rank_a)
    a = torch.randn(*([1] * (rank_a - 1)), 80).bfloat16()
    w = torch.randn(24, 80).bfloat16()
    run_and_check(fd, [a, w.t()], kernels=1, options=INTERPRET)
    _rows_kernel(fd)


def _rewritten(fd, inputs, **options) -> bool:
    from pyfuser import options as opts
    from pyfuser.runtime.inputs import check_inputs
    fusion = fd.fusion
    with opts.override(options or None):
        return bool(few_row_matmuls.rewritable(fusion, check_inputs(fusion, inputs), inputs,
                                               opts.current()))


def test_which_calls_are_rewritten(monkeypatch):
    fd = _linear("bias_gelu")
    x, w, b = torch.randn(1, 64).bfloat16(), torch.randn(24, 64).bfloat16(), torch.randn(24).bfloat16()
    assert _rewritten(fd, [x, w, b])
    # Two rows of x: each would read W again.
    assert not _rewritten(fd, [torch.randn(2, 64).bfloat16(), w, b])
    # Options: the feature off, the matmul kernel forced.
    assert not _rewritten(fd, [x, w, b], disable=["matmul_as_reduction"])
    assert not _rewritten(fd, [x, w, b], enable=["matmul_few_rows"])
    # A weight read across K (matmul's b row-major [K, N]): a strided reduction.
    with FusionDefinition() as mm:
        a = mm.define_tensor(shape=[-1, -1], dtype=BF16)
        bt = mm.define_tensor(shape=[-1, -1], dtype=BF16)
        mm.add_output(mm.ops.matmul(a, bt))
    assert not _rewritten(mm, [torch.randn(1, 64).bfloat16(), torch.randn(64, 24).bfloat16()])
    # A batched second operand keeps its op.
    with FusionDefinition() as bmm:
        a = bmm.define_tensor(shape=[-1, -1, -1], dtype=BF16)
        bt = bmm.define_tensor(shape=[-1, -1, -1], dtype=BF16, stride_order=[2, 0, 1])
        bmm.add_output(bmm.ops.matmul(a, bt))
    assert not _rewritten(bmm, [torch.randn(3, 1, 64).bfloat16(),
                                torch.randn(3, 24, 64).bfloat16().transpose(1, 2)])
    # A bare linear over a large weight stays cuBLAS's (faster streaming); with an epilogue
    # the reduction still takes it.
    monkeypatch.setattr(few_row_matmuls, "BARE_MAX_WEIGHT_BYTES", 64 * 24 * 2 - 1)
    assert not _rewritten(_linear("bare"), [x, w])
    assert _rewritten(fd, [x, w, b])
    # More rows are taken where the limit allows them.
    monkeypatch.setattr(few_row_matmuls, "REDUCTION_MAX_ROWS", 2)
    assert _rewritten(fd, [torch.randn(2, 64).bfloat16(), w, b])


def test_two_rows_keep_the_library_segment_and_the_feature_turns_it_off():
    fd = _linear("bias_gelu")
    x, w, b = torch.randn(2, 64).bfloat16(), torch.randn(24, 64).bfloat16(), torch.randn(24).bfloat16()
    run_and_check(fd, [x, w, b], kernels=1, options=INTERPRET)
    assert ("library", "linear") in [(s.kind, s.name) for s in fd.last_run.segments]
    run_and_check(fd, [x[:1], w, b], kernels=1,
                  options={"enable": ["interpret"], "disable": ["matmul_as_reduction"]})
    assert ("library", "linear") in [(s.kind, s.name) for s in fd.last_run.segments]


def test_explain_shows_the_rewrite():
    fd = _linear("bias_gelu")
    ins = [torch.empty(1, 4096, dtype=torch.bfloat16, device="meta"),
           torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta"),
           torch.empty(4096, dtype=torch.bfloat16, device="meta")]
    e = explain_fusion(fd.fusion, ins, device="h200")
    assert "rewritten first: linear" in str(e)
    assert [s.name for s in e.segments] == ["reduction"], str(e)


def test_explain_names_the_rewrites_kernels_as_execute_does():
    fd = _linear("bias_gelu")
    ins = [torch.randn(1, 64).bfloat16(), torch.randn(24, 64).bfloat16(),
           torch.randn(24).bfloat16()]
    run_and_check(fd, ins, kernels=1, options={**INTERPRET, "device": "h100"})
    e = explain_fusion(fd.fusion, ins, device="h100", name=fd.name)
    names = tuple(s.kernel.name for s in e.segments)
    assert names == fd.last_run.kernel_names and "_as_reduction_" in names[0], names


def test_a_row_of_x_defined_with_a_size_one_dim():
    """Fuzz 2530:53 and 2530:25: x from torch as [1, K] (a size-1 dim in its definition, and
    in 2530:25 strided along K) with a float8 bias cast to half. Broadcast to the product as
    it was, its size-1 dim stood for the kept M dim and the reduction's kernel failed to
    lower (a register buffer of runtime size): the rewrite squeezes it first."""
    g = torch.Generator().manual_seed(2530)
    x = torch.randn(1, 1712, generator=g).half()[:, ::2]
    w = torch.randn(43, 856, generator=g).half()
    b8 = torch.randn(43, generator=g).to(torch.float8_e4m3fn)
    r = torch.randn(1, 43, generator=g)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Half)
        t2 = fd.define_tensor(shape=[-1], dtype=DataType.Float8_e4m3fn)
        t3 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        y = fd.ops.linear(t0, t1, fd.ops.cast(t2, dtype=DataType.Half))
        fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.abs(fd.ops.sub(fd.ops.mul(y, 0.5), t3))),
                                  dtype=DataType.Half))
    # Two kernels: r's M dim iterates where the product's (x's squeezed one) is size 1, so the
    # epilogue after the sum is a pointwise kernel of its own.
    run_and_check(fd, [x, w, b8, r], kernels=2, options=INTERPRET)
    assert "a row reduction of the products" in fd.last_run.reason
    assert [(s.kind, s.name) for s in fd.last_run.segments] == [("kernel", "reduction"),
                                                                  ("kernel", "pointwise")]
    x1 = torch.randn(1, 177, generator=g).half()
    w1 = torch.randn(232, 177, generator=g).half()
    with FusionDefinition() as fd:
        y = fd.ops.linear(fd.from_pytorch(x1), fd.from_pytorch(w1))
        fd.add_output(y)
        fd.add_output(fd.ops.neg(y))
    run_and_check(fd, [x1, w1], kernels=1, options=INTERPRET)
    _rows_kernel(fd)
