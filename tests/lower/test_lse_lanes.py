"""Pass fold_lse_lanes (lower/lse_lanes.py): a one-pass logsumexp folds each vector's lanes into
its running key at once. On the CPU: where it applies and where it does not, the kernel-IR
verifier, the interpreter against the float64 reference of the fusion as written (special
values in every position of a vector), the host rule against the per-element combines, and the
NVRTC kernel."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.kir import nodes as K
from pyfuser.lower import lse_lanes
from pyfuser.runtime import lse_key
from pyfuser.runtime.reference import evaluate

F32 = DataType.Float
INTERPRET = {"enable": ["interpret", "verify_kernel_ir"], "disable": ["reference_fallback"]}
INF, NAN = float("inf"), float("nan")


def logsumexp_fd(x):
    """log(sum(exp(x - max(x)))) + max(x) over rows, as a user writes it."""
    with FusionDefinition("lse") as fd:
        t = fd.from_pytorch(x)
        xf = fd.ops.cast(t, F32) if x.dtype != torch.float32 else t
        m = fd.ops.max(xf, [1], keepdim=True)
        s = fd.ops.sum(fd.ops.exp(fd.ops.sub(xf, m)), [1], keepdim=True)
        fd.add_output(fd.ops.squeeze(fd.ops.add(fd.ops.log(s), m), [1]))
    return fd


def folds(fd) -> list:
    (fk,) = fd.kernels(last_run=True)
    return [s for s in K.walk(fk.kernel.body) if isinstance(s, K.LseFoldLanes)]


def run(x):
    fd = logsumexp_fd(x)
    got = fd.execute([x], options=INTERPRET)[0]
    assert fd.last_run.kind == "kernels" and fd.last_run.schedulers == ("reduction",)
    want = evaluate(fd.fusion, [x], promote_to_double=True)[0]
    torch.testing.assert_close(got.double(), want, equal_nan=True, rtol=1e-5, atol=1e-5)
    return fd, got


@pytest.mark.parametrize("dtype, shape, lanes", [
    (torch.bfloat16, (7, 1000), 8), (torch.bfloat16, (3, 4104), 8), (torch.bfloat16, (2, 24), 8),
    (torch.float16, (5, 2056), 8), (torch.float32, (6, 300), 4), (torch.float32, (3, 4097), 0)],
    ids=["bf16_1000", "bf16_4104", "bf16_24", "fp16", "fp32", "fp32_odd"])
def test_each_vector_folds_at_once_on_the_interpreter(dtype, shape, lanes):
    x = (torch.randn(shape) * 4).to(dtype)
    fd, _ = run(x)
    found = folds(fd)
    if not lanes:           # rows of odd length hold no vector: each element combines alone
        assert not found
        return
    assert found and all(len(f.lanes) == lanes for f in found)
    (fk,) = fd.kernels(last_run=True)
    keys = [s for s in K.walk(fk.kernel.body) if isinstance(s, K.TensorOp)
            and getattr(s.expr, "op", None) == lse_lanes.UnaryOpType.LseKey]
    assert not keys, "an element's key is still made where its vector folds"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values_in_every_lane_give_what_the_two_passes_give(dtype):
    """+inf anywhere and a row of -inf give NaN, NaN propagates, and -inf beside finite values
    adds nothing: a whole vector of -inf among finite ones, one -inf lane, -inf lanes at the
    row's start and end, a row of -inf but for one element."""
    x = torch.randn(12, 512) * 3
    x[0, 5] = INF
    x[1, :] = -INF
    x[2, 8:16] = -INF                   # one whole vector (8 lanes of bf16, two of fp32)
    x[3, 3] = -INF
    x[4, 100] = NAN
    x[5, :] = -INF
    x[5, 300] = 2.0
    x[6, :4] = -INF
    x[6, -4:] = -INF
    x[7, 17] = 90.0                     # a lane far above the others
    x[8, :] = -1e30
    x[9, 200:] = -INF
    x[10, 64] = INF
    x[10, 65] = -INF
    fd, got = run(x.to(dtype))
    assert folds(fd)
    assert torch.isnan(got[[0, 1, 4, 10]]).all() and torch.isfinite(got[[2, 3, 5, 6, 7, 8, 9, 11]]).all()


