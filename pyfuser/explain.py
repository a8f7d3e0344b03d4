"""`python -m pyfuser explain NAME`: what pyfuser does with a catalogue fusion, stage by stage.

Runs without a GPU: the plan (segments, heuristics, launches) is pyfuser.explain_fusion's, which
reads the device table (--device) and describes inputs as 16-byte aligned; --compile runs NVRTC
for sm_90a to show the ptxas report.
"""
from __future__ import annotations

import sys

from . import catalogue


def explain(args) -> int:
    if args.name == "list":
        for n in catalogue.names():
            print(f"{n:18s} {catalogue.get(n).description}")
        return 0
    if catalogue.unknown([args.name]):
        print(f"python -m pyfuser explain: {catalogue.unknown([args.name])}", file=sys.stderr)
        return 2
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
    from .runtime.explain import explain_fusion

    plan = explain_fusion(fd.fusion, inputs, device=args.device, compile=args.compile,
                          name=args.name)
    print("\n## Plan (segments; the heuristics read the device table)")
    print(plan)
    for k in plan.kernels:
        print(f"\n## Heuristic of {k.name} ({k.scheduler})")
        print(f"  {k.params!r}")
        print(f"\n## Kernel IR of {k.name}")
        print(k.kernel.stages["kernel_ir"])
        print(f"\n## CUDA of {k.name} (kernel only; the device library is pasted in front)")
        src = k.kernel.source
        print(src[src.index("typedef"):])


def _run_reference(fd, inputs) -> None:
    import time

    from .runtime.inputs import check_inputs
    from .runtime.reference import evaluate

    t0 = time.perf_counter()
    inputs = fd.complete_inputs(inputs, rng_state=fd.last_rng_state or (0, 0), record=False)
    bindings = check_inputs(fd.fusion, inputs)
    outs = evaluate(fd.fusion, inputs, extent_bindings=bindings)
    dt = time.perf_counter() - t0
    print(f"\n## Reference evaluator (torch on CPU, {dt * 1e3:.1f} ms)")
    for k, (v, o) in enumerate(zip(fd.fusion.outputs, outs)):
        print(f"  output {k} (T{v.name}): shape {tuple(o.shape)} {o.dtype}, "
              f"mean {o.float().mean().item():+.5f}, max |x| {o.float().abs().max().item():.5f}")
