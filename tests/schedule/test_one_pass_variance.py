"""Two-pass variances made one pass (schedule/one_pass_variance.py): which sums of squares are
found, the rewrite's value against the two-pass form and float64 (user means, large means over
small deviations, constants, NaN), and a plan of kernels on the interpreter."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule import split_normalizations as sn
from pyfuser.schedule.one_pass_variance import one_pass_variance, two_pass_variances

F32, F64, BF16 = DataType.Float, DataType.Double, DataType.BFloat16
INTERPRET = {"enable": ["interpret", "poison_outputs"]}


def var_mean_fusion(dtype=F32, dims=(0, 2, 3), correction=0):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=dtype)
        var, mean = fd.ops.var_mean(x, list(dims), correction=correction)
        fd.add_output(var)
        fd.add_output(mean)
    return fd


def user_mean_fusion(scale: str):
    """sum((x - m)^2) over dim 1 of [M, N] float32, m the row sum times 1/N ("mul") or over
    N - 1 ("div": another count than the sum's)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=F32)
        s = fd.ops.sum(x, [1], keepdim=True)
        m = fd.ops.mul(s, 1.0 / 37) if scale == "mul" else fd.ops.div(s, 36.0)
        d = fd.ops.sub(x, m)
        fd.add_output(fd.ops.sum(fd.ops.mul(d, d), [1]))
        fd.add_output(m)
    return fd


def rewritten(fd):
    clone, _ = fd.fusion.clone()
    assert one_pass_variance(clone) == 1
    return clone


def test_var_mean_of_floats_and_of_16_bit_floats_is_found():
    assert len(two_pass_variances(var_mean_fusion().fusion)) == 1
    assert len(two_pass_variances(var_mean_fusion(BF16).fusion)) == 1   # summed as float32


def test_float64_and_other_dims_keep_two_passes():
    """A float64 x keeps its two passes (one float64 pass would lose what it has); a square of
    x minus a mean over other dims than the sum's is not a variance."""
    assert two_pass_variances(var_mean_fusion(F64).fusion) == []
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=F32)
        d = fd.ops.sub(x, fd.ops.mean(x, [0], keepdim=True))
        fd.add_output(fd.ops.sum(fd.ops.mul(d, d), [1]))
    assert two_pass_variances(fd.fusion) == []


@pytest.mark.parametrize("scale", ["mul", "div"])
def test_a_users_mean_gives_the_two_pass_sum_of_squares(scale):
    """sum((x - m)^2) = S2 - m (2 S1 - n m) for any m: a mean times 1/N, or over another count
    than the sum's, gives the two-pass value (float64 evaluation of both)."""
    fd = user_mean_fusion(scale)
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 3
    want = evaluate(fd.fusion, [x], promote_to_double=True)
    got = evaluate(rewritten(fd), [x], promote_to_double=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=0)