def test_the_host_rule_is_the_per_element_combines():
    """lse_key.fold_lanes (the interpreter's rule, and math.cuh's with exact exps) gives the
    key that combining each lane's key into the accumulator one by one gives: the same max,
    the same sum to float32 rounding, NaN where they give NaN."""
    g = torch.Generator().manual_seed(0)
    lanes = torch.randn(4096, 8, generator=g) * 6
    lanes[0] = -INF
    lanes[1, 3] = -INF
    lanes[2, 5] = INF
    lanes[3, 0] = NAN
    lanes[4, :7] = -INF
    acc = lse_key.lse_key(torch.randn(4096, generator=g))
    acc[5] = lse_key.IDENTITY
    acc[6] = lse_key.pack(torch.tensor(-INF), torch.tensor(3.0))     # three -inf seen before
    folded = lse_key.fold_lanes(acc, lanes)
    one_by_one = acc
    for i in range(8):
        one_by_one = lse_key.lse_combine(one_by_one, lse_key.lse_key(lanes[:, i]))
    for mine, theirs in ((lse_key.lse_max(folded), lse_key.lse_max(one_by_one)),
                         (lse_key.lse_sum(folded), lse_key.lse_sum(one_by_one))):
        torch.testing.assert_close(mine, theirs, equal_nan=True, rtol=2e-6, atol=0)
    # acc[6] (-inf counted 3 times) folded with finite lanes keeps only the finite lanes' sum;
    # the lanes of row 0 (all -inf) count as 8 elements of -inf in the sum
    assert lse_key.lse_sum(lse_key.fold_lanes(acc[6:7], lanes[6:7])).isfinite().all()
    assert lse_key.lse_sum(lse_key.fold_lanes(acc[6:7], lanes[0:1])).isnan().all()


def test_the_fold_is_left_to_keys_it_does_not_own():
    """A loop whose running key another statement also reads keeps its per-element combines:
    the pass matches its pattern exactly (here: the key's lane loop with a statement after the
    combine)."""
    x = torch.randn(4, 256).bfloat16()
    fd = logsumexp_fd(x)
    fd.execute([x], options=INTERPRET)
    (fk,) = fd.kernels(last_run=True)
    (fold,) = folds(fd)
    loop = K.ForLoop(K.Var("q", "index"), K.Const(0), K.Const(8), K.Const(1),
                     [K.Allocate(fold.lanes[0].buffer)], unroll=True)
    assert lse_lanes._fold(loop) is None


def test_the_kernel_compiles_without_spills():
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.explain import explain_fusion
    x = torch.empty(4096, 128256, dtype=torch.bfloat16, device="meta")
    plan = explain_fusion(logsumexp_fd(x).fusion, [x], device="h200", compile=True)
    (k,) = plan.kernels
    assert "pf::lse_fold_lanes(" in k.kernel.source
    assert "0 B stack, 0 B spill stores" in k.ptxas, k.ptxas


def test_a_looped_row_folds_its_unchecked_copy_and_keeps_the_checked_one():
    """The looped softmax over a long fp32 row: the first pass combines keys, its steps
    unswitched. The unchecked copy folds the lanes it reads (the lanes' loop gone: the fold
    stands for it in the verifier's loop nests); the checked copy, its combines predicated
    lane by lane, keeps them. The verifier runs after every pass."""
    from pyfuser import catalogue
    from pyfuser import options as opts
    from pyfuser.runtime.explain import explain_fusion
    fd = catalogue.define("softmax", "fp32")
    x = [torch.empty(2, 1 << 20, device="meta")]
    with opts.override({"enable": ["verify_kernel_ir"], "disable": ["reference_fallback"]}):
        plan = explain_fusion(fd.fusion, x, device="h100", compile=False)
    (k,) = plan.kernels
    body = k.kernel.kernel.body
    found = [s for s in K.walk(body) if isinstance(s, K.LseFoldLanes)]
    assert len(found) == 1 and found[0].loop is not None and len(found[0].lanes) == 4
    keys = [s for s in K.walk(body) if isinstance(s, K.TensorOp)
            and getattr(s.expr, "op", None) == lse_lanes.UnaryOpType.LseKey]
    assert len(keys) == 1        # the checked copy's
