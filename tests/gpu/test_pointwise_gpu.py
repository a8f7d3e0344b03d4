"""Pointwise kernels on the GPU against the float64 reference evaluator."""
import sys
from pathlib import Path

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import catalogue
from pyfuser.testing import run_and_check

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from test_interpreter import _gelu_exact  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SIZES = [1, 7, 1023, 4097, 2 ** 20 + 3]


def _dt(t):
    return {torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half,
            torch.float32: DataType.Float}[t]


def _chain(dtype, rank=1):
    with FusionDefinition("chain") as fd:
        a = fd.define_tensor([-1] * rank, dtype=_dt(dtype))
        b = fd.define_tensor([-1] * rank, dtype=_dt(dtype))
        af, bf = fd.ops.cast(a, DataType.Float), fd.ops.cast(b, DataType.Float)
        y = fd.ops.add(fd.ops.mul(fd.ops.tanh(af), bf), fd.ops.exp(fd.ops.neg(fd.ops.abs(bf))))
        fd.add_output(fd.ops.cast(y, _dt(dtype)))
    return fd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_chain_1d(dtype, n):
    fd = _chain(dtype)
    x, y = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    run_and_check(fd, [x, y], scheduler="pointwise")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 1023), (1023, 7), (64, 4097), (3, 2 ** 18 + 1)])
def test_gelu_bias_broadcast(dtype, shape):
    fd = catalogue.define("gelu_bias", _dt(dtype))
    ins = catalogue.make_inputs("gelu_bias", *shape, dtype=_dt(dtype), device="cuda")
    run_and_check(fd, ins, scheduler="pointwise")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_vectorized_and_reused(dtype):
    fd = catalogue.define("silu_mul", _dt(dtype))
    for shape in [(256, 1024), (512, 2048)]:
        ins = catalogue.make_inputs("silu_mul", *shape, dtype=_dt(dtype), device="cuda")
        run_and_check(fd, ins, scheduler="pointwise")
    vec = [k.params.vector for k in fd._executor.kernels()]
    assert max(vec) * (2 if dtype != torch.float32 else 4) == 16 or max(vec) == 8, vec


def test_noncontiguous_inputs():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=DataType.Float)
        b = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(fd.ops.sigmoid(a), b))
    base = torch.randn(300, 514, device="cuda")
    a = base[:, 1:257]                 # sliced: row stride 514, offset pointer
    b = torch.randn(256, 300, device="cuda").t()   # transposed
    run_and_check(fd, [a, b], scheduler="pointwise")


def test_broadcast_and_expanded_inputs():
    col = torch.randn(333, 1, device="cuda")
    row = torch.randn(1, 257, device="cuda")
    exp = torch.randn(333, device="cuda")[:, None].expand(333, 257)
    with FusionDefinition() as fd:
        c = fd.from_pytorch(col)
        r = fd.from_pytorch(row)
        e = fd.from_pytorch(exp)
        fd.add_output(fd.ops.add(fd.ops.mul(c, r), e))
    run_and_check(fd, [col, row, exp], scheduler="pointwise")


def test_permuted_output_order_follows_input():
    x = torch.randn(64, 96, device="cuda").t()    # stride order [0, 1]
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.relu(t))
    # The output is row-major, the input column-major: tiles of the transpose scheduler.
    run_and_check(fd, [x], scheduler="transpose")


def test_scalar_input_and_where():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        s = fd.define_scalar(dtype=DataType.Float)
        m = fd.ops.gt(x, s)
        fd.add_output(fd.ops.where(m, fd.ops.mul(x, s), fd.ops.neg(x)))
    x = torch.randn(5000, device="cuda")
    run_and_check(fd, [x, 0.25], scheduler="pointwise")


def test_misaligned_pointer_falls_back_to_scalar_loads():
    fd = catalogue.define("silu_mul", DataType.BFloat16)
    a = torch.randn(4 * 1024 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(4, 1024)
    b = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    run_and_check(fd, [a, b], scheduler="pointwise")
    assert 0 not in fd.last_run.heuristics[0].vector_inputs


def test_cached_call_does_not_recompile():
    fd = catalogue.define("silu_mul", DataType.BFloat16)
    ins = catalogue.make_inputs("silu_mul", 128, 256, device="cuda")
    fd.execute(ins)
    n = len(fd._executor.kernels())
    fd.execute(catalogue.make_inputs("silu_mul", 128, 256, device="cuda"))
    assert len(fd._executor.kernels()) == n


@pytest.mark.parametrize("M,N", [(16383, 1001), (3, 7), (1, 13), (4096, 50257), (5, 1002)])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_vectors_across_rows_of_dense_tensors(M, N, dtype):
    # Rows that hold no whole vectors: the flat loop's vectors run across them, the last one
    # checked lane by lane (PointwiseParams.ragged).
    fd = catalogue.define("silu_mul", dtype)
    run_and_check(fd, catalogue.make_inputs("silu_mul", M, N, dtype, device="cuda", seed=N),
                  scheduler="pointwise")
    p = fd.last_run.heuristics[0]
    full = 8 if dtype == "bf16" else 4
    assert p.ragged and p.vector == full and p.vector_inputs == (0, 1), p


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gelus_keep_the_digits_of_tiny_results(approximate, dtype):
    """pf::gelu_tanh and pf::gelu compute x / (1 + exp(-2u)) and 0.5 x erfc(-x / sqrt 2), not
    ATen's 1 + tanh / 1 + erf, which cancel for negative x (GPU fuzz 2701:131): each result
    within 1e-5 relative (float32; 1e-13 float64) of its 400-digit value, down to 1e-28."""
    points = [-9.0, -8.0, -6.5, -5.0, -4.0, -2.5, -1.0, -1e-3, 0.0, 0.5, 3.0, 9.0]
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float if dtype == torch.float32
                             else DataType.Double)
        fd.add_output(fd.ops.gelu(x, approximate=approximate))
    xs = torch.tensor(points, dtype=dtype, device="cuda")
    got = fd.execute([xs])[0].double().cpu()
    assert fd.last_run.kind == "kernels" and fd.last_run.backend == "cuda"
    want = torch.tensor([_gelu_exact(v, approximate) for v in points], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-13, atol=0)
