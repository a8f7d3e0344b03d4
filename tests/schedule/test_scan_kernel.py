"""The block-scan kernel (schedulers/scan.py, lower/scans.py, scan.cuh) on the kernel-IR
interpreter against float64: odd row lengths, several rows, rows split over a cluster, the
element-wise ops fused before and after, cumprod, int64 results of integer inputs; what is left
to the library op and why; NVRTC compiles of the generated CUDA for sm_90a with the ptxas report
checked; explain of the issue's bar shape. Each of these ran as a library op (torch) before the
scan kernel existed."""
import math

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.exprs import ScanOp
from pyfuser.kir import nodes as K
from pyfuser.kir.printer import kernel_str
from pyfuser.testing import TOLERANCE, rel_error, run_and_check

INTERPRET = {"enable": ["interpret"]}


def scan_tolerance(dtype: torch.dtype, n: int) -> float:
    """||out - ref|| / ||ref|| allowed for a scan of rows of n: the dtype's bar, growing with
    sqrt(n / 4096) (float32 running sums of n terms round n times; the block scan's order is
    not torch's)."""
    tol = TOLERANCE[{torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
                     torch.float16: DataType.Half, torch.float64: DataType.Double}[dtype]]
    return tol * max(1.0, math.sqrt(n / 4096))


def _cumsum_fd(x, dim=-1, op="cumsum"):
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), dim))
    return fd


@pytest.mark.parametrize("m, n", [(3, 2), (5, 7), (3, 33), (4, 1000), (2, 4097), (3, 20000),
                                  (2, 50001)])
