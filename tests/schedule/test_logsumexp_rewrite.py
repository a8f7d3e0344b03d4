"""logsumexp in one pass (schedule/logsumexp.py): max(x) and sum(exp(x - max(x))) over the same
dims become one reduction of (max, sum) keys, which reads the rows once; kernels on the
interpreter against the float64 reference of the fusion as written, special values included;
the fusions it must leave alone; NVRTC's report of the kernel."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import ReductionOp, ReductionOpType, UnaryOp, UnaryOpType
from pyfuser.runtime import lse_key
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.logsumexp import fuse_logsumexp
from pyfuser.schedule.schedulers.reduction import ReductionParams
from pyfuser.testing import run_and_check

F32 = DataType.Float
INTERPRET = {"enable": ["interpret"]}


def logsumexp_fd(x, dims=(1,), keepdim=True, cast=True, also_max=False):
    """log(sum(exp(x - max(x)))) + max(x) over `dims`, as a user writes it."""
    with FusionDefinition("lse") as fd:
        t = fd.from_pytorch(x)
        xf = fd.ops.cast(t, F32) if cast else t
        m = fd.ops.max(xf, list(dims), keepdim=keepdim)
        flags = [k in dims for k in range(x.dim())]
        mb = m if keepdim else fd.ops.broadcast(m, flags)
        s = fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, mb)), list(dims), keepdim=keepdim)
        fd.add_output(fd.ops.add(fd.ops.log(s), m))
        if also_max:
            fd.add_output(m)
    return fd


def _ops(fusion):
    return [(type(e).__name__, e.op) for e in fusion.exprs() if isinstance(e, (ReductionOp,))]


def test_the_pair_becomes_one_reduction_and_the_definition_stays():
    x = torch.randn(37, 1003).bfloat16()
    fd = logsumexp_fd(x)
    fused = fuse_logsumexp(fd.fusion)
    assert fused is not fd.fusion
    assert _ops(fused) == [("ReductionOp", ReductionOpType.LogSumExp)]
    assert {e.op for e in fused.exprs() if isinstance(e, UnaryOp)} >= {
        UnaryOpType.LseKey, UnaryOpType.LseMax, UnaryOpType.LseSum}
    assert [op for _, op in _ops(fd.fusion)] == [ReductionOpType.Max, ReductionOpType.Sum]


@pytest.mark.parametrize("shape, dims, keepdim", [
    ((37, 1003), (1,), True), ((37, 1024), (1,), False), ((3, 20000), (1,), True),
    ((64, 8, 33), (0, 2), True), ((1, 4097), (1,), False), ((64, 3000), (0, 1), True),
    ((3000, 64), (0,), False)], ids=["rows", "rows_vec", "long_rows", "two_dims", "one_row", "full",
                                    "columns"])
def test_one_kernel_right_on_the_interpreter(shape, dims, keepdim):
    """One reduction kernel (was two: the max, then the sum of exp reading x again), equal to
    the float64 reference of the two-pass fusion."""
    x = torch.randn(shape).bfloat16()
    fd = logsumexp_fd(x, dims, keepdim)
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)
    out = fd.execute([x], options=INTERPRET)[0]
    want = torch.logsumexp(x.double(), list(dims), keepdim=keepdim)
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


def test_the_max_as_an_output_too():
    x = torch.randn(33, 517) * 30
    fd = logsumexp_fd(x, cast=False, also_max=True)
    run_and_check(fd, [x], scheduler="reduction", options=INTERPRET)


@pytest.mark.parametrize("params", [
    ReductionParams(True, 4, 32, 4, 2, (0,)),                 # 4 rows a block (block y)
    ReductionParams(True, 4, 64, 1, 2, (0,), grid_split=4),   # a row over 4 blocks
    ReductionParams(True, 1, 96, 1, 4, ()),                   # a partial warp
], ids=["rows_per_block", "grid_split", "partial_warp"])
def test_block_and_grid_combines_of_keys(params):
    """The keys' combine in a block reduction over several rows, in a grid reduction (the last
    block combines the partials of the blocks sharing a row) and across a partial warp."""
    x = torch.randn(9, 2000) * 5
    fd = logsumexp_fd(x, cast=False)
    run_and_check(fd, [x], scheduler="reduction",
                  options={**INTERPRET, "heuristic": params})


def test_special_values_give_what_the_two_reductions_give():
    """+inf anywhere and a row of -inf give NaN (exp(inf - inf), exp(-inf - -inf)) as the
    fusion as written does; -inf beside finite values adds nothing; NaN propagates."""
    inf, nan = float("inf"), float("nan")
    x = torch.randn(6, 300)
    x[0, 5] = inf
    x[1, :] = -inf
    x[2, 7] = -inf
    x[3, 100] = nan
    x[4, :] = -1e30
    x[5, 0] = 80.0
    fd = logsumexp_fd(x, cast=False, also_max=True)
    got = fd.execute([x], options=INTERPRET)
    assert fd.last_run.schedulers == ("reduction",)
    want = evaluate(fd.fusion, [x], promote_to_double=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert torch.isnan(got[0][:2]).all() and torch.isfinite(got[0][2:3]).all()


def test_keys_combine_as_the_two_pass_form():
    """runtime/lse_key.py's rule (the interpreter's and the reference's): folding the keys of a
    row in any order gives log(sum(exp(x - max))) + max of it."""
    x = torch.randn(5, 64) * 10
    x[1, 3] = float("-inf")
    keys = lse_key.lse_key(x)
    acc = torch.full((5,), lse_key.IDENTITY, dtype=torch.int64)
    for j in torch.randperm(64).tolist():
        acc = lse_key.lse_combine(acc, keys[:, j])
    got = lse_key.lse_max(acc) + torch.log(lse_key.lse_sum(acc))
    torch.testing.assert_close(got.double(), torch.logsumexp(x.double(), 1), rtol=1e-5, atol=1e-5)
    assert lse_key.lse_sum(torch.tensor([lse_key.IDENTITY])).item() == 0.0


def _softmax(fd, xf):
    m = fd.ops.max(xf, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, m))
    fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))


def _log_softmax(fd, xf):
    m = fd.ops.max(xf, [1], keepdim=True)
    shifted = fd.ops.sub(xf, m)
    s = fd.ops.sum(fd.ops.exp(shifted), [1], keepdim=True)
    fd.add_output(fd.ops.sub(shifted, fd.ops.log(s)))


def _max_over_other_dims(fd, xf):
    m = fd.ops.max(xf, [0], keepdim=True)
    fd.add_output(fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, m)), [0, 1]))


def _exp_also_an_output(fd, xf):
    m = fd.ops.max(xf, [1], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(xf, m))
    fd.add_output(fd.ops.sum(e, [1]))
    fd.add_output(e)


@pytest.mark.parametrize("build, dtype", [
    (_softmax, torch.float32), (_log_softmax, torch.float32),
    (_max_over_other_dims, torch.float32), (_exp_also_an_output, torch.float32),
    (lambda fd, xf: _log_softmax(fd, xf), torch.float64)],
    ids=["softmax", "log_softmax", "other_dims", "exp_output", "float64"])
def test_left_alone(build, dtype):
    """A softmax or log-softmax reads the row again (the persistent schedulers keep it on chip);
    reductions over other dims, an exp that is an output, a float64 fusion (keys hold float32s)
    are not the pattern."""
    x = torch.randn(8, 64, dtype=dtype)
    with FusionDefinition() as fd:
        build(fd, fd.from_pytorch(x))
    assert fuse_logsumexp(fd.fusion) is fd.fusion


def test_kernel_compiles_without_spills():
    """NVRTC for sm_90a: the key reduction of rows of 8192 bf16 (one step a row, streamed)."""
    x = torch.empty(64, 8192, dtype=torch.bfloat16)
    fd = logsumexp_fd(x)
    from pyfuser.runtime.explain import explain_fusion
    ex = explain_fusion(fd.fusion, [x], "h200", compile=True)
    assert len(ex.segments) == 1 and ex.segments[0].kernel.scheduler == "reduction"
    report = ex.segments[0].kernel.ptxas
    assert "0 B spill stores" in report and "0 B stack" in report, report
    assert "pf::OpLogSumExp()" in ex.segments[0].kernel.kernel.source



@pytest.mark.parametrize("params", [None, ReductionParams(True, 4, 64, 1, 2, (0,), grid_split=4)],
                         ids=["default", "grid_split"])
def test_lowers_with_the_verifier_on(params):
    """Every lowering pass's kernel checked by kir/verifier.py (a logsumexp block and grid
    reduction is a reduction op it knows); the block (and with a split, the grid) reduction
    combines the keys."""
    import sys
    import types
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
    from kir_testing import setup
    from pyfuser.kir import nodes as K
    from pyfuser.lower import lower
    from pyfuser.schedule.schedulers import reduction
    x = torch.randn(9, 2000)
    fused = fuse_logsumexp(logsumexp_fd(x, cast=False).fusion)
    st = setup(types.SimpleNamespace(fusion=fused), [x], "h100", None)
    p = params or reduction.compute_heuristics(st.fusion, st.info)
    reduction.schedule(st.fusion, p)
    kernel = lower(st.fusion, "k", verify_each=True)
    reduces = {type(s).__name__: s.op for s in K.walk(kernel.body)
               if isinstance(s, (K.BlockReduce, K.GridReduce))}
    want = {"BlockReduce": "logsumexp"}
    if p.grid_split > 1:
        want["GridReduce"] = "logsumexp"
    assert reduces == want, reduces


def test_the_option_turns_it_off():
    """PYFUSER_DISABLE=one_pass_logsumexp (or options.override) keeps the two reductions (here
    in one inner persistent kernel: rows of 1003 fit on chip)."""
    from pyfuser import options
    x = torch.randn(37, 1003).bfloat16()
    fd = logsumexp_fd(x)
    with options.override({"disable": ["one_pass_logsumexp"]}):
        assert fuse_logsumexp(fd.fusion) is fd.fusion
        out = fd.execute([x], options=INTERPRET)[0]
    assert fd.last_run.schedulers == ("inner_persistent",)
    assert torch.allclose(out.double(), torch.logsumexp(x.double(), 1, keepdim=True), atol=1e-5)
