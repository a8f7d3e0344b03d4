"""Time the kernel-IR interpreter (PYFUSER_ENABLE=interpret) on two fusions: a pointwise fusion
of 8 ops over 128 x 128 fp32 elements and the catalogue LayerNorm forward on 4 x 1024 fp32
(`--large`: also 2048 x 2048 and 1024 x 4096). The first call schedules, lowers and runs; the
time reported is the best of `--repeat` cached calls. Results:
bench/results/2026-11-23-interpreter-timings.md.

    PYTHONPATH=$PWD python tools/interpreter_timings.py [--repeat 5] [--large]
"""
from __future__ import annotations

import argparse
import time

import torch

from pyfuser import FusionDefinition, catalogue
from pyfuser.ir.dtype import DataType

ENABLE = {"enable": ["interpret"]}


def pointwise_8_ops() -> FusionDefinition:
    """8 ops: add, mul, neg, exp, add (of a scalar), div, tanh, maximum."""
    with FusionDefinition("pointwise8") as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, -1], dtype=DataType.Float)
        a = fd.ops.add(x, y)
        b = fd.ops.mul(a, x)
        c = fd.ops.exp(fd.ops.neg(b))
        d = fd.ops.div(a, fd.ops.add(c, 1.0))
        e = fd.ops.maximum(fd.ops.tanh(d), y)
        fd.add_output(e)
    return fd


def cases(large: bool = False):
    g = torch.Generator().manual_seed(0)
    for M, N in [(128, 128)] + ([(2048, 2048)] if large else []):
        yield (f"pointwise, 8 ops, fp32 {M} x {N}", pointwise_8_ops(),
               [torch.randn(M, N, generator=g), torch.randn(M, N, generator=g)])
    for M, N in [(4, 1024)] + ([(1024, 4096)] if large else []):
        yield (f"layernorm_fwd, fp32 {M} x {N}", catalogue.define("layernorm_fwd", "fp32"),
               catalogue.make_inputs("layernorm_fwd", M, N, "fp32", seed=0))


def time_case(fd, inputs, repeat: int) -> tuple[float, float, object]:
    t0 = time.perf_counter()
    fd.execute(inputs, options=ENABLE)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fd.execute(inputs, options=ENABLE)
        best = min(best, time.perf_counter() - t0)
    return first, best, fd.last_run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--large", action="store_true")
    args = ap.parse_args()
    for name, fd, inputs in cases(args.large):
        first, best, info = time_case(fd, inputs, args.repeat)
        print(f"{name}: first call {first * 1e3:.0f} ms, cached call {best * 1e3:.1f} ms "
              f"({info.kind}, backend {info.backend}, {info.heuristics})")


if __name__ == "__main__":
    main()
