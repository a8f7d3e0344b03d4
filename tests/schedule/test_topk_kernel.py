"""The block top-k kernel (schedulers/topk.py, lower/topk.py, topk.cuh) on the kernel-IR
interpreter: odd row lengths, several rows and ranks, 16-bit and int32 values, largest and
smallest, ties (lowest index first), NaN, infinities and signed zeros, element-wise ops fused
before and after; what is left to torch.topk and why; NVRTC compiles of the generated CUDA for
sm_90a with the ptxas report checked. Each of these ran as a library op (torch.topk) before."""
import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.kir import nodes as K
from pyfuser.runtime.arg_key import topk_in_order
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


def _topk_fd(x, k, dim=-1, largest=True):
    with FusionDefinition() as fd:
        values, indices = fd.ops.topk(fd.from_pytorch(x), k, dim, largest)
        fd.add_output(values)
        fd.add_output(indices)
    return fd


def _check_exact(out, x, k, dim=-1, largest=True):
    """Values and indices equal to the stable order's, and to torch.topk's values."""
    want_v, want_i = topk_in_order(x, k, dim % x.dim(), largest)
    assert torch.allclose(out[0], want_v, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(out[1], want_i)
    if not x.is_floating_point() or not x.isnan().any():
        t = torch.topk(x, k, dim, largest=largest)
        assert torch.equal(out[0], t.values)


@pytest.mark.parametrize("m, n, k", [(5, 37, 4), (3, 1000, 8), (7, 64, 2), (2, 16384, 50),
                                     (1, 5, 5), (4, 33, 33), (9, 257, 64)])
def test_rows_of_odd_lengths(m, n, k):
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(m, n, generator=gen)
    fd = _topk_fd(x, k)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    _check_exact(out, x, k)
    p = fd.last_run.heuristics[0]
    assert p.row_extent == n and p.bdimx % 32 == 0 and p.per_thread * p.vector <= 16, p


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("largest", [True, False])
def test_16_bit_and_int32_values_with_ties(dtype, largest):
    """Few distinct values, so most rows hold ties across the k-th place: the lowest index
    comes first, as arg_key.topk_in_order (torch.topk leaves ties unordered)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-6, 7, (6, 301), generator=gen).to(dtype)
    fd = _topk_fd(x, 20, largest=largest)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    _check_exact(out, x, 20, largest=largest)
    assert out[0].dtype == dtype and out[1].dtype == torch.int64


@pytest.mark.parametrize("largest", [True, False])
def test_nan_infinities_and_signed_zeros(largest):
    """NaN above every number (first for the largest, last for the smallest, as torch.topk);
    -0 equal to +0, so they keep index order; the chosen element's value is returned as it is
    (a -0 stays -0)."""
    row = [1.0, float("nan"), -0.0, 0.0, float("inf"), float("-inf"), 3.0, float("nan"), -0.0,
           -5.0, 2.0]
    x = torch.tensor([row, row[::-1], [0.0] * len(row)])
    k = len(row)
    fd = _topk_fd(x, k, largest=largest)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    want_v, want_i = topk_in_order(x, k, 1, largest)
    assert torch.equal(out[1], want_i)
    assert torch.equal(out[0].nan_to_num(7.0), want_v.nan_to_num(7.0))
    assert torch.equal(torch.signbit(out[0]), torch.signbit(want_v))


def test_three_dims_and_one_dim():
    x = torch.randn(2, 3, 77)
    out = run_and_check(_topk_fd(x, 6), [x], scheduler="topk", options=INTERPRET)
    _check_exact(out, x, 6)
    y = torch.randn(500)
    out = run_and_check(_topk_fd(y, 9, largest=False), [y], scheduler="topk", options=INTERPRET)
    _check_exact(out, y, 9, largest=False)


def test_router_ops_fused_before_and_after():
    """A mixture-of-experts router's element-wise part: sigmoid(logits) + a per-expert bias
    picks the experts; the outputs are the picked scores scaled, in bf16, and the expert ids
    as int32. One kernel."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(300, 64, generator=gen).bfloat16()
    bias = (0.1 * torch.randn(64, generator=gen)).float()
    with FusionDefinition() as fd:
        tl = fd.from_pytorch(logits)
        tb = fd.from_pytorch(bias)
        scores = fd.ops.sigmoid(fd.ops.cast(tl, "float32"))
        biased = fd.ops.add(scores, fd.ops.broadcast_in_dim(tb, [300, 64], [1]))
        values, indices = fd.ops.topk(biased, 8, 1)
        fd.add_output(fd.ops.cast(fd.ops.mul(values, 2.5), "bfloat16"))
        fd.add_output(fd.ops.cast(indices, "int32"))
    out = run_and_check(fd, [logits, bias], scheduler="topk", options=INTERPRET)
    want_i = topk_in_order(torch.sigmoid(logits.double()) + bias.double(), 8, 1, True)[1]
    assert torch.equal(out[1], want_i.int())


def test_row_output_beside_the_top_k():
    """The fusion also returns an element-wise result of the row, and the top-k of it."""
    x = torch.randn(40, 100)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        y = fd.ops.mul(tx, 3.0)
        fd.add_output(fd.ops.relu(y))
        values, indices = fd.ops.topk(y, 4, 1, False)
        fd.add_output(values)
        fd.add_output(indices)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    want_v, want_i = topk_in_order(x * 3.0, 4, 1, False)
    assert torch.equal(out[2], want_i)


def test_top_k_of_a_fusion_output():
    """The row the top-k reads is itself an output: one kernel (the output's register cache,
    cache_before, is the top-k's row), not a pointwise kernel writing the row and the top-k
    reading it again."""
    x = torch.randn(40, 100)
    with FusionDefinition() as fd:
        y = fd.ops.mul(fd.from_pytorch(x), 3.0)
        fd.add_output(y)
        values, indices = fd.ops.topk(y, 4, 1)
        fd.add_output(values)
        fd.add_output(indices)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    want_v, want_i = topk_in_order(x * 3.0, 4, 1, True)
    assert torch.equal(out[0], x * 3.0) and torch.equal(out[2], want_i)


@pytest.mark.parametrize("make, why", [
    (lambda: (torch.randn(37, 53), 5, 0), "a top-k along dim 0 of 2"),
    (lambda: (torch.randn(53, 37).t(), 5, 1), "not laid out along the top-k's dim"),
    (lambda: (torch.randn(3, 200), 65, 1), "k = 65 is more than 64"),
    (lambda: (torch.randn(2, 20000), 5, 1), "more than one block holds"),
    (lambda: (torch.randn(3, 50).double(), 5, 1), "float64 values"),
    (lambda: (torch.randperm(150).reshape(3, 50), 5, 1), "int64 values"),
    (lambda: (torch.randn(3, 1), 1, 1), "a dim the definition makes a broadcast"),
])
def test_what_is_left_to_torch_topk(make, why):
    """Each runs as the library op, a segment of its own, and says why. (Values without ties:
    torch.topk orders equal values as it likes, the kernel and the reference by index.)"""
    x, k, dim = make()
    fd = _topk_fd(x, k, dim)
    out = run_and_check(fd, [x], kernels=0, options=INTERPRET, segments=(("library", "topk"),))
    assert why in fd.last_run.segments[0].why, fd.last_run.segments[0].why
    assert torch.equal(out[0], torch.topk(x, k, dim).values)


def test_kernel_ir_holds_one_block_top_k():
    x = torch.empty(64, 1000, device="meta")
    plan = _topk_fd(x, 8).explain([x], device="h100", compile=False)
    (k,) = plan.kernels
    stmts = list(K.walk(k.kernel.kernel.body))
    tops = [s for s in stmts if isinstance(s, K.BlockTopK)]
    assert len(tops) == 1 and tops[0].k == 8 and tops[0].largest
    assert not any(isinstance(s, K.TensorOp) and type(s.expr).__name__ == "TopKOp"
                   for s in stmts)


@pytest.mark.parametrize("shape, k, dtype, largest", [
    ((16384, 256), 8, torch.bfloat16, True),     # a router's experts: a warp per row
    ((8, 16384), 50, torch.float32, True),        # 1024 threads of 16
    ((64, 4096), 64, torch.float16, False),
    ((100, 1000), 5, torch.int32, True),
    ((10, 37), 3, torch.float32, False),
])
def test_generated_cuda_compiles_for_sm90a(shape, k, dtype, largest):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.codegen.cuda import generate_cuda
    from pyfuser.runtime.nvrtc import compile_to_cubin
    x = torch.empty(*shape, dtype=dtype, device="meta")
    plan = _topk_fd(x, k, largest=largest).explain([x], device="h100", compile=False)
    (kk,) = plan.kernels
    kernel = kk.kernel.kernel
    src = generate_cuda(kernel)
    assert "pf::block_topk_x<" in src
    mod = compile_to_cubin(src, kernel.name, arch="sm_90a")
    rep = mod.ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes) == (0, 0), rep.summary()
    assert rep.stack_frame_bytes == 0, rep.summary()
    assert rep.warnings == (), rep.warnings
    threads = kernel.launch.max_threads
    assert 0 < rep.registers <= 65536 // threads, rep.summary()


