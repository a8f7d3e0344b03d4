"""`python -m pyfuser explain NAME`: what pyfuser does with a catalogue fusion, stage by stage.

Runs without a GPU: the heuristics read the device table (--device), inputs are described as
dense and 16-byte aligned, and --compile runs NVRTC for sm_90a to show the ptxas report.
"""
from __future__ import annotations

from . import catalogue


def explain(args) -> int:
    if args.name == "list":
        for n in catalogue.names():
            print(f"{n:18s} {catalogue.get(n).description}")
        return 0
    M, N = args.shape
    fd = catalogue.define(args.name, args.dtype)
    print(f"# {args.name}: {catalogue.get(args.name).description}")
    print(f"# shape {M}x{N}, dtype {args.dtype}, device table {args.device}\n")
    print("## Fusion IR")
    print(fd.fusion)
    inputs = catalogue.make_inputs(args.name, M, N, args.dtype, seed=0)
    _explain_kernels(fd, inputs, args)
    if not args.no_run:
        _run_reference(fd, inputs)
    return 0


def _explain_kernels(fd, inputs, args) -> None:
    from .runtime.device import get_device_properties
    from .runtime.executor import index_type_for
    from .runtime.fusion_kernel import build_kernel
    from .runtime.inputs import heuristic_info
    from .schedule.schedulers import registry

    choice = registry.choose(fd.fusion)
    print("\n## Scheduler")
    for name, why in choice.rejected:
        print(f"  not {name}: {why}")
    if choice.scheduler is None:
        print(f"  none: {choice.reason}")
        print("  execute() runs this fusion through the reference evaluator (with a warning)")
        return
    print(f"  {choice.scheduler.NAME}: {choice.reason}")
    clone, info = heuristic_info(fd.fusion, inputs, get_device_properties(args.device))
    cb = info.bindings
    params = choice.scheduler.compute_heuristics(clone, info)
    print("\n## Heuristics")
    print(f"  {params.describe()}")
    print(f"  {params!r}")
    fk = build_kernel(clone, choice.scheduler, params, index_type_for(inputs),
                      f"{args.name}_{choice.scheduler.NAME}", compile_now=args.compile)
    grid, block = fk.launch_dims(cb)
    print(f"\n## Launch\n  grid {grid}, block {block}")
    print("\n## Kernel IR")
    print(fk.stages["kernel_ir"])
    print("\n## CUDA (kernel only; the device library is pasted in front)")
    src = fk.source
    print(src[src.index("typedef"):])
    if args.compile:
        print("## NVRTC / ptxas (sm_90a)")
        print("  " + fk.stages["ptxas"].replace("\n", "\n  "))


def _run_reference(fd, inputs) -> None:
    import time

    from .runtime.inputs import check_inputs
    from .runtime.reference import evaluate

    t0 = time.perf_counter()
    bindings = check_inputs(fd.fusion, inputs)
    outs = evaluate(fd.fusion, inputs, extent_bindings=bindings)
    dt = time.perf_counter() - t0
    print(f"\n## Reference evaluator (torch on CPU, {dt * 1e3:.1f} ms)")
    for k, (v, o) in enumerate(zip(fd.fusion.outputs, outs)):
        print(f"  output {k} (T{v.name}): shape {tuple(o.shape)} {o.dtype}, "
              f"mean {o.float().mean().item():+.5f}, max |x| {o.float().abs().max().item():.5f}")