def test_cumsum_rows_of_odd_lengths(m, n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(m, n, generator=gen)
    fd = _cumsum_fd(x)
    out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
    want = torch.cumsum(x.double(), 1)
    assert rel_error(out, want) <= scan_tolerance(torch.float32, n)
    p = fd.last_run.heuristics[0]
    assert p.row_extent == n and p.bdimx % 32 == 0
    # Rows longer than one block holds (16384 fp32) are split over a cluster or chained blocks
    # (shorter ones over a cluster too when the rows leave SMs idle: the interpreter's device
    # has 4).
    assert p.cluster > 1 or p.chain > 1 or n <= 16384, p


def test_one_row_of_one_dim_and_rows_of_three_dims():
    x = torch.randn(5000)
    run_and_check(_cumsum_fd(x), [x], scheduler="scan", options=INTERPRET)
    y = torch.randn(2, 3, 77)
    run_and_check(_cumsum_fd(y, 2), [y], scheduler="scan", options=INTERPRET)


def test_cumprod():
    gen = torch.Generator().manual_seed(0)
    x = 1 + 0.05 * torch.randn(6, 999, generator=gen)
    run_and_check(_cumsum_fd(x, op="cumprod"), [x], scheduler="scan", options=INTERPRET)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_inputs_give_int64_running_sums(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randint(-50, 50, (4, 3001), generator=gen).to(dtype) if dtype != torch.bool
         else torch.rand(4, 3001, generator=gen) > 0.5)
    fd = _cumsum_fd(x)
    out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
    assert out.dtype == torch.int64
    assert torch.equal(out, torch.cumsum(x, 1))


def test_int64_sums_past_int32():
    x = torch.full((2, 5000), 2 ** 31, dtype=torch.int64)
    fd = _cumsum_fd(x)
    out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
    assert torch.equal(out, torch.cumsum(x, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_scans_run_in_float32(dtype):
    x = torch.randn(3, 2048).to(dtype)
    fd = _cumsum_fd(x)
    assert [e.outputs[0].dtype for e in fd.fusion.exprs() if isinstance(e, ScanOp)] == \
        [DataType.Float]
    out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
    assert out.dtype == dtype


def test_top_p_mask_fused_after_the_scan():
    """probabilities (exp of a shift, normalized by a given sum) -> running sums -> the mask
    and the masked probabilities: one scan kernel."""
    x = torch.randn(16, 1000)
    total = torch.exp(x - 1).sum(1, keepdim=True)
    with FusionDefinition() as fd:
        tx, ts = fd.from_pytorch(x), fd.from_pytorch(total)
        p = fd.ops.div(fd.ops.exp(fd.ops.sub(tx, 1.0)), ts)
        c = fd.ops.cumsum(p, 1)
        keep = fd.ops.lt(fd.ops.sub(c, p), 0.9)
        fd.add_output(keep)
        fd.add_output(fd.ops.where(keep, p, 0.0))
    run_and_check(fd, [x, total], scheduler="scan", options=INTERPRET)


def test_input_read_on_both_sides_of_the_scan():
    """x + cumsum(x): x stays in registers across the block scan (inlining's rule for scans,
    as for reductions), the output reads it after the prefix."""
    x = torch.randn(4, 3333)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(tx, fd.ops.cumsum(fd.ops.mul(tx, 2.0), 1)))
    run_and_check(fd, [x], scheduler="scan", options=INTERPRET)


def test_two_scans_chained_and_a_broadcast_input():
    x = torch.randn(3, 513)
    w = torch.randn(513)
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        s = fd.ops.cumsum(fd.ops.mul(tx, fd.ops.broadcast(tw, [True, False])), 1)
        fd.add_output(s)
        fd.add_output(fd.ops.cumsum(s, 1))
    run_and_check(fd, [x, w], scheduler="scan", options=INTERPRET)


def test_a_scan_along_a_dim_strided_in_memory_is_the_library_op():
    """dim 0 of [M, N] (a column scan is not built), and the innermost logical dim of a
    transposed view: the scan runs as the library op, a segment of its own, and says why."""
    x = torch.randn(37, 53)
    fd = _cumsum_fd(x, 0)
    run_and_check(fd, [x], kernels=0, options=INTERPRET, segments=(("library", "scan"),))
    (seg,) = fd.last_run.segments
    assert "a scan along dim 0 of 2" in seg.why, seg.why
    xt = torch.randn(53, 37).t()
    fd = _cumsum_fd(xt, 1)
    run_and_check(fd, [xt], kernels=0, options=INTERPRET, segments=(("library", "scan"),))
    assert "not laid out along the scanned dim" in fd.last_run.segments[0].why
    plan = fd.explain([xt], device="h100")
    assert "T1 = cumsum(T0, dim=1) by torch.cumsum" in str(plan), str(plan)


@pytest.mark.parametrize("shape, op, dtype, threads", [
    ((1, 140000), "cumsum", torch.float32, 512),     # 18 blocks of 8192 (512 threads x 16)
    ((3, 300001), "cumsum", torch.float32, 512),     # 37 blocks, the last one short
    ((2, 70001), "cumprod", torch.float64, 1024),    # 8-byte: 9 full blocks (over a cluster)
    ((2, 140000), "cumsum", torch.int32, 512),       # int64 running sums
])
def test_rows_longer_than_a_block_holds_chain_their_blocks(shape, op, dtype, threads):
    """Rows of 4-byte inputs two blocks long or more (enough rows: the interpreter's device has
    4 SMs) are split over 512-thread blocks along blockIdx.y that chain their prefixes through
    global memory; others over a cluster, or over full chained blocks when longer than a cluster
    of 8 (the H100 table's portable size) holds: one kernel, no library op."""
    gen = torch.Generator().manual_seed(shape[1])
    if dtype.is_floating_point:
        x = torch.randn(*shape, generator=gen, dtype=dtype)
        if op == "cumprod":
            x = 1 + x / 1e5          # products that neither vanish nor overflow
    else:
        x = torch.randint(-1000, 1000, shape, generator=gen, dtype=dtype)
    fd = _cumsum_fd(x, op=op)
    out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
    want = getattr(torch, op)(x.double() if dtype.is_floating_point else x.long(), 1)
    if dtype.is_floating_point:
        assert rel_error(out, want) <= scan_tolerance(dtype, shape[1])
    else:
        assert torch.equal(out, want)
    p = fd.last_run.heuristics[0]
    per_thread = 64 // (8 if op == "cumprod" or not dtype.is_floating_point else 4)
    assert (p.cluster, p.chain) == (1, -(-shape[1] // (threads * per_thread))), p
    assert p.bdimx <= threads and fd.last_run.clusters[0] is None
    assert "chain their totals through global memory" in p.reason, p.reason


def _lowered_kernel(fd, inputs):
    plan = fd.explain(inputs, device="h100", compile=False)
    (k,) = plan.kernels
    return k.kernel.kernel


def test_kernel_ir_holds_the_thread_scan_block_scan_and_fixup():
    x = torch.empty(8, 1000, device="meta")
    kernel = _lowered_kernel(_cumsum_fd(x), [x])
    stmts = list(K.walk(kernel.body))
    scans = [s for s in stmts if isinstance(s, K.BlockScan)]
    assert len(scans) == 1 and scans[0].op == "sum" and scans[0].cluster is None
    steps = [s for s in stmts if isinstance(s, K.TensorOp) and s.carry is not None]
    assert [s.scan_fixup for s in steps] == [False, True]
    assert any(isinstance(s, K.ForLoop) and s.label == K.SCAN_FIXUP for s in stmts)


@pytest.mark.parametrize("shape, op, dtype", [
    ((64, 128256), "cumsum", torch.float32),     # the bar: a cluster of 8 per row
    ((4097, 7), "cumsum", torch.float32),
    ((8, 4097), "cumprod", torch.float32),
    ((8, 1000), "cumsum", torch.bfloat16),
    ((8, 1000), "cumsum", torch.int32),           # int64 shuffles and sums
    ((8, 30000), "cumprod", torch.float64),       # 8-byte cluster slots
    ((4, 300001), "cumsum", torch.float32),       # 19 blocks chained through global memory
    ((4, 100000), "cumprod", torch.float64),      # 8-byte chained prefixes
])
def test_generated_cuda_compiles_for_sm90a(shape, op, dtype):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.codegen.cuda import generate_cuda
    from pyfuser.runtime.nvrtc import compile_to_cubin
    x = torch.empty(*shape, dtype=dtype, device="meta")
    kernel = _lowered_kernel(_cumsum_fd(x, op=op), [x])
    src = generate_cuda(kernel)
    assert "pf::block_exclusive_scan_x(" in src
    assert ("pf::cluster_exclusive_scan_row<" in src) == (kernel.launch.cluster is not None)
    chained = any(s.chain is not None for s in K.walk(kernel.body) if isinstance(s, K.BlockScan))
    assert ("pf::chained_exclusive_scan_row(" in src) == chained
    assert chained == (shape[1] > 16384 and kernel.launch.cluster is None), shape
    mod = compile_to_cubin(src, kernel.name, arch="sm_90a")
    rep = mod.ptxas
    assert rep.function == mod.entry_name
    assert (rep.spill_store_bytes, rep.spill_load_bytes) == (0, 0), rep.summary()
    assert rep.stack_frame_bytes == 0, rep.summary()
    assert rep.warnings == (), rep.warnings
    assert 0 < rep.registers <= 64, rep.summary()   # 1024-thread blocks: 64 registers at most


def test_explain_of_the_bar_shape():
    """cumsum over rows of [64, 128256] fp32 on the H100 table: one scan kernel, each row over
    16 chained blocks of 512 threads (16 elements each), grid (64, 16)."""
    x = torch.empty(64, 128256, device="meta")
    plan = _cumsum_fd(x).explain([x], device="h100", compile=False)
    assert [(s.kind, s.name) for s in plan.segments] == [("kernel", "scan")]
    (k,) = plan.kernels
    p = k.kernel.params
    assert (p.cluster, p.chain, p.bdimx, p.per_thread * p.vector, p.vector) == \
        (1, 16, 512, 16, 4), p
    assert tuple(k.grid) == (64, 16, 1) and tuple(k.block) == (512, 1, 1), (k.grid, k.block)
    assert "split over 16 blocks along blockIdx.y" in str(plan)


def test_one_row_per_block_is_staged_through_shared_memory():
    """A row per block: its input and output pass through shared memory, the global side
    warp-striped (consecutive threads at consecutive vectors), the register side blocked."""
    x = torch.empty(64, 4096, device="meta")
    plan = _cumsum_fd(x).explain([x], device="h100", compile=False)
    (k,) = plan.kernels
    assert k.kernel.params.staged and k.kernel.params.bdimy == 1
    kernel = k.kernel.kernel
    shared = [s.buffer for s in K.walk(kernel.body)
              if isinstance(s, K.Allocate) and s.buffer.memory == "shared"]
    assert len(shared) == 2, shared
    text = kernel_str(kernel)
    # The global load: p outer, threadIdx.x inner (striped); the shared read: threadIdx.x
    # outer (blocked).
    bx = k.kernel.params.bdimx
    loads = [ln for ln in text.splitlines() if "LoadStoreOp(T0[" in ln]
    assert len(loads) == 1 and f" * {bx}) + threadIdx.x) * 4)))]<4>" in loads[0], loads
    gen = torch.Generator().manual_seed(2)
    for shape in [(3, 4096), (2, 20000), (1, 4097), (5, 16384)]:
        y = torch.randn(*shape, generator=gen)
        fd = _cumsum_fd(y)
        out, = run_and_check(fd, [y], scheduler="scan", options=INTERPRET)
        assert fd.last_run.heuristics[0].staged
        assert rel_error(out, torch.cumsum(y.double(), 1)) <= scan_tolerance(torch.float32,
                                                                              shape[1])


def test_threads_past_a_shorter_loop_do_not_read_past_a_shared_buffer():
    """CPU fuzz 4242:237 (the staged scan): a row of 9023 over a cluster of 4, blocks of 160
    threads, the blocked loop 141 threads long; the threads past 141 read the shared input at
    (tidx * 16 + p), past its 2400 elements, until shared reads took their thread guards
    (lower/index.py)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9023, generator=gen)
    w = torch.tensor([1.25], dtype=torch.float16)
    with FusionDefinition() as fd:
        tx, tw = fd.from_pytorch(x), fd.define_tensor(shape=[1], contiguity=[None],
                                                     dtype=DataType.Half)
        s = fd.ops.cumsum(fd.ops.mul(tx, fd.ops.expand(tw, [9023])), -1)
        fd.add_output(fd.ops.mul(fd.ops.sub(s, 0.5), 0.125))
    run_and_check(fd, [x, w], scheduler="scan", options=INTERPRET)
    p = fd.last_run.heuristics[0]
    assert (p.staged, p.cluster, p.bdimx) == (True, 4, 160), p


def test_an_input_read_element_wise_is_not_staged():
    """GPU fuzz 20261711:248: of two row inputs, the second's data pointer is not 16-byte
    aligned, so the heuristic reads only the first with vectors; staging the second too gave
    its shared copy the vector width, and the launch refused the misaligned pointer."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 2360, generator=gen).bfloat16()
    y = torch.randn(2 * 2360 + 1, generator=gen).bfloat16()[1:].view(2, 2360)
    with FusionDefinition() as fd:
        s = fd.ops.add(fd.ops.cast(fd.from_pytorch(x), "float32"),
                       fd.ops.cast(fd.from_pytorch(y), "float32"))
        fd.add_output(fd.ops.cumsum(s, 1))
    run_and_check(fd, [x, y], scheduler="scan", options=INTERPRET)
    p = fd.last_run.heuristics[0]
    assert p.staged and p.vector_inputs == (0,), p


def test_rows_stacked_along_y_are_staged_per_row():
    """Short rows, several to a block: each staged shared buffer holds every row of the block
    (computed in the block's loop alone), and the rows past the tensor's end change nothing."""
    gen = torch.Generator().manual_seed(5)
    for shape in [(3, 1000), (9, 100), (37, 33), (5, 256)]:
        x = torch.randn(*shape, generator=gen)
        fd = _cumsum_fd(x)
        out, = run_and_check(fd, [x], scheduler="scan", options=INTERPRET)
        p = fd.last_run.heuristics[0]
        assert p.staged and p.bdimy > 1, p
    x = torch.empty(8192, 1000, device="meta")
    plan = _cumsum_fd(x).explain([x], device="h100", compile=False)
    (k,) = plan.kernels
    p = k.kernel.params
    shared = [s.buffer for s in K.walk(k.kernel.kernel.body)
              if isinstance(s, K.Allocate) and s.buffer.memory == "shared"]
    assert p.bdimy > 1 and all(b.size.value >= p.bdimy * 1000 for b in shared), (p, shared)


def test_chunked_row_shape():
    """base.chunked_row_shape, the scan and top-k schedulers' thread shape: chunks of at most
    P vectors while the threads suffice, the thread loop in whole warps, rows stacked along y
    up to the block's thread budget."""
    from pyfuser.schedule.schedulers.base import chunked_row_shape
    assert chunked_row_shape(32064, 4, 1024, 1, 256) == (32, 1024, 1)   # 128256 fp32 in one block
    assert chunked_row_shape(250, 4, 1024, 8192, 256) == (4, 64, 4)     # [8192, 1000] fp32
    assert chunked_row_shape(2255, 4, 1024, 5, 256) == (4, 576, 1)      # 141 x 16 vectors
    assert chunked_row_shape(7, 4, 1024, 3, 256) == (4, 32, 2)          # rows up to the rows


@pytest.mark.parametrize("n", [6853, 3001])
def test_an_input_read_beside_the_scan_and_after_it(n):
    """Fuzz 20263014:64: lt(b, x) beside where(b, cumsum(silu(x)), ...). b's cache, inlined
    into both uses, put the where in the loop nest of lt, which is also the scan's own (lt reads
    x, the scan's input): the where read the scan before the block scan added each thread's
    prefix, wrong from the second thread's chunk on. The use of the scan's result now reads its
    own copy of b."""
    g = torch.Generator().manual_seed(64)
    x = torch.randint(-3, 6, (8, n), generator=g, dtype=torch.int32)
    b = torch.rand(8, n, generator=g) < 0.5
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.Int32)
        tb = fd.define_tensor([-1, -1], dtype=DataType.Bool)
        s = fd.ops.cumsum(fd.ops.silu(tx), 1)
        fd.add_output(fd.ops.lt(tb, tx))
        fd.add_output(fd.ops.where(tb, s, fd.ops.mul(fd.ops.add(s, 1.5), 0.25)))
    outs = fd.execute([x, b], options=INTERPRET)
    assert fd.last_run.schedulers == ("scan",), fd.last_run
    ref = torch.cumsum(torch.nn.functional.silu(x.double()), 1)
    ref = torch.where(b, ref, (ref + 1.5) * 0.25)
    assert torch.equal(outs[0], b.int() < x)
    assert rel_error(outs[1], ref) < scan_tolerance(torch.float32, n), rel_error(outs[1], ref)
