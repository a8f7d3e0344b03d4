"""Reduction kernels on the GPU against the float64 reference evaluator."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.executor import FallbackWarning
from pyfuser import catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 1), (7, 1023), (1023, 7), (4097, 33), (3, 2 ** 20 + 3), (2 ** 14 + 1, 17)]


def _dt(t):
    return {torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half,
            torch.float32: DataType.Float}[t]


def _reduce(op, dim, dtype, keepdim=False):
    with FusionDefinition(f"{op}{dim}") as fd:
        x = fd.define_tensor([-1, -1], dtype=_dt(dtype))
        xf = fd.ops.cast(x, DataType.Float)
        r = getattr(fd.ops, op)(xf, [dim], keepdim=keepdim)
        fd.add_output(fd.ops.cast(r, _dt(dtype)))
    return fd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dim", [0, 1])
def test_sum(dtype, shape, dim):
    fd = _reduce("sum", dim, dtype)
    run_and_check(fd, [torch.randn(shape, device="cuda", dtype=dtype)], scheduler="reduction")


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1])
def test_max_min(op, dim):
    fd = _reduce(op, dim, torch.float32)
    run_and_check(fd, [torch.randn(1000, 3001, device="cuda")], scheduler="reduction")


def test_max_propagates_nan():
    fd = _reduce("max", 1, torch.float32)
    x = torch.randn(64, 4096, device="cuda")
    x[5, 77] = float("nan")
    out = fd.execute([x])[0]
    assert torch.isnan(out[5]) and not torch.isnan(out[torch.arange(64) != 5]).any()


@pytest.mark.parametrize("name", ["row_sum", "col_sum"])
def test_catalogue_sums(name):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, 2048, 4096, device="cuda"), scheduler="reduction")


def test_noncontiguous_reduction_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [1]))
    x = torch.randn(300, 700, device="cuda")[:, 13:613]
    run_and_check(fd, [x], scheduler="reduction")


def test_keepdim_and_mean():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.mean(x, [1], keepdim=True))
    run_and_check(fd, [torch.randn(513, 1000, device="cuda")], scheduler="reduction")


def _full_sum():
    with FusionDefinition("full_sum") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [0, 1]))
    return fd


def test_fusion_without_scheduler_warns_and_falls_back(monkeypatch, isolated_cache):
    # Every scheduler takes a full sum now: the reduction scheduler is made to refuse it, as it
    # did before it had a schedule for full reductions, so that no scheduler takes it.
    from pyfuser.schedule.schedulers import reduction
    takes = reduction.can_schedule
    monkeypatch.setattr(reduction, "can_schedule", lambda f: (False, "refused by this test")
                        if takes(f)[1].startswith("full") else takes(f))
    fd = _full_sum()
    x = torch.randn(64, 256, device="cuda")
    with pytest.warns(FallbackWarning):
        (out,) = fd.execute([x])
    assert fd.last_run.kind == "reference" and fd.last_run.num_kernels == 0
    assert "no scheduler" in fd.last_run.reason
    assert torch.allclose(out, x.sum(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("shape", [(64, 256), (7, 1), (1000, 4099)])
def test_full_sum_is_one_reduction_kernel(shape):
    fd = _full_sum()
    run_and_check(fd, [torch.randn(*shape, device="cuda")], scheduler="reduction")
    assert fd.last_run.heuristics[0].full


def test_full_sum_of_8192x4096_bf16_is_a_grid_reduction():
    """Issue 16's bar shape: one full-reduction kernel over the grid (no fallback), against
    float64 with the output poisoned."""
    with FusionDefinition("full_sum_bf16") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, DataType.Float), [0, 1]))
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    run_and_check(fd, [x], scheduler="reduction")
    p = fd.last_run.heuristics[0]
    assert p.full and p.grid_split > 1 and p.vector == 8
    # Deterministic: the last block combines the partials in block order.
    (a,) = fd.execute([x])
    (b,) = fd.execute([x])
    assert torch.equal(a, b)


@pytest.mark.parametrize("name,shape", [("mse_mean", (8192, 4096)), ("amax_scale", (8192, 8192))])
def test_issue16_full_reduction_bars_run_as_kernels(name, shape):
    fd = catalogue.define(name, "bf16")
    ins = catalogue.make_inputs(name, *shape, "bf16", device="cuda", seed=0)
    segs = (("kernel", "reduction"), ("kernel", "pointwise")) if name == "amax_scale" else ()
    run_and_check(fd, ins, kernels=len(segs) or 1, segments=segs,
                  scheduler="reduction" if not segs else None)


def test_row_and_column_sums_are_a_plan_of_two_reduction_kernels():
    """No scheduler takes a row sum and a column sum of one input whole: the segmenter runs
    each as a reduction kernel (this fusion fell back to the reference before)."""
    with FusionDefinition("rowcol") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        fd.add_output(fd.ops.sum(x, [1]))
    x = torch.randn(257, 1031, device="cuda")
    run_and_check(fd, [x], kernels=2, segments=(("kernel", "reduction"), ("kernel", "reduction")))


def test_fallback_can_be_disabled(monkeypatch, isolated_cache):
    from pyfuser.schedule.schedulers import reduction     # no scheduler takes it (as above)
    monkeypatch.setattr(reduction, "can_schedule", lambda f: (False, "refused by this test"))
    fd = _full_sum()
    with pytest.raises(RuntimeError, match="reference fallback is disabled"):
        fd.execute([torch.randn(8, 64, device="cuda")], options={"disable": ["reference_fallback"]})


def test_grid_reduce_combine_order_and_determinism():
    """The last block's combine (tests/schedule/test_grid_reduce_combine.py): fp32 partials 1e8
    at block 0, 1 at block 1 and -1e8 at block 32 of 40 (blocks of 32 threads) sum to 1 (thread
    0 combines blocks 0 and 32, thread 1 block 1; in block order, 0); a 264-block split of 2^25
    elements gives the same bits in every run."""
    from pyfuser.schedule.schedulers.reduction import ReductionParams
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1]), [0]))
    g, bdimx = 40, 32
    x = torch.zeros(g * bdimx, device="cuda")
    x[0], x[32], x[32 * 32] = 1e8, 1.0, -1e8
    p = ReductionParams(True, 1, bdimx, 1, 1, (), g, full=True)
    outs = [fd.execute([x], options={"heuristic": p})[0] for _ in range(3)]
    assert fd.last_run.kind == "kernels"
    assert all(o.item() == 1.0 for o in outs)
    y = torch.randn(8192 * 4096, device="cuda")
    p = ReductionParams(True, 4, 512, 1, 4, (0,), 264, full=True)
    runs = [fd.execute([y], options={"heuristic": p})[0] for _ in range(5)]
    assert fd.last_run.heuristics[0] == p
    assert all(torch.equal(r, runs[0]) for r in runs)


@pytest.mark.parametrize("case", ["weighted_rows", "bias", "column_weights", "full",
                                  "running_mean_nchw", "running_mean_nhwc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_inputs_of_fewer_dims_are_read_by_the_reduction_kernel(case, dtype):
    """Inputs of fewer dims than the reduction's input, over reduced dims only (weights) or
    kept dims only (a bias, running statistics in the epilogue): one reduction kernel, odd and
    vector-friendly sizes, outputs poisoned, against float64."""
    g = torch.Generator(device="cuda").manual_seed(5)

    def r(*shape):
        return torch.randn(shape, device="cuda", generator=g).to(dtype)
    F = DataType.Float
    with FusionDefinition() as fd:
        if case in ("weighted_rows", "full"):
            x, w = r(1031, 4099), r(4099)
            tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
            prod = fd.ops.mul(fd.ops.cast(tx, F), fd.ops.cast(tw, F))
            fd.add_output(fd.ops.sum(prod, [1]) if case == "weighted_rows" else fd.ops.sum(prod))
            inputs = [x, w]
        elif case == "bias":
            x, b = r(1031, 4096), r(1031)
            tx, tb = fd.from_pytorch(x), fd.from_pytorch(b)
            fd.add_output(fd.ops.add(fd.ops.sum(fd.ops.cast(tx, F), [1]), fd.ops.cast(tb, F)))
            inputs = [x, b]
        elif case == "column_weights":
            x, w = r(4099, 1031), r(4099)
            tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
            prod = fd.ops.mul(fd.ops.cast(tx, F), fd.ops.broadcast(fd.ops.cast(tw, F),
                                                                   [False, True]))
            fd.add_output(fd.ops.sum(prod, [0]))
            inputs = [x, w]
        else:
            x, rm = r(8, 64, 28, 28), torch.randn(64, device="cuda", generator=g)
            if case == "running_mean_nhwc":
                x = x.to(memory_format=torch.channels_last)
            tx, trm = fd.from_pytorch(x), fd.from_pytorch(rm)
            mean = fd.ops.mean(fd.ops.cast(tx, F), [0, 2, 3])
            fd.add_output(mean)
            fd.add_output(fd.ops.add(fd.ops.mul(trm, 0.9), fd.ops.mul(mean, 0.1)))
            inputs = [x, rm]
    run_and_check(fd, inputs, scheduler="reduction")


@pytest.mark.parametrize("dims, shape", [([1], (37, 2 ** 20 + 3)), ([0], (2 ** 18 + 5, 96)),
                                         ([0, 1], (1001, 4097))], ids=["inner", "outer", "full"])
def test_several_reductions_split_over_blocks(dims, shape):
    """sum, max and sum of squares of one input, each split over blockIdx.y: the block last
    for the first grid reduction waits for the partials of the others and combines them too
    (the last block of each had been its own, and the outputs were written by the last one's).
    Three calls: the semaphores are reset by every launch."""
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(tx, DataType.Float)
        fd.add_output(fd.ops.sum(xf, dims))
        fd.add_output(fd.ops.max(xf, dims))
        fd.add_output(fd.ops.sum(fd.ops.mul(xf, xf), dims))
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.randn(shape, device="cuda", generator=g) + 0.5).bfloat16()
        run_and_check(fd, [x], scheduler="reduction")
        assert fd.last_run.heuristics[0].grid_split > 1, fd.last_run
