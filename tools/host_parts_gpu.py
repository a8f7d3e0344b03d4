"""Where the host time of a cached call and of a new process's first call goes, on the GPU.

    PYTHONPATH=. python tools/host_parts_gpu.py [--name rmsnorm_fwd] [--shape 8x1024]

Times each step of the cached call path alone (microseconds per call, best of 5 loops of n,
GPU synchronized only at the end of a loop), a launch through cuda.bindings beside the same
launch through ctypes on libcuda, and in fresh interpreters (CUDA initialised first) the
import of each module the first call pulls in.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys


def per_call_us(fn, n: int = 5000) -> float:
    """Host microseconds per call (host_timing_gpu's loop: best of 5, synchronized per loop)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from host_timing_gpu import _per_call_us
    return _per_call_us(fn, n)


def cached_parts(name: str, M: int, N: int) -> None:
    import torch

    from pyfuser import catalogue
    from pyfuser import options as opts
    inputs = catalogue.make_inputs(name, M, N, "bf16", device="cuda", seed=0)
    fd = catalogue.define(name, "bf16")
    fd.execute(inputs)
    ex = fd._executor
    options = opts.current()
    key = ex._key(inputs, options)
    plan = ex._plans[key]
    lk = plan.loaded
    # The plan's values hold no pointers (each call patches its own copy): this call's.
    outs = plan.run(inputs)
    vals = list(plan.values)
    for pos, role, k in plan.ptr_slots:
        vals[pos] = (inputs[k] if role == "input" else outs[k]).data_ptr()
    packed = plan.layout.pack(vals)
    from pyfuser.runtime import launch as L
    stream = L.current_stream_handle(0)
    staging = lk._tls.staging
    args = staging.address
    stream_pointer = ctypes.c_void_p(stream or None)
    gx, gy, gz = plan.grid
    bx, by, bz = plan.block
    smem = plan.smem
    libcuda = ctypes.CDLL("libcuda.so.1")
    raw = libcuda.cuLaunchKernel
    raw.restype = ctypes.c_int
    raw.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn_ptr = int(lk.function)
    import cuda.bindings.driver as cu
    bound_function = cu.CUfunction(fn_ptr)
    out_specs = plan.out_specs
    x0 = inputs[0]
    tiny = torch.zeros(1, device="cuda")
    rows = {
        "fd.execute": lambda: fd.execute(inputs),
        "executor.run": lambda: ex.run(inputs),
        "executor._run": lambda: ex._run(inputs, options),
        "options.current()": opts.current,
        "executor._key": lambda: ex._key(inputs, options),
        "plan.run": lambda: plan.run(inputs),
        "empty_strided (each output)": lambda: [torch.empty_strided(s, st, dtype=d, device=plan.device) for s, st, d in out_specs],
        "data_ptr() x inputs": lambda: [x.data_ptr() for x in inputs],
        "layout.pack": lambda: plan.layout.pack(vals),
        "LoadedKernel.launch": lambda: lk.launch(plan.grid, plan.block, packed, shared_mem=smem),
        "cuda.bindings cuLaunchKernel": lambda: cu.cuLaunchKernel(bound_function, gx, gy, gz, bx, by, bz, smem, stream, args, 0),
        "ctypes cuLaunchKernel, typed": lambda: raw(fn_ptr, gx, gy, gz, bx, by, bz, smem, stream, args, None),
        "ctypes cuLaunchKernel, untyped (ours)": lambda: lk._launch_kernel(lk._function_pointer, gx, gy, gz, bx, by, bz, smem, stream_pointer, staging.kernel_params, None),
        "current stream handle": lambda: L.current_stream_handle(0),
        "x.shape, stride(), dtype, device": lambda: (x0.shape, x0.stride(), x0.dtype, x0.device),
        "one empty torch op": lambda: tiny.add_(0),
    }
    print(f"cached call parts, {name} bf16 {M}x{N}, {torch.cuda.get_device_name()} (us per call):")
    for k, fn in rows.items():
        print(f"  {k:36s} {per_call_us(fn):7.2f}")
    print(f"  status of a ctypes launch: {raw(fn_ptr, gx, gy, gz, bx, by, bz, smem, stream, args, None)}")


IMPORT_PROBE = r"""
import time, json, sys
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
spent = {}
def t(label, f):
    s = time.perf_counter(); r = f(); spent[label] = round((time.perf_counter() - s) * 1e3, 2); return r
for label in sys.argv[1:]:
    t(label, lambda: exec(label, {}))
print(json.dumps(spent))
"""


def import_parts() -> None:
    probes = [
        ["import cuda.bindings.driver", "import cuda.pathfinder",
         "import cuda.bindings.nvrtc", "import pyfuser", "import pyfuser.runtime.executor"],
        ["import pyfuser", "import pyfuser.runtime.executor", "import cuda.bindings.driver"],
        ["import cuda.pathfinder", "import cuda.bindings.driver"],
        ["import ctypes; ctypes.CDLL('libcuda.so.1')"],
    ]
    print("imports in a fresh interpreter after CUDA init (ms, 3 processes each, best):")
    for probe in probes:
        runs = []
        for _ in range(3):
            done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, *probe],
                                  capture_output=True, text=True)
            if done.returncode:
                print(done.stderr[-2000:])
                break
            runs.append(json.loads(done.stdout.splitlines()[-1]))
        if runs:
            print("  " + "; ".join(f"{k}: {min(r[k] for r in runs):.1f}" for k in probe))
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import torch; torch.cuda.init(); import pyfuser.runtime.executor, "
                           "pyfuser.runtime.launch, pyfuser.runtime.kernel_cache"],
                          capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            parts = line.split("|")
            try:
                rows.append((int(parts[1]), parts[2].rstrip()))
            except ValueError:
                pass
    print("largest cumulative imports after torch (us):")
    seen = 0
    for cum, mod in sorted(rows, reverse=True):
        if "torch" in mod or mod.strip() in ("encodings",):
            continue
        print(f"  {cum:8d} {mod}")
        seen += 1
        if seen >= 40:
            break


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="rmsnorm_fwd")
    ap.add_argument("--shape", default="8x1024")
    a = ap.parse_args()
    M, N = (int(v) for v in a.shape.split("x"))
    cached_parts(a.name, M, N)
    import_parts()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
