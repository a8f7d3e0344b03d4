"""top-k on the GPU: the library segment (torch.topk) after a kernel, at vocabulary width,
outputs poisoned; values and indices equal torch's."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_topk_after_a_kernel_at_vocabulary_width():
    # Distinct float32 values (n < 2^24): torch orders tied values as it likes, and
    # run_and_check's reference runs topk in float64, the plan in float32.
    n = 64 * 128256
    x = (torch.randperm(n, device="cuda").float() / n).reshape(64, 128256)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        values, indices = fd.ops.topk(fd.ops.mul(tx, 2.0), 50, 1)
        fd.add_output(values)
        fd.add_output(indices)
    run_and_check(fd, [x], kernels=0)
    assert [(s.kind, s.name) for s in fd.last_run.segments] == [
        ("kernel", "pointwise"), ("library", "topk")]
    v, i = fd.execute([x])
    want = torch.topk(x * 2.0, 50, 1)
    assert torch.equal(v, want.values) and torch.equal(i, want.indices)


def _topk_fd(x, k, largest=True):
    with FusionDefinition() as fd:
        values, indices = fd.ops.topk(fd.from_pytorch(x), k, -1, largest)
        fd.add_output(values)
        fd.add_output(indices)
    return fd


@pytest.mark.parametrize("shape, k, dtype, largest", [
    ((16384, 256), 8, torch.bfloat16, True),      # a router's experts: one warp per row
    ((4097, 64), 6, torch.float32, False),
    ((37, 16384), 50, torch.float32, True),        # 1024 threads of 16: barriers every round
    ((300, 1001), 64, torch.float16, True),
    ((999, 64), 64, torch.int32, False),           # k = n: the whole row in order
    ((5, 3, 129), 1, torch.bfloat16, True),        # k = 1: a broadcast dim
])
def test_block_topk_kernel(shape, k, dtype, largest):
    """The top-k kernel against the defined order (arg_key.topk_in_order: equal values by
    index) on rows with many ties, outputs poisoned; what ran asserted."""
    from pyfuser.runtime.arg_key import topk_in_order
    gen = torch.Generator(device="cuda").manual_seed(k)
    if dtype == torch.int32:
        x = torch.randint(-20, 20, shape, device="cuda", generator=gen, dtype=dtype)
    else:
        x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    fd = _topk_fd(x, k, largest)
    v, i = run_and_check(fd, [x], scheduler="topk")
    want_v, want_i = topk_in_order(x, k, x.dim() - 1, largest)
    assert torch.equal(v, want_v) and torch.equal(i, want_i)
    assert torch.equal(v, torch.topk(x, k, -1, largest=largest).values)


def test_nan_and_signed_zeros_on_the_gpu():
    from pyfuser.runtime.arg_key import topk_in_order
    row = [1.0, float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 3.0, float("nan"), -0.0]
    x = torch.tensor([row, row[::-1]] * 50, device="cuda")
    for largest in (True, False):
        fd = _topk_fd(x, 9, largest)
        v, i = fd.execute([x])
        assert fd.last_run.schedulers == ("topk",), fd.last_run
        want_v, want_i = topk_in_order(x, 9, 1, largest)
        assert torch.equal(i, want_i)
        assert torch.equal(torch.signbit(v), torch.signbit(want_v))
        assert torch.equal(v.nan_to_num(7.0), want_v.nan_to_num(7.0))


def test_router_with_scores_normalized_after():
    """sigmoid(logits) + bias picks 8 of 256 experts (the top-k kernel); the picked scores
    normalized to sum 1 (a reduction over the 8: a kernel after it)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(8192, 256, device="cuda", generator=gen).bfloat16()
    bias = 0.1 * torch.randn(256, device="cuda", generator=gen)
    with FusionDefinition() as fd:
        tl, tb = fd.from_pytorch(logits), fd.from_pytorch(bias)
        s = fd.ops.sigmoid(fd.ops.cast(tl, "float32"))
        values, indices = fd.ops.topk(fd.ops.add(s, fd.ops.broadcast_in_dim(tb, [8192, 256], [1])),
                                      8, 1)
        fd.add_output(fd.ops.div(values, fd.ops.sum(values, [1], keepdim=True)))
        fd.add_output(indices)
    run_and_check(fd, [logits, bias], kernels=0)
    kinds = [(s.kind, s.name) for s in fd.last_run.segments]
    assert ("kernel", "topk") in kinds and all(k == "kernel" for k, _ in kinds), kinds
