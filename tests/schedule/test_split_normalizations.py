"""Normalizations split for a plan of kernels (schedule/split_normalizations.py): the rewrite,
when the executor and explain take it, the outer persistent heuristic that refuses blocks
reading under a sector of each row, and the plans on the interpreter against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import ReductionOp, ReductionOpType
from pyfuser.runtime.explain import explain_fusion
from pyfuser.schedule import split_normalizations as sn
from pyfuser.schedule.recompute import uses_across_reductions
from pyfuser.schedule.schedulers import inner_persistent, outer_persistent
from pyfuser.schedule.schedulers.base import reduction_tensors
from pyfuser.schedule.segmenter import segment

F32, BF16 = DataType.Float, DataType.BFloat16
INTERPRET = {"enable": ["interpret", "poison_outputs"]}


def softmax_over_last(x: torch.Tensor, name="softmax"):
    """softmax over dim 1 of `x` (any strides), bf16 in and out."""
    with FusionDefinition(name) as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)), BF16))
    return fd


def softmax_dim0(x: torch.Tensor):
    with FusionDefinition("softmax_dim0") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [0], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [0], keepdim=True)), BF16))
    return fd


def transposed(rows, cols, device="meta"):
    """A [rows, cols] bf16 view of a row-major [cols, rows]: its dim 1 outermost in memory."""
    return torch.empty(cols, rows, dtype=torch.bfloat16, device=device).t()


def test_the_rewrite_makes_one_logsumexp_and_recomputes_the_rest():
    fd = softmax_over_last(transposed(64, 128))
    split = sn.split_normalizations(fd.fusion)
    reds = [e for e in split.exprs() if isinstance(e, ReductionOp)]
    assert [r.op for r in reds] == [ReductionOpType.LogSumExp]
    assert uses_across_reductions(split, reduction_tensors(split)) == []
    assert len(fd.fusion.exprs()) < len(split.exprs())          # the fusion given is unchanged
    assert [e for e in fd.fusion.exprs() if isinstance(e, ReductionOp)][0].op == \
        ReductionOpType.Max
    # Nothing to split: a plain reduction.
    with FusionDefinition() as plain:
        x = plain.define_tensor([-1, -1], dtype=F32)
        plain.add_output(plain.ops.sum(x, [1]))
    assert sn.split_normalizations(plain.fusion) is None


def test_the_outer_persistent_heuristic_refuses_blocks_under_a_sector_of_each_row():
    """8192 rows of bf16 fit a block's registers 4 columns wide (8 bytes of each row) while the
    columns fill every SM: refused. 2048 rows fit 16 columns wide (32 bytes): kept."""
    from pyfuser.runtime.inputs import heuristic_info
    from pyfuser.runtime.device import get_device_properties
    from pyfuser.schedule.schedulers.base import SchedulerError
    props = get_device_properties("h200")
    cases = ((softmax_over_last, transposed(4096, 8192), True),
             (softmax_dim0, torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta"), True),
             (softmax_over_last, transposed(8192, 2048), False))
    for define, x, refused in cases:
        fd = define(x)
        assert outer_persistent.can_schedule(fd.fusion)[0]
        clone, info = heuristic_info(fd.fusion, [x], props)
        if not refused:
            p = outer_persistent.compute_heuristics(clone, info)
            assert p.bdimx * p.vector * 2 >= 32
            continue
        with pytest.raises(SchedulerError, match="under a 32-byte sector"):
            outer_persistent.compute_heuristics(clone, info)


def test_the_inner_persistent_scheduler_leaves_rows_outermost_in_memory():
    fd = softmax_over_last(transposed(64, 128))
    ok, why = inner_persistent.can_schedule(fd.fusion)
    assert not ok and "outermost in memory" in why
    row_major = softmax_over_last(torch.empty(64, 128, dtype=torch.bfloat16, device="meta"))
    assert inner_persistent.can_schedule(row_major.fusion)[0]


def test_explain_shows_the_split_plan_of_the_transposed_softmax():
    x = transposed(4096, 8192)
    e = explain_fusion(softmax_over_last(x).fusion, [x], device="h200")
    (whole,) = e.segments
    assert whole.name == "outer_persistent" and "under a 32-byte sector" in whole.refused
    again = whole.again
    assert again.rewritten == sn.DESCRIPTION
    # The rewrite's own executor offers it to every scheduler: the outer persistent one refuses
    # it too (the same narrow rows), and its plan is a reduction and a transpose.
    (rewrite,) = again.segments
    assert rewrite.name == "outer_persistent" and "under a 32-byte sector" in rewrite.refused
    assert [s.name for s in rewrite.again.segments] == ["reduction", "transpose"]
    # Between the kernels: two float32 values a row, not exp(x - max).
    assert all("[4096, 1] float" in o for o in rewrite.again.segments[0].outputs)
    assert "rewritten first: " + sn.DESCRIPTION in str(e)


def test_explain_shows_the_rewrite_taken_by_the_scheduler_that_refused_the_fusion(monkeypatch):
    """A rewrite made after a refusal runs through its own executor, which offers it to every
    scheduler: where the one that refused the fusion takes the rewrite, that is what runs, and
    what explain shows (it once showed the rewrite planned without that scheduler)."""
    from pyfuser.schedule.schedulers.base import SchedulerError
    heuristic = outer_persistent.compute_heuristics

    def refuse_two_reductions(fusion, info):    # the softmax as written, not its rewrite
        if len(reduction_tensors(fusion)) > 1:
            raise SchedulerError("outer persistent: refused for the test")
        return heuristic(fusion, info)
    monkeypatch.setattr(outer_persistent, "compute_heuristics", refuse_two_reductions)
    x = torch.randn(300, 40).to(torch.bfloat16)
    fd = softmax_dim0(x)
    e = explain_fusion(fd.fusion, [x], device="h100", name="softmax_dim0")
    (whole,) = e.segments
    assert whole.refused == "outer persistent: refused for the test"
    assert whole.again.rewritten == sn.DESCRIPTION
    (rewrite,) = whole.again.segments
    assert rewrite.name == "outer_persistent" and not rewrite.refused
    out = fd.execute([x], options={**INTERPRET, "device": "h100"})[0]
    assert fd.last_run.schedulers == ("outer_persistent",)
    # The rewrite's executor names its kernel: softmax_dim0_split_outer_persistent_0.
    assert fd.last_run.kernel_names == (rewrite.kernel.name,)
    assert rewrite.kernel.name == "softmax_dim0_split_outer_persistent_0"
    assert fd.last_run.reason.startswith(sn.DESCRIPTION)
    torch.testing.assert_close(out.float(), x.double().softmax(0).float(), atol=4e-3, rtol=0)


def _nchw_normalization(two_pass: bool):
    """x [N, C, H, W] bf16 normalized per channel: by its two-pass variance, or (not
    `two_pass`) by its mean square."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        if two_pass:
            var, mean = fd.ops.var_mean(xf, [0, 2, 3], correction=0, keepdim=True)
            y = fd.ops.mul(fd.ops.sub(xf, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        else:
            ms = fd.ops.mean(fd.ops.mul(xf, xf), [0, 2, 3], keepdim=True)
            y = fd.ops.mul(fd.ops.sub(xf, fd.ops.mean(xf, [0, 2, 3], keepdim=True)),
                           fd.ops.rsqrt(fd.ops.add(ms, 1e-5)))
        fd.add_output(fd.ops.cast(y, BF16))
    return fd


def test_a_plan_that_already_recomputes_is_kept():
    """Where the segmenter's plan has no more segments and stores no more than the split's (a
    normalization whose centred x is forwarded, no two-pass variance), the fusion's own plan
    stays."""
    fd = _nchw_normalization(two_pass=False)
    segmented = segment(fd.fusion)
    assert len(segmented.segments) > 1
    assert sn.better_split(fd.fusion, segmented) is None


def test_a_two_pass_variance_split_over_kernels_becomes_one_pass():
    """BatchNorm's statistics over NCHW dims (no kernel takes the fusion whole): three kernels
    as written (the mean, the variance, y), two after the split (float64 sums of x and x^2 in
    one reduction kernel, then y)."""
    fd = _nchw_normalization(two_pass=True)
    segmented = segment(fd.fusion)
    assert [s.name for s in segmented.segments] == ["reduction", "reduction", "pointwise"]
    split, again = sn.better_split(fd.fusion, segmented)
    assert [s.name for s in again.segments] == ["reduction", "pointwise"]
    sums = [r.definition for r in reduction_tensors(split)]
    assert [(e.op, e.outputs[0].dtype) for e in sums] == [(ReductionOpType.Sum, DataType.Double)] * 2
    # The fusion's own is untouched.
    assert all(r.dtype == F32 for r in reduction_tensors(fd.fusion))


def test_the_split_is_segmented_once(monkeypatch):
    """The executor compares the split's segmentation with the fusion's own, then plans the
    split with that segmentation instead of segmenting it again (a new process's first call of
    BatchNorm forward segmented the split twice)."""
    from pyfuser.runtime import executor as executor_mod
    from pyfuser.schedule import segmenter
    fd = _nchw_normalization(two_pass=True)
    calls = []
    real = segmenter.segment

    def counting(fusion, *a, **kw):
        calls.append(fusion)
        return real(fusion, *a, **kw)
    monkeypatch.setattr(segmenter, "segment", counting)
    monkeypatch.setattr(executor_mod, "segment", counting)
    x = (torch.randn(3, 5, 7, 9, generator=torch.Generator().manual_seed(2)) + 4).to(
        torch.bfloat16)
    y = fd.execute([x], options=INTERPRET)[0]
    assert fd.last_run.reason.startswith(sn.DESCRIPTION), fd.last_run.reason
    assert calls[0] is fd.fusion and len(calls) == 2, calls     # the fusion's, the split's
    xd = x.double()
    var, mean = torch.var_mean(xd, dim=(0, 2, 3), correction=0, keepdim=True)
    torch.testing.assert_close(y.double(), (xd - mean) * torch.rsqrt(var + 1e-5),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout", ["transposed", "dim0"])
def test_split_plans_on_the_interpreter(layout):
    """On the interpreter's 4-SM device: 8192 rows of 32 columns, 4 columns a block (8 tiles),
    refused by the outer persistent heuristic, run as the split plan: a logsumexp reduction,
    then one transpose or pointwise kernel, against float64."""
    g = torch.Generator().manual_seed(3)
    base = (torch.randn(8192, 32, generator=g) * 3).to(torch.bfloat16)
    if layout == "transposed":
        x, fd, dim = base.t(), softmax_over_last(base.t(), "st"), 1
    else:
        x, fd, dim = base, softmax_dim0(base), 0
    out = fd.execute([x], options=INTERPRET)[0]
    run = fd.last_run
    assert run.reason.startswith(sn.DESCRIPTION), run.reason
    assert run.schedulers == ("reduction", "transpose" if layout == "transposed" else "pointwise")
    assert run.kind == "kernels"
    want = torch.softmax(x.double(), dim=dim)
    assert out.shape == want.shape and out.is_contiguous()
    err = (out.double() - want).norm() / want.norm()
    assert err < 1e-2, err


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["transposed", "dim0"])
def test_split_plans_on_the_gpu(layout):
    """8191 reduced rows of 4096 columns (4 columns a block fit the registers): the split plan,
    outputs poisoned, against float64."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(5)
    base = (torch.randn(8191, 4096, generator=g) * 4).to(torch.bfloat16).cuda()
    if layout == "transposed":
        x, fd, dim = base.t(), softmax_over_last(base.t(), "st_gpu"), 1
    else:
        x, fd, dim = base, softmax_dim0(base), 0
    out = fd.execute([x], options={"enable": ["poison_outputs"]})[0]
    run = fd.last_run
    assert run.reason.startswith(sn.DESCRIPTION), run.reason
    assert run.backend == "cuda" and run.kind == "kernels"
    assert run.schedulers == ("reduction", "transpose" if layout == "transposed" else "pointwise")
    want = torch.softmax(x.double(), dim=dim)
    assert out.is_contiguous() and out.shape == want.shape
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < 1e-2, err
    assert ((out.double() - want).abs() <= 1e-2 * want.abs() + 1e-4).all()
