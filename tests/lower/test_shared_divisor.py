"""lower/shared_divisor.py: quotients by a divisor their loop shares go through its reciprocal,
checked once per loop; the loop runs again with IEEE division where a check failed. On the
interpreter the values are IEEE division's bit for bit, on rows whose divisors and dividends
leave the fast range (tools/check_shared_divisor.py checks the device's quotient itself)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kir_testing import empty_inputs, schedule_and_lower  # noqa: E402
from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.runtime import interpreter  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
import bench_issue17  # noqa: E402


def _scaled_rows(fd):
    """y = x / max(|x|) over each row: the row's max divides every element of the row."""
    x = fd.define_tensor([-1, -1], dtype=DataType.Float)
    fd.add_output(fd.ops.div(x, fd.ops.max(fd.ops.abs(x), [1], keepdim=True)))


def _fusion(define):
    with FusionDefinition() as fd:
        define(fd)
    return fd


def _checked(kernel) -> list:
    return [s for s in K.walk(kernel.body) if isinstance(s, K.CheckedQuotients)]


def _flagged(stmts) -> list:
    return [s for s in K.walk(stmts) if isinstance(s, K.TensorOp) and s.quotient_flag]


def edge_rows(n: int) -> torch.Tensor:
    """Rows whose quotients take the fast path, and rows that leave its range: a divisor below
    2^-26 or infinite, NaN or 0, dividends far below the row's max (quotients under 2^-75),
    subnormal, -0 and +0, and values near the float32 maximum."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, n, generator=g)
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-30])
    x[1] *= 2.0 ** -110                       # divisor below 2^-26
    x[2, ::7] *= 1e-30                        # quotients below 2^-75
    x[2, 0] = 1e30
    x[3, 5] = float("inf")
    x[4, 9] = float("nan")
    x[5] = torch.randn(n, generator=g) * 1e-41   # subnormal dividends and divisor
    x[6] = 0.0
    x[7] *= 3e37                              # near the largest float
    x[8, 1::2] = -0.0                         # negative zeros among ordinary values
    x[9] *= 2.0 ** 90                         # a divisor within range, quotients too
    return x


@pytest.mark.parametrize("n", [1000, 65537])
def test_row_quotients_are_ieee_division_on_the_interpreter(n, monkeypatch):
    fd = _fusion(_scaled_rows)
    x = edge_rows(n)
    checks = []
    check = interpreter._shared_divisor_check

    def spy(a, b):
        checks.append(check(a, b))
        return checks[-1]
    monkeypatch.setattr(interpreter, "_shared_divisor_check", spy)
    out = fd.execute([x], options={"enable": ["interpret", "verify_kernel_ir"]})[0]
    want = x / x.abs().amax(1, keepdim=True)
    passed = np.concatenate([np.broadcast_to(c, (np.size(c),)) for c in checks])
    assert passed.any() and not passed.all(), "both the fast quotients and the exact copy run"
    same = (out.view(torch.int32) == want.view(torch.int32)) | (out.isnan() & want.isnan())
    assert bool(same.all()), (~same).nonzero()[:5]


def test_the_check_is_math_cuh_s_rule():
    a = np.array([1.0, 0.0, -0.0, 1e-30, 1e30, np.inf, np.nan, 1e-40, 3.0], dtype=np.float32)
    b = np.array([3.0, 3.0, 3.0, 3.0, 1e-10, 2.0, 2.0, 2.0, 2.0 ** 101], dtype=np.float32)
    got = interpreter._shared_divisor_check(a, b)
    assert got.tolist() == [True, True, False, False, False, False, False, False, False]


def test_the_cross_entropy_dlogits_take_the_fast_quotients():
    """The division form's dlogits: each pass-2 step's quotients clear one flag; the exact
    copy of the steps divides with div.rn; the loss pass is not copied (it reduces)."""
    fd, inputs, _, _ = bench_issue17.cross_entropy("meta")
    _, _, p, k = schedule_and_lower(fd, inputs, device="h200")
    assert p.looped
    (cq,) = _checked(k)
    assert len(_flagged(cq.fast)) == 2 and not _flagged(cq.exact)       # unswitched, checked
    assert cq.exact[0].label == K.QUOTIENTS_EXACT
    assert {s.quotient_flag for s in _flagged(cq.fast)} == {cq.flag}
    assert not any(isinstance(s, K.BlockReduce) for s in K.walk(cq.fast))
    src = generate_cuda(k)
    assert src.count("pf::div_shared_divisor(") == 2 and f"if (!{cq.flag})" in src


def _mean_centred(fd):
    x = fd.define_tensor([-1, -1], dtype=DataType.Float)
    fd.add_output(fd.ops.sub(x, fd.ops.div(fd.ops.sum(x, [1], keepdim=True), 3.0)))


def _sum_of_quotients(fd):
    x = fd.define_tensor([-1, -1], dtype=DataType.Float)
    fd.add_output(fd.ops.sum(fd.ops.div(x, fd.ops.max(x, [1], keepdim=True)), [1]))


def _by_two(fd):
    x = fd.define_tensor([-1, -1], dtype=DataType.Float)
    fd.add_output(fd.ops.div(fd.ops.exp(x), 2.0))


@pytest.mark.parametrize("define,why", [
    (_mean_centred, "a quotient the same along the loop: the compiler divides once"),
    (_sum_of_quotients, "the loop reduces: running it again would add twice"),
    (_by_two, "a power of two: an exact multiply already"),
])
def test_divisions_left_to_div_rn(define, why):
    fd = _fusion(define)
    x = torch.empty(64, 1000, device="meta")
    _, _, _, k = schedule_and_lower(fd, [x], device="h200")
    assert not _checked(k), why


def test_catalogue_normalizations_are_unchanged():
    """LayerNorm's mean (a row's sum over its length, one value per row) and softmax's
    reciprocal are not quotients a loop shares."""
    for name in ("layernorm_fwd", "softmax"):
        fd = catalogue.define(name, "bf16")
        _, _, _, k = schedule_and_lower(fd, empty_inputs(name, 4096, 4096, "bf16"), device="h200")
        assert not _checked(k), name


def test_one_hot_against_targets_beyond_32_bits_on_the_interpreter():
    """The int64 compare by halves (codegen) and the iota read as unsigned: targets that
    differ from a column index only in the high half, or are negative, match nothing."""
    m, v = 6, 300
    t = torch.tensor([5, (1 << 32) + 5, -1, -(1 << 32) + 5, 299, 0], dtype=torch.int64)
    with FusionDefinition() as fd:
        tt = fd.from_pytorch(t)
        one_hot = fd.ops.eq(fd.ops.broadcast(fd.ops.iota(v), [True, False]),
                            fd.ops.broadcast(tt, [False, True]))
        fd.add_output(fd.ops.cast(one_hot, DataType.Float))
    out = fd.execute([t], options={"enable": ["interpret"]})[0]
    want = (torch.arange(v)[None, :] == t[:, None]).float()
    assert torch.equal(out, want)
    assert "pf::eq_by_halves(" in fd.explain([t.to("meta")], device="h200").kernels[0].kernel.source


def test_the_feature_forced_off_leaves_every_division_to_div_rn():
    """PYFUSER_DISABLE=shared_divisor_quotients (or options disable): the kernels divide with
    div.rn; the values are the same bit for bit."""
    from pyfuser import options
    fd = _fusion(_scaled_rows)
    x = edge_rows(1000)
    meta = [x.to("meta")]
    assert "pf::div_shared_divisor(" in fd.explain(meta, device="h200").kernels[0].kernel.source
    with options.override(disable=["shared_divisor_quotients"]):
        src = fd.explain(meta, device="h200").kernels[0].kernel.source
    assert "pf::div_shared_divisor(" not in src and "pf_quotients_ok" not in src
    on = fd.execute([x], options={"enable": ["interpret"]})[0]
    off = fd.execute([x], options={"enable": ["interpret"], "disable": ["shared_divisor_quotients"]})[0]
    assert torch.equal(on.view(torch.int32), off.view(torch.int32))