def test_k_1_is_a_broadcast_every_thread_holds():
    """torch's [.., 1] result of k = 1 broadcasts against the row: x - max(x) through the top-k,
    and its index, in one kernel."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randint(-5, 5, (13, 70), generator=gen).float()
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        values, indices = fd.ops.topk(tx, 1, 1)
        fd.add_output(fd.ops.sub(tx, values))
        fd.add_output(indices)
        fd.add_output(values)
    out = run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    want_v, want_i = topk_in_order(x, 1, 1, True)
    assert torch.equal(out[0], x - want_v) and torch.equal(out[1], want_i)


@pytest.mark.parametrize("m, n, k", [(5, 37, 4), (4 * 391, 13, 9), (3, 1000, 1)])
def test_the_block_topk_stands_for_its_loops_in_the_kernel_ir(m, n, k):
    """lower_topk's block top-k replaces the loops of its results: it records them, so the
    kernel IR passes the verifier after every pass (fuzz 20261123:20 failed there: 'lowering
    loop ... is never emitted', once the fuzzer verified)."""
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, n, generator=gen)
    fd = _topk_fd(x, k)
    out = run_and_check(fd, [x], scheduler="topk",
                        options={"enable": ["interpret", "verify_kernel_ir"]})
    _check_exact(out, x, k)
    assert not fd.last_run.internal_error, fd.last_run.internal_error
