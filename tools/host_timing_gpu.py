"""Host time of pyfuser's cached call and of a new process's first call, on the GPU machine.

    PYTHONPATH=. python tools/host_timing_gpu.py [--name rmsnorm_fwd] [--shape 8x1024]

1. Cached call: fd.execute on small inputs (the kernel takes a few microseconds, so the loop is
   bound by the host): microseconds per call, beside eager (the catalogue's torch reference),
   torch.compile of it and one empty torch op (x.add_(0) on a tiny tensor), same process.
   The GPU is synchronized only at the end of each timed loop, so host time is measured.
2. A new process: the time from FusionDefinition to the first execute's return, CUDA already
   initialised, in a fresh interpreter after a first process filled the disk cache
   (PYFUSER_CACHE_DIR): run as `--first-call` subprocesses.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _per_call_us(fn, n: int) -> float:
    import torch
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def first_call(name: str, M: int, N: int) -> dict:
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")
    from pyfuser import catalogue
    inputs = catalogue.make_inputs(name, M, N, "bf16", device="cuda", seed=0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    fd = catalogue.define(name, "bf16")
    fd.execute(inputs)
    torch.cuda.synchronize()
    return {"first_call_ms": (time.perf_counter() - t) * 1e3, "run": repr(fd.last_run)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="rmsnorm_fwd")
    ap.add_argument("--shape", default="8x1024")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    M, N = (int(v) for v in args.shape.split("x"))
    if args.first_call:
        print(json.dumps(first_call(args.name, M, N)))
        return 0

    import torch

    from pyfuser import catalogue
    entry = catalogue.get(args.name)
    inputs = catalogue.make_inputs(args.name, M, N, "bf16", device="cuda", seed=0)
    fd = catalogue.define(args.name, "bf16")
    fd.execute(inputs)
    eager = lambda: entry.torch_reference(inputs, 1e-6)  # noqa: E731
    compiled = torch.compile(eager)
    compiled()
    tiny = torch.zeros(1, device="cuda")
    rows = {
        "pyfuser fd.execute (cached)": _per_call_us(lambda: fd.execute(inputs), args.n),
        "eager (catalogue reference)": _per_call_us(eager, args.n),
        "torch.compile": _per_call_us(compiled, args.n),
        "one empty torch op (x.add_(0))": _per_call_us(lambda: tiny.add_(0), args.n),
    }
    print(f"host time per call, {args.name} bf16 {M}x{N}, {torch.cuda.get_device_name()}:")
    for k, v in rows.items():
        print(f"  {k:34s} {v:7.1f} us")
    print(f"  ran: {fd.last_run}")
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--first-call", "--name", args.name, "--shape", args.shape]
    fill = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                     check=True).stdout.splitlines()[-1])
    hits = [json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for _ in range(3)]
    print(f"first execute in a new process (CUDA initialised), disk cache at "
          f"{env.get('PYFUSER_CACHE_DIR', 'default')}:")
    print(f"  filling the cache: {fill['first_call_ms']:.1f} ms")
    times = ", ".join(f"{h['first_call_ms']:.1f}" for h in hits)
    print(f"  from the disk cache: {times} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
