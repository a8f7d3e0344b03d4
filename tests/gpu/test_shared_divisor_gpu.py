"""Quotients by a divisor their loop shares (lower/shared_divisor.py) on the GPU: through the
divisor's reciprocal where the range check passes, the loop again with IEEE division where it
fails. The quotients must be torch's (IEEE) division bit for bit, on rows that take either path
(tests/lower/test_shared_divisor.edge_rows), with outputs poisoned; the one-hot compare of an
int64 target by halves must match nothing for targets beyond 32 bits."""
import sys
from pathlib import Path

import pytest
import torch

from pyfuser import DataType, FusionDefinition

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))
from test_shared_divisor import _fusion, _scaled_rows, edge_rows  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _poisoned_execute(fd, inputs):
    """Runs twice, the first time into outputs torch then overwrites with NaN patterns (a
    cached plan writes fresh outputs each call; an element it skipped would be garbage)."""
    fd.execute(inputs)
    torch.cuda.synchronize()
    junk = torch.full((1 << 26,), float("nan"), device="cuda")   # poisons the allocator's blocks
    del junk
    return fd.execute(inputs)


@pytest.mark.parametrize("n", [1000, 3000, 12288, 65537])
def test_row_quotients_are_torch_division_bit_for_bit(n):
    fd = _fusion(_scaled_rows)
    x = edge_rows(n).cuda()
    out = _poisoned_execute(fd, [x])[0]
    kernel = fd.explain([x.to("meta")], device="h200").kernels[0].kernel
    assert "pf::div_shared_divisor(" in kernel.source and fd.last_run.kind == "kernels"
    want = x / x.abs().amax(1, keepdim=True)
    same = (out.view(torch.int32) == want.view(torch.int32)) | (out.isnan() & want.isnan())
    assert bool(same.all()), (~same).nonzero()[:5].tolist()


def test_cross_entropy_division_form_against_float64():
    """Issue 17's fusion (division form) at an odd vocabulary, logits spread so that some
    rows leave the fast range (a row of -10 but one 50: its other quotients are e^-60 / s,
    under 2^-75)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
    from bench_issue17 import define_cross_entropy
    m, v = 64, 50257
    g = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(m, v, device="cuda", generator=g) * 3).to(torch.bfloat16)
    x[3] = -10.0
    x[3, 17] = 50.0
    t = torch.randint(0, v, (m,), device="cuda", generator=g)
    with FusionDefinition() as fd:
        define_cross_entropy(fd, fd.from_pytorch(x), fd.from_pytorch(t), m, v)
    loss, dx = _poisoned_execute(fd, [x, t])
    assert "pf::div_shared_divisor(" in fd.explain([x.to("meta"), t.to("meta")],
                                                   device="h200").kernels[0].kernel.source
    xd = x.double()
    lse = torch.logsumexp(xd, 1)
    want_loss = lse - xd.gather(1, t[:, None])[:, 0]
    grad = torch.softmax(xd, 1)
    grad[torch.arange(m, device="cuda"), t] -= 1
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), grad / m, rtol=1.6e-2, atol=1e-7)


def test_one_hot_against_targets_beyond_32_bits():
    m, v = 6, 300
    t = torch.tensor([5, (1 << 32) + 5, -1, -(1 << 32) + 5, 299, 0], dtype=torch.int64,
                     device="cuda")
    with FusionDefinition() as fd:
        tt = fd.from_pytorch(t)
        one_hot = fd.ops.eq(fd.ops.broadcast(fd.ops.iota(v), [True, False]),
                            fd.ops.broadcast(tt, [False, True]))
        fd.add_output(fd.ops.cast(one_hot, DataType.Float))
    out = _poisoned_execute(fd, [t])[0]
    assert fd.last_run.kind == "kernels"
    assert torch.equal(out, (torch.arange(v, device="cuda")[None, :] == t[:, None]).float())
