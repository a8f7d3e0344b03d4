"""Reshapes in kernels on the GPU, against float64, outputs poisoned before each launch.

- Reshapes that merge an expanded (stride-0) dim: the output has the expanded size of elements,
  each input element read once per copy (triage P12: the output had the unexpanded shape).
- inner_persistent with fills, reshapes and squeezes in the chain its persistent buffers are
  projected through (triage P10: scheduling raised "recompute of T#: T# comes from a FullOp /
  ReshapeOp"), and rows made by reshaping an expanded input.
The interpreter runs the same shapes of fusions small (tests/lower/test_interpret_reshape.py).
"""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16, F16 = DataType.Float, DataType.BFloat16, DataType.Half
TORCH = {F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}


def _expanded(sizes, expanded, dtype=torch.float32):
    base = torch.randn([1 if e else s for s, e in zip(sizes, expanded)], device="cuda")
    return base.to(dtype).expand(sizes)


@pytest.mark.parametrize("sizes, expanded, new", [
    ([15, 4], [False, True], [60]),
    ([4097, 3], [False, True], [-1]),
    ([1024, 8], [False, True], [-1, 64]),
    ([8, 7, 4096], [False, True, False], [-1]),
    ([16, 65536], [True, False], [-1, 4096]),
    ([64, 33], [True, True], [-1]),
])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_pointwise_reshape_of_expanded_dims(sizes, expanded, new, dtype):
    x = _expanded(sizes, expanded, TORCH[dtype])
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(sizes), dtype=dtype, expanded=expanded)
        fd.add_output(fd.ops.mul(fd.ops.reshape(t, new), 2.0))
    run_and_check(fd, [x], scheduler="pointwise")


@pytest.mark.parametrize("m, e, row", [(1024, 8, 128), (33, 8, 264), (4096, 4, 1024),
                                       (16, 1024, 8192)])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_softmax_of_rows_made_by_reshaping_an_expanded_dim(m, e, row, dtype):
    x = _expanded([m, e], [False, True], TORCH[dtype])
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dtype, expanded=[False, True])
        h = fd.ops.cast(fd.ops.reshape(t, [-1, row]), F32)
        ex = fd.ops.exp(fd.ops.sub(h, fd.ops.max(h, [1], keepdim=True)))
        fd.add_output(fd.ops.div(ex, fd.ops.sum(ex, [1], keepdim=True)))
    run_and_check(fd, [x], scheduler="inner_persistent")


