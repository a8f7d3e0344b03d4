"""The floor under a cached call on the GPU machine's host: the driver's launch of the call's
own kernel through ctypes (GIL released: CFUNCTYPE, what pyfuser uses; held: PYFUNCTYPE) and
through cuda.bindings, and the ways torch allocates an output, beside fd.execute and an empty
torch op in the same process (best of 9 loops of 5000 calls each).

    PYTHONPATH=. python tools/host_floor_gpu.py
"""
from __future__ import annotations

import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_timing_gpu import _per_call_us  # noqa: E402
from pyfuser import catalogue
from pyfuser.runtime import cuda_driver as cu


def per_call_us(fn, n: int = 5000) -> float:
    return _per_call_us(fn, n, loops=9)


def main() -> None:
    inputs = catalogue.make_inputs("rmsnorm_fwd", 8, 1024, "bf16", device="cuda", seed=0)
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    fd.execute(inputs)
    fd.execute(inputs)
    plan = fd._executor._guarded_plan
    kernel = plan.loaded
    staging = kernel._tls.staging
    (gx, gy, gz), (bx, by, bz) = plan.grid, plan.block
    function, stream, params = kernel._function_pointer, staging.stream_pointer, staging.kernel_params
    smem = plan.smem
    released = kernel._launch_kernel
    held = ctypes.PYFUNCTYPE(ctypes.c_int)(cu.entry_point("cuLaunchKernel"))
    rows = {
        "fd.execute": lambda: fd.execute(inputs),
        "cuLaunchKernel ctypes (GIL released)": lambda: released(
            function, gx, gy, gz, bx, by, bz, smem, stream, params, None),
        "cuLaunchKernel ctypes (GIL held)": lambda: held(
            function, gx, gy, gz, bx, by, bz, smem, stream, params, None),
    }
    try:
        from cuda.bindings import driver
        cu_function, cu_stream = driver.CUfunction(kernel.function), driver.CUstream(staging.stream)
        rows["cuLaunchKernel cuda.bindings"] = lambda: driver.cuLaunchKernel(
            cu_function, gx, gy, gz, bx, by, bz, smem, cu_stream, params.value, 0)
    except ImportError:
        print("no cuda.bindings: its launch is not timed")
    x = inputs[0]
    bf16, device = torch.bfloat16, x.device
    tiny = torch.zeros(1, device="cuda")
    rows.update({
        "fd.execute (again)": lambda: fd.execute(inputs),
        "torch.empty_strided(dtype=, device=torch.device)": lambda: torch.empty_strided(
            (8, 1024), (1024, 1), dtype=bf16, device=device),
        "torch.empty_strided(device='cuda:0')": lambda: torch.empty_strided(
            (8, 1024), (1024, 1), dtype=bf16, device="cuda:0"),
        "torch.empty(size, dtype=, device=)": lambda: torch.empty((8, 1024), dtype=bf16,
                                                                  device=device),
        "x.new_empty(size)": lambda: x.new_empty((8, 1024)),
        "x.new_empty_strided(size, stride)": lambda: x.new_empty_strided((8, 1024), (1024, 1)),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "empty torch op x.add_(0)": lambda: tiny.add_(0),
        "x.data_ptr()": lambda: x.data_ptr(),
    })
    for label, fn in rows.items():
        print(f"{label:52s} {per_call_us(fn):6.2f} us")


if __name__ == "__main__":
    main()
