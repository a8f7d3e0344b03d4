"""cumsum and cumprod on the GPU: the block-scan kernel (schedulers/scan.py), rows in one block
rows over a thread-block cluster (the bar's [64, 128256] fp32) and longer rows chained across
blocks through global memory, element-wise ops fused
around the scan, int64 sums of integer inputs, and the library op where no kernel takes the
scan. Outputs poisoned (run_and_check); floating results against float64 with a tolerance that
grows with the row length; what ran is asserted (the scan scheduler, no fallback)."""
import math

import pytest
import torch

from pyfuser import FusionDefinition
from pyfuser.testing import rel_error, run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _tol(n: int) -> float:
    # float32's bar (1e-4), growing with sqrt(n / 4096): running sums of n terms, in the block
    # scan's order rather than torch's.
    return 1e-4 * max(1.0, math.sqrt(n / 4096))


def _scan_fd(x, op="cumsum", dim=-1):
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), dim))
    return fd


@pytest.mark.parametrize("m, n", [(64, 128256), (4, 1), (5, 7), (300, 33), (8, 1000),
                                  (3, 4097), (16, 16384), (2, 20000), (1, 131072)])
def test_cumsum_rows(m, n):
    x = torch.randn(m, n, device="cuda")
    fd = _scan_fd(x)
    out, = run_and_check(fd, [x], scheduler="scan" if n > 1 else "pointwise")
    assert rel_error(out, torch.cumsum(x.double(), 1)) <= _tol(n)
    if n > 16384:
        # Longer than one block holds: a cluster along blockIdx.y, or (64 rows of 128256, 4-byte
        # inputs) 512-thread blocks chained through global memory.
        p = fd.last_run.heuristics[0]
        assert (fd.last_run.clusters[0] is not None) == (p.cluster > 1) and (
            p.cluster > 1 or p.chain > 1), fd.last_run


def test_the_bar_shape_runs_on_16_chained_blocks_a_row():
    x = torch.randn(64, 128256, device="cuda")
    fd = _scan_fd(x)
    run_and_check(fd, [x], scheduler="scan")
    (p,) = fd.last_run.heuristics
    assert (p.cluster, p.chain, p.bdimx) == (1, 16, 512), p
    # bf16 rows of the same length keep the cluster of 8 (schedulers/scan.py's CHAIN_SPLIT_ROWS rule).
    y = x.bfloat16()
    fd = _scan_fd(y)
    run_and_check(fd, [y], scheduler="scan")
    (p,) = fd.last_run.heuristics
    assert (p.cluster, p.chain, p.bdimx) == (8, 1, 1024), p


@pytest.mark.parametrize("shape, dtype", [
    ((64, 1 << 20), torch.float32),        # 64 blocks a row, 4096 in all (30 waves of the H100)
    ((3, 300001), torch.float32),          # the last block of each row short
    ((256, 200000), torch.float32),
    ((8, 2000001), torch.bfloat16),
    ((1, 50_000_000), torch.float32),      # 3052 blocks along one row
])
def test_rows_longer_than_a_cluster_holds_chain_their_blocks(shape, dtype):
    """Rows over 8 blocks: blocks along blockIdx.y chain their prefixes through global memory,
    one kernel; a second launch (the flags left zeroed) is right too."""
    for seed in (0, 1):
        torch.manual_seed(seed)
        x = torch.randn(*shape, device="cuda").to(dtype)
        fd = _scan_fd(x)
        out, = run_and_check(fd, [x], scheduler="scan")
        # bf16: the output's rounding (2^-9 relative at most) dominates.
        tol = _tol(shape[1]) if dtype == torch.float32 else 4e-3
        assert rel_error(out.double(), torch.cumsum(x.double(), 1)) <= tol
        (p,) = fd.last_run.heuristics
        assert p.chain > 1 and p.cluster == 1, p
        del x, out


def test_chained_scan_replayed_in_a_cuda_graph():
    """The look-back's flags are tagged with the launch (%gridid), never reset: replays of a
    captured graph, each on new data, must each see only their own launch's flags."""
    x = torch.randn(8, 400000, device="cuda")
    fd = _scan_fd(x)
    run_and_check(fd, [x], scheduler="scan")
    assert fd.last_run.heuristics[0].chain > 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fd.execute([x])                          # warm on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            out, = fd.execute([x])
    torch.cuda.current_stream().wait_stream(stream)
    for seed in range(4):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x) + seed)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(out, torch.cumsum(x.double(), 1)) <= _tol(x.shape[1]), seed


def test_chained_cumprod_float64_and_exact_integer_sums():
    x = 1 + 1e-6 * torch.randn(4, 300000, device="cuda", dtype=torch.float64)
    out, = run_and_check(_scan_fd(x, "cumprod"), [x], scheduler="scan")
    y = torch.randint(-1000, 1000, (4, 500001), device="cuda", dtype=torch.int32)
    fd = _scan_fd(y)
    out, = run_and_check(fd, [y], scheduler="scan")
    assert torch.equal(out, torch.cumsum(y, 1)) and fd.last_run.heuristics[0].chain > 1


def test_cumprod_and_float64():
    x = 1 + 0.01 * torch.randn(32, 5000, device="cuda")
    run_and_check(_scan_fd(x, "cumprod"), [x], scheduler="scan")
    y = torch.randn(8, 30000, device="cuda", dtype=torch.float64)
    run_and_check(_scan_fd(y), [y], scheduler="scan")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_running_sums_are_int64_and_exact(dtype):
    x = (torch.randint(-1000, 1000, (16, 50000), device="cuda").to(dtype) if dtype != torch.bool
         else torch.rand(16, 50000, device="cuda") > 0.5)
    fd = _scan_fd(x)
    out, = run_and_check(fd, [x], scheduler="scan")
    assert out.dtype == torch.int64 and torch.equal(out, torch.cumsum(x, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_rows(dtype):
    x = torch.randn(64, 32000, device="cuda").to(dtype)
    out, = run_and_check(_scan_fd(x), [x], scheduler="scan")
    assert out.dtype == dtype


def test_top_p_mask_in_the_scan_kernel():
    """softmax's statistics (one logsumexp reduction), then the softmax, running sums, the
    mask and the masked probabilities in one scan kernel: the split's plan
    (schedule/split_normalizations.py) reads x twice where the segmenter's wrote the
    probabilities (an inner persistent kernel) for the scan to read."""
    x = torch.randn(64, 128256, device="cuda")
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        e = fd.ops.exp(fd.ops.sub(tx, fd.ops.max(tx, [1], keepdim=True)))
        p = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        keep = fd.ops.lt(fd.ops.sub(fd.ops.cumsum(p, 1), p), 0.9)
        fd.add_output(fd.ops.where(keep, p, 0.0))
    run_and_check(fd, [x], kernels=0, segments=(("kernel", "reduction"), ("kernel", "scan")))
    assert fd.last_run.reason.startswith("normalization split")


def test_a_strided_scan_is_the_library_op():
    x = torch.randn(1000, 64, device="cuda")
    fd = _scan_fd(x, dim=0)
    run_and_check(fd, [x], kernels=0, segments=(("library", "scan"),))
    assert "a scan along dim 0" in fd.last_run.segments[0].why