@pytest.mark.parametrize("m, e, n", [(2048, 4, 1024), (999, 3, 2048), (256, 16, 8),
                                     (64, 2, 16384)])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_layernorm_of_rows_made_by_reshaping_an_expanded_dim(m, e, n, dtype):
    x = _expanded([e, m * n // e], [True, False], TORCH[dtype])
    w = torch.randn(n, device="cuda").to(TORCH[dtype])
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=dtype, expanded=[True, False])
        tw = fd.define_tensor([-1], dtype=dtype)
        h = fd.ops.cast(fd.ops.reshape(t, [-1, n]), F32)
        v, mean = fd.ops.var_mean(h, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.mul(fd.ops.sub(h, mean), fd.ops.rsqrt(fd.ops.add(v, 1e-5))),
                       fd.ops.broadcast(fd.ops.cast(tw, F32), [True, False]))
        fd.add_output(fd.ops.cast(y, dtype))
    run_and_check(fd, [x, w], scheduler="inner_persistent")


@pytest.mark.parametrize("shape", [(4, 64), (4096, 1024), (1000, 5120), (7, 12288)])
@pytest.mark.parametrize("variant", [None, "tma_inner_persistent", "ws_inner_persistent"])
def test_softmax_of_a_sum_with_a_filled_tensor(shape, variant):
    """The triage's repro: softmax(cast(x) + ones); the ones are recomputed with the row."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=F16)
        h = fd.ops.add(fd.ops.cast(t, F32), fd.ops.ones(list(shape), dtype=F32))
        ex = fd.ops.exp(fd.ops.sub(h, fd.ops.max(h, [1], keepdim=True)))
        fd.add_output(fd.ops.div(ex, fd.ops.sum(ex, [1], keepdim=True)))
    x = torch.randn(shape, device="cuda").half()
    run_and_check(fd, [x], scheduler="inner_persistent",
                  options={"enable": [variant]} if variant else None)


@pytest.mark.parametrize("shape, new", [((2, 146, 74), (2, 146, -1, 2)),
                                        ((4096, 8), (-1, 1024)), ((1000, 10), (-1, 5000))])
def test_normalization_of_a_reshaped_input(shape, new):
    x = torch.randn(shape, device="cuda").half()
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * len(shape), dtype=F16)
        h = fd.ops.cast(fd.ops.reshape(t, list(new)), F32)
        v, m = fd.ops.var_mean(h, [-1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(h, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))))
    run_and_check(fd, [x], scheduler="inner_persistent")


def test_normalization_through_a_squeeze():
    x = torch.randn(2048, 4096, device="cuda").half()
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=F16)
        h = fd.ops.cast(fd.ops.squeeze(fd.ops.broadcast(t, [False, False, True]), [2]), F32)
        fd.add_output(fd.ops.sub(h, fd.ops.mean(h, [1], keepdim=True)))
    run_and_check(fd, [x], scheduler="inner_persistent")


@pytest.mark.parametrize("n", [1024, 8192])
def test_layernorm_of_one_row_defined_as_a_broadcast(n):
    """The projection's copy of x - mean stops at the [1, 1] mean (a per-row value)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, -1], dtype=F32)
        v, m = fd.ops.var_mean(t, [1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(t, m), fd.ops.rsqrt(fd.ops.add(v, 1e-5))))
    run_and_check(fd, [torch.randn(1, n, device="cuda")], scheduler="inner_persistent")


@pytest.mark.parametrize("n, c, h, w, g", [(8, 320, 64, 64, 32), (3, 12, 7, 5, 4),
                                           (2, 64, 33, 17, 8)])
@pytest.mark.parametrize("cast_first", [True, False])
def test_groupnorm_reads_a_view_of_its_input(n, c, h, w, g, cast_first):
    """GroupNorm's reshape of x [N, C, H, W] to [N, G, C/G*H*W] (of x, or of its fp32 cast) is
    a view segment: the statistics kernel and the output kernel read x's bf16 bytes, no kernel
    copies x. Odd H and W: rows that are not a multiple of the vector width."""
    x = torch.randn(n, c, h, w, device="cuda").bfloat16()
    wt, bias = (torch.rand(c, device="cuda") + 0.5 for _ in range(2))
    per_channel = [True, False, True, True]
    with FusionDefinition() as fd:
        tx, tw, tb = fd.from_pytorch(x), fd.from_pytorch(wt), fd.from_pytorch(bias)
        shape = [n, g, c // g * h * w]
        xg = (fd.ops.reshape(fd.ops.cast(tx, F32), shape) if cast_first
              else fd.ops.cast(fd.ops.reshape(tx, shape), F32))
        var, mean = fd.ops.var_mean(xg, [2], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        y = fd.ops.reshape(fd.ops.mul(fd.ops.sub(xg, mean), rstd), [n, c, h, w])
        y = fd.ops.add(fd.ops.mul(y, fd.ops.broadcast(tw, per_channel)),
                       fd.ops.broadcast(tb, per_channel))
        fd.add_output(fd.ops.cast(y, BF16))
        fd.add_output(fd.ops.squeeze(mean, [2]))
        fd.add_output(fd.ops.squeeze(rstd, [2]))
    run_and_check(fd, [x, wt, bias], kernels=2,
                  segments=(("view", "view"), ("kernel", "inner_persistent"),
                            ("kernel", "pointwise")))
