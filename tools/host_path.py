"""Host cost of pyfuser's calls on the CPU, with the launch replaced by a no-op (no GPU needed).

    PYTHONPATH=. python tools/host_path.py [--name rmsnorm_fwd] [--dtype bf16] [--shape 8x1024]
    PYTHONPATH=. python tools/host_path.py --gpu       # the same breakdown on the GPU machine
    PYTHONPATH=. python tools/host_path.py --new-process [--runs 5] [--profile] [--importtime]
    PYTHONPATH=. python tools/host_path.py --new-process --name bench_issue16:batchnorm_fwd_nchw

Default: a cached one-kernel call, `fd.execute` down to the launch (the guarded call and the
plan's launcher run, with the driver's cuLaunchKernel a Python no-op), in microseconds per call
with a breakdown, and the look-up path a call the guard refuses takes. The plan is built as on
an H100 (NVRTC compiles the kernel; the device table stands in for the live device) and the
inputs are CPU tensors, so output allocation costs what torch's CPU allocator costs (the GPU's
caching allocator differs: the lead measures the real call on the H100 with
tools/host_timing_gpu.py). Parts are timed separately and do not add up
exactly to the whole. --gpu: the same breakdown on the GPU machine, with CUDA inputs, the real
allocator, stream and launch, and an empty torch op beside it.

--new-process: the first execute of a fusion the disk cache holds, in fresh interpreters. One
child fills a temporary disk cache (PYFUSER_CACHE_DIR) and a temporary bytecode cache
(PYTHONPYCACHEPREFIX, with PYTHONDONTWRITEBYTECODE dropped: an installed package has its
bytecode; a checkout without a writable __pycache__ would recompile every module in every
process), then `--runs` children each time
`import pyfuser` (torch already imported, as in a process that has initialised CUDA), the
definition, and the first execute, which must hit the disk cache. In the children the inputs
are CPU tensors that the executor takes for CUDA ones, the device table's H100 stands in for
the live device and loading the module (cuModuleLoadData) and the launch are no-ops: what is
timed is everything up to the driver. `--profile` adds cProfile's top functions of the first
execute (sorted by cumulative time; HOST_PATH_SORT=tottime sorts by own time;
HOST_PATH_CALLERS=REGEX adds the callers of the functions it matches); `--importtime`
the modules imported in each phase (python -X importtime).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _per_call_us(fn, n: int, repeats: int = 15) -> float:
    """The best of `repeats` loops of `n` calls (the CPU is shared: the best is the least
    disturbed)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


# ---------------------------------------------------------------------------------------------
# A new process's first call
# ---------------------------------------------------------------------------------------------


def _stub_gpu():
    """Make CPU tensors take the CUDA path down to the driver: the executor sees `is_cuda`, the
    device table's H100 stands in for the live device, loading a cubin and launching are no-ops."""
    import torch

    from pyfuser.runtime import device as device_mod
    from pyfuser.runtime import launch as launch_mod

    class NoLaunch:
        def check_layout(self, layout):
            pass

        def launch(self, grid, block, params, **kw):
            pass

        def launcher(self, grid, block, layout, shared_mem=0):
            return lambda values: None

    h100 = device_mod.DEVICE_TABLE["h100"]
    device_mod.get_device_properties = lambda *_: h100
    launch_mod.load = lambda module, device_index=None: NoLaunch()
    launch_mod._stream_getter = lambda device_index: 0     # the default stream's handle
    torch.Tensor.is_cuda = property(lambda self: True)


def _child(args) -> dict:
    """One fresh process: the phases of its first call, in milliseconds (printed as JSON)."""
    import torch  # noqa: F401  (a process that runs kernels has torch imported already)

    def mark(phase):
        if args.importtime:
            print(f"@@phase {phase}", file=sys.stderr, flush=True)

    times = {}
    mark("import pyfuser")
    t0 = time.perf_counter()
    import pyfuser  # noqa: F401
    from pyfuser import catalogue
    t1 = time.perf_counter()
    mark("stubs")
    _stub_gpu()
    if ":" in args.name:
        # A bench case MODULE:FUNCTION of tools/ (a segmented fusion such as BatchNorm): its
        # inputs on the CPU, then its definition alone, from meta tensors of the same layout.
        import importlib
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        module, function = args.name.split(":")
        case = getattr(importlib.import_module(module), function)
        inputs = case("cpu")[1]
        t2 = time.perf_counter()
        mark("define")
        fd = case("meta")[0]
    else:
        M, N = (int(v) for v in args.shape.split("x"))
        inputs = catalogue.make_inputs(args.name, M, N, args.dtype, seed=0)
        t2 = time.perf_counter()
        mark("define")
        fd = catalogue.define(args.name, args.dtype)
    t3 = time.perf_counter()
    mark("first execute")
    profile = None
    if args.profile and not args.fill:
        import cProfile
        profile = cProfile.Profile()
        profile.enable()
    fd.execute(inputs)
    if profile is not None:
        profile.disable()
    t4 = time.perf_counter()
    mark("end")
    times = {"import pyfuser": (t1 - t0) * 1e3, "stubs, inputs": (t2 - t1) * 1e3,
             "define": (t3 - t2) * 1e3, "first execute": (t4 - t3) * 1e3}
    sources = sorted({k.compile_source for k in fd.kernels()})
    out = {"ms": times, "run": fd.last_run.kind, "kernels_from": sources}
    if profile is not None:
        import io
        import pstats
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats(os.environ.get("HOST_PATH_SORT", "cumulative")).print_stats(args.top)
        if os.environ.get("HOST_PATH_CALLERS"):
            stats.print_callers(os.environ["HOST_PATH_CALLERS"])
        out["profile"] = text.getvalue()
    return out