@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_float32_results_keep_their_precision_over_a_large_mean(offset):
    """x = offset + N(0, 1) in float32 (offset 300: mean^2 / var = 9e4, the cancellation the
    float64 sums absorb): the one-pass variance, evaluated op by op in the fusion's dtypes, within
    1e-6 relative of float64's, as close as the two-pass float32 form or closer."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 4, 50, 61, generator=g, dtype=torch.float64) + offset).float()
    fd = var_mean_fusion()
    want = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    two_pass = evaluate(fd.fusion, [x])
    one_pass = evaluate(rewritten(fd), [x])
    for k in range(2):
        err1 = ((one_pass[k].double() - want[k]).abs() / want[k].abs()).max().item()
        err2 = ((two_pass[k].double() - want[k]).abs() / want[k].abs()).max().item()
        assert err1 < 1e-6 and err1 <= max(err2, 2 ** -24), (k, err1, err2)


def test_a_constant_channel_has_variance_zero_and_nan_stays_nan():
    """Constant data: S2 - m (2 S1 - n m) is exactly 0 here, and never below 0 anywhere (the
    max with 0); a NaN in a channel makes its variance NaN, as the two-pass form does."""
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(3))
    x[:, 0] = 0.3
    x[1, 2, 3, 4] = float("nan")
    var, mean = evaluate(rewritten(var_mean_fusion()), [x])
    assert var[0].item() == 0.0 and var[1].item() > 0 and torch.isnan(var[2])
    assert torch.isnan(mean[2]) and not torch.isnan(mean[:2]).any()


def test_batchnorm_statistics_on_the_interpreter():
    """An NCHW var_mean with y = (x - mean) * rstd, odd sizes, outputs poisoned: the split plan
    (one reduction kernel of float64 sums, then y) against float64."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(3, 5, 7, 9, generator=g) * 2 + 40).to(torch.bfloat16)
    with FusionDefinition() as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0, keepdim=True)
        rstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.sub(xf, mean), rstd), BF16))
        fd.add_output(fd.ops.squeeze(mean, [0, 2, 3]))
        fd.add_output(fd.ops.squeeze(rstd, [0, 2, 3]))
    y, mean, rstd = fd.execute([x], options=INTERPRET)
    run = fd.last_run
    assert run.reason.startswith(sn.DESCRIPTION) and run.schedulers == ("reduction", "pointwise")
    xd = x.double()
    var64, mean64 = torch.var_mean(xd, dim=(0, 2, 3), correction=0, keepdim=True)
    rstd64 = torch.rsqrt(var64 + 1e-5)
    torch.testing.assert_close(mean.double(), mean64.flatten(), rtol=1e-6, atol=0)
    torch.testing.assert_close(rstd.double(), rstd64.flatten(), rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), (xd - mean64) * rstd64, rtol=1e-2, atol=1e-2)


def test_the_split_plan_writes_in_place_outputs_and_binds_its_plan():
    """BatchNorm forward with its running statistics updated in place, through the split plan
    (the rewritten fusion's executor): every returned output, the running mean and variance
    written into their inputs at each call (the rewrite once dropped the returned outputs:
    its clone kept the in-place ones), and the rewrite's plan bound at the first call."""
    from pyfuser.runtime.rewritten_plan import RewrittenPlan
    g = torch.Generator().manual_seed(5)
    per_channel = [True, False, True, True]

    def inputs():
        return [torch.randn(2, 6, 5, 3, generator=g).to(torch.bfloat16),
                torch.rand(6, generator=g), torch.rand(6, generator=g) + 0.5]

    x, rm, rv = inputs()
    with FusionDefinition() as fd:
        tx, trm, trv = fd.from_pytorch(x), fd.from_pytorch(rm), fd.from_pytorch(rv)
        xf = fd.ops.cast(tx, F32)
        var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0)
        y = fd.ops.sub(xf, fd.ops.broadcast(mean, per_channel))
        fd.add_output(fd.ops.cast(y, BF16))
        fd.add_output(mean)
        fd.add_output(fd.ops.add(fd.ops.mul(trm, 0.9), fd.ops.mul(mean, 0.1)), alias_input=trm)
        fd.add_output(fd.ops.add(fd.ops.mul(trv, 0.9), fd.ops.mul(var, 0.1)), alias_input=trv)
    for call in range(2):
        x, rm, rv = inputs()
        rm0, rv0 = rm.clone(), rv.clone()
        y, mean = fd.execute([x, rm, rv], options=INTERPRET)
        assert fd.last_run.reason.startswith(sn.DESCRIPTION)
        var64, mean64 = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
        torch.testing.assert_close(mean.double(), mean64, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(rm.double(), 0.9 * rm0.double() + 0.1 * mean64,
                                   rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(rv.double(), 0.9 * rv0.double() + 0.1 * var64,
                                   rtol=1e-6, atol=1e-7)
    (plan,) = fd._executor._plans.values()
    assert isinstance(plan, RewrittenPlan) and plan._bound is not None
