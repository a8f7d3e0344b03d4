"""Host cost of a cached one-kernel call, on the CPU: `fd.execute` down to the launch, with the
launch replaced by a no-op (no GPU needed), in microseconds per call with a breakdown.

    PYTHONPATH=. python tools/host_path.py [--name rmsnorm_fwd] [--dtype bf16] [--shape 8x1024]

The plan is built as on an H100 (NVRTC compiles the kernel; the device table stands in for
the live device) and the inputs are CPU tensors, so output allocation costs what torch's CPU
allocator costs (the GPU's caching allocator differs: the lead measures the real call on the
H100). Parts are timed separately and do not add up exactly to the whole.
"""
from __future__ import annotations

import argparse
import time


def _per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="rmsnorm_fwd")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--shape", default="8x1024")
    ap.add_argument("-n", type=int, default=20000, help="calls per timing")
    args = ap.parse_args(argv)
    M, N = (int(v) for v in args.shape.split("x"))

    import torch

    from pyfuser import catalogue
    from pyfuser import options as opts
    from pyfuser.runtime import device as device_mod
    from pyfuser.runtime import fusion_kernel
    from pyfuser.runtime.executor import FusionExecutorCache, _Target
    from pyfuser.runtime.inputs import check_inputs
    from pyfuser.schedule.schedulers import registry

    class NoLaunch:
        def check_layout(self, layout):
            pass

        def launch(self, grid, block, params, **kw):
            pass

    no_launch = NoLaunch()
    fusion_kernel.FusionKernel.loaded = lambda self, index: no_launch
    h100 = device_mod.DEVICE_TABLE["h100"]
    device_mod.get_device_properties = lambda *_: h100

    fd = catalogue.define(args.name, args.dtype)
    inputs = catalogue.make_inputs(args.name, M, N, args.dtype, seed=0)
    ex = fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
    options = opts.current()
    plan = ex._guarded_kernel_plan(inputs, check_inputs(fd.fusion, inputs),
                                   registry.choose(fd.fusion), _Target(h100, torch.device("cpu")),
                                   options)
    if plan.run_info.kind != "kernels":
        print(f"{args.name} runs {plan.run_info.kind}: {plan.run_info.reason}")
        return 1
    ex._plans[ex._key(inputs, options)] = plan
    fd.execute(inputs)
    assert fd.last_run is plan.run_info, "the call did not take the cached plan"

    n = args.n
    key = ex._key(inputs, options)
    outs = [torch.empty_strided(sz, st, dtype=dt) for sz, st, dt in plan.out_specs]
    vals = list(plan.values)
    rows = [
        ("fd.execute(inputs)", lambda: fd.execute(inputs)),
        ("  FusionExecutorCache.run", lambda: ex.run(inputs)),
        ("    FusionExecutorCache._run", lambda: ex._run(inputs, options)),
        ("      _key", lambda: ex._key(inputs, options)),
        ("      plan look-up", lambda: ex._plans.get(key)),
        ("      _KernelPlan.run", lambda: plan.run(inputs)),
        ("        allocate outputs", lambda: [torch.empty_strided(sz, st, dtype=dt)
                                              for sz, st, dt in plan.out_specs]),
        ("        data_ptr per pointer", lambda: [(inputs[k] if r == "input" else outs[k])
                                                  .data_ptr() for _, r, k in plan.ptr_slots]),
        ("        pack parameters", lambda: plan.layout.pack(vals)),
        ("    options.current()", opts.current),
    ]
    print(f"{args.name} {args.dtype} {M}x{N}: {len(plan.layout.kinds)} parameters, "
          f"{len(plan.out_specs)} output(s), launch replaced by a no-op")
    for label, fn in rows:
        print(f"{label:32s} {_per_call_us(fn, n):7.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