def _import_phases(stderr: str) -> dict:
    """Per phase, (total self ms, [(self ms, module)]) of what `-X importtime` reports."""
    phases, phase = {}, None
    for line in stderr.splitlines():
        if line.startswith("@@phase "):
            phase = line[8:]
            phases.setdefault(phase, [])
        elif line.startswith("import time:") and phase is not None and "|" in line:
            fields = line[12:].split("|")
            try:
                self_us = int(fields[0])
            except ValueError:
                continue
            phases[phase].append((self_us / 1e3, fields[2].strip()))
    return {k: (sum(t for t, _ in v), sorted(v, reverse=True)) for k, v in phases.items()}


def new_process(args) -> int:
    with tempfile.TemporaryDirectory(prefix="pyfuser-host-") as tmp:
        env = dict(os.environ, PYFUSER_CACHE_DIR=os.path.join(tmp, "kernels"),
                   PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)    # the first child writes the bytecode
        base = [sys.executable, os.path.abspath(__file__), "--child", "--name", args.name,
                "--dtype", args.dtype, "--shape", args.shape, "--top", str(args.top)]

        def run(extra, python_flags=()):
            cmd = [sys.executable, *python_flags] + base[1:] + extra
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"child failed:\n{done.stderr[-4000:]}")
            return json.loads(done.stdout.splitlines()[-1]), done.stderr

        fill, _ = run(["--fill"])
        print(f"{args.name} {args.dtype} {args.shape}: cache filled by a first process "
              f"(kernels {fill['kernels_from']}, first execute {fill['ms']['first execute']:.1f} "
              "ms), bytecode warm")
        hits = []
        for i in range(args.runs):
            flags = ("-X", "importtime") if args.importtime and i == 0 else ()
            extra = (["--profile"] if args.profile and i == 0 else []) + (
                ["--importtime"] if flags else [])
            hit, err = run(extra, flags)
            if hit["kernels_from"] != ["disk"] or hit["run"] != "kernels":
                raise SystemExit(f"the new process did not load its kernel from the disk cache: "
                                 f"{hit}")
            hits.append(hit)
            if flags:
                for phase, (total, mods) in _import_phases(err).items():
                    if phase == "end" or not mods:
                        continue
                    top = ", ".join(f"{m} {t:.1f}" for t, m in mods[:args.top // 2])
                    print(f"  imports during {phase}: {len(mods)} modules, {total:.1f} ms "
                          f"(self time; largest: {top})")
            if "profile" in hit:
                print(hit["profile"])
        print("new process, ms (best / median of %d):" % len(hits))
        for phase in hits[0]["ms"]:
            vals = sorted(h["ms"][phase] for h in hits)
            print(f"  {phase:18s} {vals[0]:8.1f} {vals[len(vals) // 2]:8.1f}")
        totals = sorted(h["ms"]["define"] + h["ms"]["first execute"] for h in hits)
        print(f"  {'define + execute':18s} {totals[0]:8.1f} {totals[len(totals) // 2]:8.1f}")
    return 0


def _driverless_kernel(launch_mod, fk):
    """A launch.LoadedKernel whose driver calls are Python no-ops: the launch's own Python
    (stream, staging, checks) is timed, the driver's cuLaunchKernel is not."""
    import ctypes
    import threading

    from pyfuser.runtime.launch import ParamLayout, packing_offsets
    k = launch_mod.LoadedKernel.__new__(launch_mod.LoadedKernel)
    k.module, k.device_index, k.context, k.cu_module, k.function = fk.module, 0, None, None, None
    sizes = ParamLayout(fk.param_kinds).sizes
    k.param_offsets, k.param_sizes = (), sizes
    k.pack_offsets, k.param_size = packing_offsets(sizes)
    k.dynamic_smem_limit = 48 * 1024
    k.non_portable_clusters = False
    k._configs, k._tls = {}, threading.local()
    k._function_pointer = ctypes.c_void_p(None)
    k._launch_kernel = k._launch_kernel_ex = lambda *a: 0
    return k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="rmsnorm_fwd")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--shape", default="8x1024")
    ap.add_argument("-n", type=int, default=5000, help="calls per timing loop")
    ap.add_argument("--new-process", action="store_true",
                    help="time the first execute of a disk-cached fusion in fresh processes")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes (--new-process)")
    ap.add_argument("--profile", action="store_true", help="cProfile of the first execute")
    ap.add_argument("--importtime", action="store_true", help="imports of each phase")
    ap.add_argument("--top", type=int, default=30, help="rows of --profile and --importtime")
    ap.add_argument("--gpu", action="store_true",
                    help="the cached call's breakdown on the GPU machine, launches real")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fill", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    if args.new_process:
        return new_process(args)
    M, N = (int(v) for v in args.shape.split("x"))

    import torch

    from pyfuser import catalogue
    from pyfuser import options as opts
    from pyfuser.runtime import device as device_mod
    from pyfuser.runtime import fusion_kernel
    from pyfuser.runtime.executor import FusionExecutorCache, _Target
    from pyfuser.runtime.inputs import check_inputs
    from pyfuser.schedule.schedulers import registry

    from pyfuser.runtime import launch as launch_mod
    if args.gpu:
        device = torch.device("cuda")
        fd = catalogue.define(args.name, args.dtype)
        inputs = catalogue.make_inputs(args.name, M, N, args.dtype, seed=0, device="cuda")
        fd.execute(inputs)
        ex, options = fd._executor, opts.current()
        plan = ex._plans.get(ex._key(inputs, options))
        if plan is None or plan.run_info.kind != "kernels" or len(plan.run_info.kernel_names) != 1:
            print(f"{args.name} is not a one-kernel plan: {fd.last_run}")
            return 1
        stream = lambda: launch_mod._stream_getter(0)  # noqa: E731
    else:
        device = torch.device("cpu")
        launch_mod._stream_getter = lambda index: 0
        loaded_kernels = {}
        fusion_kernel.FusionKernel.loaded = (
            lambda self, index: loaded_kernels.get(id(self)) or loaded_kernels.setdefault(
                id(self), _driverless_kernel(launch_mod, self)))
        h100 = device_mod.DEVICE_TABLE["h100"]
        device_mod.get_device_properties = lambda *_: h100

        fd = catalogue.define(args.name, args.dtype)
        inputs = catalogue.make_inputs(args.name, M, N, args.dtype, seed=0)
        ex = fd._executor = FusionExecutorCache(fd.fusion, name=fd.name)
        options = opts.current()
        plan = ex._guarded_kernel_plan(inputs, check_inputs(fd.fusion, inputs),
                                       registry.choose(fd.fusion),
                                       _Target(h100, torch.device("cpu")), options)
        if plan.run_info.kind != "kernels":
            print(f"{args.name} runs {plan.run_info.kind}: {plan.run_info.reason}")
            return 1
        ex._plans[ex._key(inputs, options)] = plan
        fd.execute(inputs)      # finds the plan by its key and guards the next calls
        assert fd.last_run is plan.run_info, "the call did not take the cached plan"
        stream = None

    n = args.n
    key = ex._key(inputs, options)
    outs = [torch.empty_strided(sz, st, dtype=dt, device=device) for sz, st, dt in plan.out_specs]
    vals = list(plan.values)        # with this call's pointers (the plan's hold none)
    for pos, role, k in plan.ptr_slots:
        vals[pos] = (inputs[k] if role == "input" else outs[k]).data_ptr()
    residues = tuple(x.data_ptr() & 15 for x in inputs)
    call = ex.guarded_call
    if call is None or plan._launch_values is None:
        print(f"{args.name}: no guarded call through a launcher (a plan with work at launch, "
              "in-place outputs, or a torch without tensor guards)")
        return 1
    from pyfuser.runtime.call_guard import tensor_guard
    check = tensor_guard(inputs)
    launch_values = plan._launch_values
    rows = [
        ("fd.execute(inputs)", lambda: fd.execute(inputs)),
        ("  the guarded call", lambda: call(inputs)),
        ("    tensor guard check", lambda: check(*inputs)),
        ("    options.current()", opts.current),
        ("    _KernelPlan.run_if_aligned", lambda: plan.run_if_aligned(inputs, residues)),
        ("      allocate outputs", lambda: [torch.empty_strided(sz, st, dtype=dt,
                                                                device=device)
                                            for sz, st, dt in plan.out_specs]),
        ("      data_ptr per pointer", lambda: [(inputs[k] if r == "input" else outs[k])
                                                .data_ptr() for _, r, k in plan.ptr_slots]),
        ("      pack and launch", lambda: launch_values(vals)),
        ("  the look-up (a call the guard refuses)", lambda: ex._run(inputs, options)),
        ("    _key", lambda: ex._key(inputs, options)),
        ("    plan look-up", lambda: ex._plans.get(key)),
        ("    _KernelPlan.run", lambda: plan.run(inputs)),
    ]
    if stream is not None:
        tiny = torch.zeros(4, device=device)
        rows += [("  the current stream's handle", stream),
                 ("  one empty torch op (x.add_(0))", lambda: tiny.add_(0)),
                 ("  torch.empty(4) on the device", lambda: torch.empty(4, device=device))]
    what = (f"on {torch.cuda.get_device_name()}, the real launch" if args.gpu
            else "the driver's launch call replaced by a no-op")
    print(f"{args.name} {args.dtype} {M}x{N}: {len(plan.layout.kinds)} parameters, "
          f"{len(plan.out_specs)} output(s), {what}")
    for label, fn in rows:
        print(f"{label:42s} {_per_call_us(fn, n):7.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
