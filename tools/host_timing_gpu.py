"""Host time of pyfuser's cached call and of a new process's first call, on the GPU machine.

    PYTHONPATH=. python tools/host_timing_gpu.py [--name rmsnorm_fwd] [--shape 8x1024]
    PYTHONPATH=. python tools/host_timing_gpu.py --name bench_issue16:batchnorm_fwd_nchw --shape -

1. Cached call: fd.execute on small inputs (the kernel takes a few microseconds, so the loop is
   bound by the host): microseconds per call, beside eager (the catalogue's torch reference,
   and F.rms_norm for rmsnorm_fwd), torch.compile of it and one empty torch op (x.add_(0) on
   a tiny tensor), same process, in --rounds interleaved rounds (ANCHORS.md's protocol; the
   median and the range printed). Two rows give the floor under pyfuser's call: its kernel's
   launch alone (the driver's cuLaunchKernel, values packed) and its output's allocation.
   The GPU is synchronized only at the end of each timed loop, so host time is measured.
   ANCHORS.md's bar is measured on one 4096-wide row: --shape 1x4096.
2. A new process: the time from FusionDefinition to the first execute's return, CUDA already
   initialised, in a fresh interpreter after a first process filled the disk cache
   (PYFUSER_CACHE_DIR, by default a temporary one): run as `--first-call` subprocesses, with
   `import pyfuser` timed apart, and the first execute split into the plan key, the disk
   read, loading the module on the device, and the rest (host planning).
   The subprocesses share a temporary bytecode cache (PYTHONPYCACHEPREFIX, with
   PYTHONDONTWRITEBYTECODE dropped) that the first, cache-filling process writes: an
   installed package has its bytecode, while a checkout without a writable __pycache__ would
   recompile every pyfuser module in every process (about 270 ms on the H100 machine), which
   is not the cost of a new process's call.
A bench case MODULE:FUNCTION of tools/ as --name (a segmented fusion such as BatchNorm) times
part 2 only, with the segmentation apart.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _per_call_us(fn, n: int, loops: int = 5) -> float:
    """Microseconds per call of `fn`: the best of `loops` loops of `n` calls, the GPU
    synchronized only around each loop (host time, not the kernels')."""
    import torch
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def _timed(module, name: str, spent: dict, label: str) -> None:
    """Wrap module.name to add its wall time (ms) to spent[label]."""
    real = getattr(module, name)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            spent[label] = spent.get(label, 0.0) + (time.perf_counter() - t) * 1e3
    setattr(module, name, wrapper)


def _bench_case(name: str):
    """(fd, inputs) of a bench case MODULE:FUNCTION of tools/ (e.g. bench_issue16:batchnorm_fwd_nchw)."""
    import importlib
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    module, function = name.split(":")
    fd, inputs, _, _ = getattr(importlib.import_module(module), function)("cuda")
    return fd, inputs


def first_call(name: str, M: int, N: int) -> dict:
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    import pyfuser  # noqa: F401
    from pyfuser import catalogue
    import_ms = (time.perf_counter() - t) * 1e3
    from pyfuser.runtime import executor, kernel_cache, launch
    spent: dict = {}
    _timed(kernel_cache, "plan_key", spent, "plan key")
    _timed(kernel_cache, "load_plan", spent, "disk read")
    _timed(launch, "load", spent, "module load")
    _timed(executor, "segment", spent, "segmentation")
    if ":" in name:
        # A bench case defines its fusion with its inputs: the definition is timed with the
        # inputs' creation on the GPU (a few ms more than the definition alone).
        t = time.perf_counter()
        fd, inputs = _bench_case(name)
    else:
        inputs = catalogue.make_inputs(name, M, N, "bf16", device="cuda", seed=0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        fd = catalogue.define(name, "bf16")
    t_define = time.perf_counter()
    fd.execute(inputs)
    torch.cuda.synchronize()
    t_end = time.perf_counter()
    execute_ms = (t_end - t_define) * 1e3
    parts = {"import pyfuser": import_ms, "define": (t_define - t) * 1e3,
             "execute": execute_ms, **spent,
             "execute, rest": execute_ms - sum(spent.values())}
    return {"first_call_ms": (t_end - t) * 1e3, "parts_ms": parts, "run": repr(fd.last_run),
            "kernels_from": sorted({k.compile_source for k in fd.kernels()})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="rmsnorm_fwd")
    ap.add_argument("--shape", default="8x1024")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5, help="new processes timed")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the cached call")
    ap.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    M, N = (int(v) for v in args.shape.split("x")) if args.shape != "-" else (0, 0)
    if args.first_call:
        print(json.dumps(first_call(args.name, M, N)))
        return 0
    if ":" in args.name:
        return new_processes(args)

    import statistics

    import torch
    import torch.nn.functional as F

    from pyfuser import catalogue
    entry = catalogue.get(args.name)
    inputs = catalogue.make_inputs(args.name, M, N, "bf16", device="cuda", seed=0)
    fd = catalogue.define(args.name, "bf16")
    fd.execute(inputs)
    fd.execute(inputs)
    eager = lambda: entry.torch_reference(inputs, 1e-6)  # noqa: E731
    compiled = torch.compile(eager)
    compiled()
    tiny = torch.zeros(1, device="cuda")
    calls = {
        "pyfuser fd.execute (cached)": lambda: fd.execute(inputs),
        "eager (catalogue reference)": eager,
        "torch.compile": compiled,
        "one empty torch op (x.add_(0))": lambda: tiny.add_(0),
    }
    if args.name == "rmsnorm_fwd":
        x, w = inputs[:2]
        calls["eager F.rms_norm"] = lambda: F.rms_norm(x, (N,), w, 1e-6)
    # The floor under pyfuser's call: its kernel's launch alone (the driver's cuLaunchKernel
    # through ctypes, values already packed) and its output's allocation.
    plan = fd._executor._guarded_plan
    if plan is not None and getattr(plan, "_launch_values", None) is not None:
        # The plan's values hold no pointers (each call patches its own copy): this call's.
        (size, stride, dtype), = plan.out_specs[:1]
        out = torch.empty_strided(size, stride, dtype=dtype, device=inputs[0].device)
        values, launch_values = list(plan.values), plan._launch_values
        for pos, k in plan._input_ptrs:
            values[pos] = inputs[k].data_ptr()
        for pos, _ in plan._output_ptrs:
            values[pos] = out.data_ptr()
        calls["  its kernel's launch alone"] = lambda: launch_values(values)
        calls["  its output's allocation alone"] = lambda: torch.empty_strided(
            size, stride, dtype=dtype, device=inputs[0].device)
    rounds = {k: [] for k in calls}
    for _ in range(args.rounds):            # interleaved rounds (ANCHORS.md), median of each
        for k, fn in calls.items():
            rounds[k].append(_per_call_us(fn, args.n))
    print(f"host time per call, {args.name} bf16 {M}x{N}, {torch.cuda.get_device_name()}, "
          f"{args.rounds} interleaved rounds (each the best of 5 loops of {args.n} calls), us:")
    for k, v in rounds.items():
        print(f"  {k:34s} median {statistics.median(v):6.2f}   min {min(v):6.2f}   max "
              f"{max(v):6.2f}")
    print(f"  ran: {fd.last_run.kind} {fd.last_run.schedulers}, guarded call: "
          f"{fd._executor.guarded_call is not None}")
    return new_processes(args)


def new_processes(args) -> int:
    """Part 2: a process filling the disk cache, then `args.runs` processes timed."""
    tmp = tempfile.TemporaryDirectory(prefix="pyfuser-host-")
    env = dict(os.environ, PYTHONPYCACHEPREFIX=os.path.join(tmp.name, "pycache"))
    env.setdefault("PYFUSER_CACHE_DIR", os.path.join(tmp.name, "kernels"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, __file__, "--first-call", "--name", args.name, "--shape", args.shape]

    def child():
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"--first-call failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.splitlines()[-1])

    fill = child()
    hits = [child() for _ in range(args.runs)]
    print(f"first execute in a new process (CUDA initialised), disk cache at "
          f"{env['PYFUSER_CACHE_DIR']}, bytecode warm:")
    print(f"  filling the cache: {fill['first_call_ms']:.1f} ms (kernels {fill['kernels_from']})")
    times = ", ".join(f"{h['first_call_ms']:.1f}" for h in hits)
    print(f"  from the disk cache (define + execute): {times} ms "
          f"(kernels {sorted({s for h in hits for s in h['kernels_from']})})")
    print("  parts, ms (best / median):")
    for part in hits[0]["parts_ms"]:
        vals = sorted(h["parts_ms"].get(part, 0.0) for h in hits)
        print(f"    {part:16s} {vals[0]:7.1f} {vals[len(vals) // 2]:7.1f}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
