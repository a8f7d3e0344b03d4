"""The table the issue bench scripts print (tools/bench_issue16.py, tools/bench_issue17.py):
each case against eager and torch.compile of the same function, in one run.

A case is `make(device) -> (fd, inputs, eager, nbytes)`: the FusionDefinition, its inputs, the
eager function (torch.compile compiles it), and the bytes its floor moves (GB/s count them).
Each peer's result is compared with pyfuser's before it is timed; times are medians of triton's
do_bench (pyfuser.benchmark.harness._bench), which clears the L2 before each run.
"""
from __future__ import annotations

import torch


def explain(cases: dict) -> int:
    """Each case's plan for the H100 from meta tensors (CPU)."""
    for name, make in cases.items():
        fd, inputs, _, _ = make("meta")
        print(f"== {name}\n{fd.explain(inputs, device='h100')}\n")
    return 0


def selected(cases: dict, argv: list) -> dict:
    """The cases whose name contains one of the words of `argv` that are not options (all of
    them when there is none)."""
    words = [a for a in argv if not a.startswith("--")]
    return {n: c for n, c in cases.items() if not words or any(w in n for w in words)}


def bench(cases: dict, tolerance: float = 1e-2) -> int:
    """GB/s of pyfuser, eager and torch.compile per case, and pyfuser's ratio to the best."""
    from pyfuser.benchmark.harness import _bench
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("case | pyfuser GB/s | eager GB/s | compile GB/s | best peer | ratio | plan")
    print("--- | --- | --- | --- | --- | --- | ---")
    for name, make in cases.items():
        fd, inputs, eager, nbytes = make("cuda")
        ours = fd.execute(inputs)
        run = fd.last_run
        t = {"pyfuser": _bench(lambda: fd.execute(inputs))}
        for peer, fn in (("eager", eager), ("compile", torch.compile(eager, dynamic=False))):
            try:
                _report_difference(name, peer, fn(), ours, tolerance)
                t[peer] = _bench(fn)
            except Exception as e:     # noqa: BLE001 - a peer that fails is reported, not fatal
                print(f"# {name}: {peer} failed: {type(e).__name__}: {e}"[:300])
        gbs = {k: nbytes / v / 1e6 for k, v in t.items()}
        best = max(v for k, v in gbs.items() if k != "pyfuser")
        plan = ", ".join(f"{s.kind}:{s.name}" for s in run.segments) or ",".join(run.schedulers)
        print(f"{name} | {gbs['pyfuser']:.0f} | {gbs.get('eager', float('nan')):.0f} | "
              f"{gbs.get('compile', float('nan')):.0f} | {best:.0f} | {gbs['pyfuser'] / best:.2f}"
              f" | {run.kind}: {plan}", flush=True)
    return 0


def print_times(times: dict, nbytes: int) -> None:
    """The device, then each timed name's microseconds and GB/s (`times`: name -> milliseconds,
    as _bench returns them; `nbytes`: the bytes of the floor)."""
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, ms in times.items():
        print(f"{name}: {ms * 1e3:.1f} us, {nbytes / ms / 1e6:.0f} GB/s")


def _report_difference(name: str, peer: str, theirs, ours, tolerance: float) -> None:
    """Print where a peer's first output differs from pyfuser's by more than `tolerance`
    (bf16 results of one function differ by a rounding here and there)."""
    a = theirs[0] if isinstance(theirs, (tuple, list)) else theirs
    b = ours[0]
    if isinstance(a, torch.Tensor) and a.shape == b.shape:
        diff = (a.float() - b.float()).abs().max().item()
        if diff > tolerance:
            print(f"# {name}: {peer} differs from pyfuser by {diff:.3g}")
