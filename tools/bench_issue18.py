"""The bars of the issue on random numbers, fp8, index reductions and scans that pyfuser can run
today, same run as eager and torch.compile (GPU machine), or their plans on the CPU:

    PYTHONPATH=. python tools/bench_issue18.py [WORD..]   # GPU: times and GB/s (cases naming a word)
    PYTHONPATH=. python tools/bench_issue18.py --explain  # CPU: each fusion's plan (H100 table)

residual + dropout(x + bias, p=0.1) on [8192, 4096] bf16 with the mask written (the seed and
offset drawn from torch's CUDA generator on each call: the values differ from eager's by design,
the harness's difference note says so); argmax over rows of [8192, 128256] bf16; cumsum over
rows of [64, 128256] fp32 (a block-scan kernel, each row over a cluster of 8 blocks) and top-k
(k=50) of [64, 128256] bf16 (a library segment: torch); top-k of rows the block top-k kernel
holds (a router's 8 of 256 and 2 of 64 experts, 16 of 4096, 50 of 16384: no bar, measured
against torch.topk and torch.compile); fp8 e4m3 quantization of [8192, 8192]
bf16 (amax of the whole tensor, scale = 448 / amax, x * scale clamped to +-448 and cast, as
quantization recipes write it; amax out). GB/s count the inputs read and the outputs written
once (the floor); see
tools/bench_cases.py for the timing.
"""
from __future__ import annotations

import sys

import bench_cases
import torch

from pyfuser import DataType, FusionDefinition

BF16, F32 = DataType.BFloat16, DataType.Float


def _randn(shape, device, dtype=torch.bfloat16, seed=0):
    if device == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, device=device, dtype=dtype, generator=g)


def dropout(device):
    x, residual = _randn((8192, 4096), device), _randn((8192, 4096), device, seed=1)
    bias = _randn((4096,), device, seed=2)
    with FusionDefinition("bias_dropout_residual") as fd:
        tx, tr, tb = (fd.from_pytorch(t) for t in (x, residual, bias))
        h = fd.ops.cast(tx, F32) + fd.ops.broadcast(fd.ops.cast(tb, F32), [True, False])
        keep = fd.ops.lt(fd.ops.rand_like(h), 0.9)
        y = fd.ops.where(keep, h * (1 / 0.9), 0.0) + fd.ops.cast(tr, F32)
        fd.add_output(fd.ops.cast(y, BF16))
        fd.add_output(keep)

    def eager():
        h = x.float() + bias.float()
        keep = torch.rand_like(h) < 0.9
        return (torch.where(keep, h / 0.9, 0.0) + residual.float()).to(torch.bfloat16), keep
    return fd, [x, residual, bias], eager, 3 * x.numel() * 2 + x.numel()


def argmax_rows(device):
    x = _randn((8192, 128256), device)
    with FusionDefinition("argmax_rows") as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x), 1))

    def eager():
        return torch.argmax(x, 1)
    return fd, [x], eager, x.numel() * 2 + 8192 * 8


def _cumsum_case(shape, dtype=torch.float32):
    def case(device):
        x = _randn(shape, device, dtype=dtype)
        with FusionDefinition("cumsum") as fd:
            fd.add_output(fd.ops.cumsum(fd.from_pytorch(x), 1))

        def eager():
            return torch.cumsum(x, 1)
        return fd, [x], eager, 2 * x.numel() * x.element_size()
    return case


cumsum_rows = _cumsum_case((64, 128256))


def topk_rows(device):
    x = _randn((64, 128256), device)
    with FusionDefinition("topk") as fd:
        values, indices = fd.ops.topk(fd.from_pytorch(x), 50, 1)
        fd.add_output(values)
        fd.add_output(indices)

    def eager():
        return torch.topk(x, 50, 1)
    return fd, [x], eager, x.numel() * 2 + 64 * 50 * 10


def _topk_case(shape, k, dtype):
    def case(device):
        x = _randn(shape, device, dtype=dtype)
        with FusionDefinition("topk_kernel") as fd:
            values, indices = fd.ops.topk(fd.from_pytorch(x), k, 1)
            fd.add_output(values)
            fd.add_output(indices)

        def eager():
            return torch.topk(x, k, 1)
        rows = x.numel() // shape[-1]
        return fd, [x], eager, x.numel() * x.element_size() + rows * k * (x.element_size() + 8)
    return case


E4M3_MAX = 448.0


def fp8_quant(device):
    x = _randn((8192, 8192), device)
    with FusionDefinition("fp8_quant") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        amax = fd.ops.max(fd.ops.abs(xf))
        scaled = fd.ops.mul(xf, fd.ops.div(E4M3_MAX, amax))
        clamped = fd.ops.minimum(fd.ops.maximum(scaled, -E4M3_MAX), E4M3_MAX)
        fd.add_output(fd.ops.cast(clamped, DataType.Float8_e4m3fn))
        fd.add_output(amax)

    def eager():
        xf = x.float()
        amax = xf.abs().amax()
        y = (xf * (E4M3_MAX / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return y, amax
    # x read once and y written once (the floor; the plan reads x twice: amax, then the cast).
    return fd, [x], eager, x.numel() * (2 + 1) + 4


CASES = {
    "residual + dropout(x + bias) [8192,4096] bf16, mask out": dropout,
    "argmax rows [8192,128256] bf16": argmax_rows,
    "cumsum rows [64,128256] fp32 (scan kernel)": cumsum_rows,
    "cumsum rows [64,1048576] fp32 (chained scan)": _cumsum_case((64, 1 << 20)),
    "cumsum rows [4,16777216] fp32 (chained scan)": _cumsum_case((4, 1 << 24)),
    "cumsum rows [16,2000000] bf16 (chained scan)": _cumsum_case((16, 2000000), torch.bfloat16),
    "topk k=50 [64,128256] bf16 (library)": topk_rows,
    "topk k=8 [16384,256] bf16 (router, kernel)": _topk_case((16384, 256), 8, torch.bfloat16),
    "topk k=2 [65536,64] bf16 (router, kernel)": _topk_case((65536, 64), 2, torch.bfloat16),
    "topk k=16 [8192,4096] fp32 (kernel)": _topk_case((8192, 4096), 16, torch.float32),
    "topk k=50 [256,16384] bf16 (kernel)": _topk_case((256, 16384), 50, torch.bfloat16),
    "fp8 e4m3 quantization [8192,8192] bf16, amax out": fp8_quant,
}


if __name__ == "__main__":
    chosen = bench_cases.selected(CASES, sys.argv[1:])
    raise SystemExit(bench_cases.explain(chosen) if "--explain" in sys.argv
                     else bench_cases.bench(chosen))
