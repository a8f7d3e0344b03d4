"""`python -m pyfuser explain NAME`: what pyfuser does with a catalogue fusion, stage by stage."""
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
    if not args.no_run:
        _run_reference(fd, args.name, M, N, args.dtype)
    return 0


def _run_reference(fd, name: str, M: int, N: int, dtype: str) -> None:
    import time

    from .runtime.inputs import check_inputs
    from .runtime.reference import evaluate

    inputs = catalogue.make_inputs(name, M, N, dtype, seed=0)
    t0 = time.perf_counter()
    bindings = check_inputs(fd.fusion, inputs)
    outs = evaluate(fd.fusion, inputs, extent_bindings=bindings)
    dt = time.perf_counter() - t0
    print(f"\n## Reference evaluator (torch on CPU, {dt * 1e3:.1f} ms)")
    for k, (v, o) in enumerate(zip(fd.fusion.outputs, outs)):
        print(f"  output {k} (T{v.name}): shape {tuple(o.shape)} {o.dtype}, "
              f"mean {o.float().mean().item():+.5f}, max |x| {o.float().abs().max().item():.5f}")
