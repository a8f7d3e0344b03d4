"""The table the issue bench scripts print (tools/bench_issue16.py, tools/bench_issue17.py):
each case against eager and torch.compile of the same function, in one run.

A case is `make(device) -> (fd, inputs, eager, nbytes)`: the FusionDefinition, its inputs, the
eager function (torch.compile compiles it), and the bytes its floor moves (GB/s count them).
Each peer's result is compared with pyfuser's before it is timed. Timing follows
../shared/ANCHORS.md's protocol: ROUNDS interleaved rounds (pyfuser, eager, compile, again), each
time one triton do_bench median (pyfuser.benchmark.harness._bench, which clears the L2 before
each run); the row prints each one's median GB/s and the median of the rounds' ratios.
"""
from __future__ import annotations

import statistics

import torch

ROUNDS = 5


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
    print(f"case | pyfuser GB/s | eager GB/s | compile GB/s | best peer | ratio (median of "
          f"{ROUNDS} interleaved rounds) | plan")
    print("--- | --- | --- | --- | --- | --- | ---")
    for name, make in cases.items():
        fd, inputs, eager, nbytes = make("cuda")
        ours = fd.execute(inputs)
        run = fd.last_run
        fns = {"pyfuser": lambda: fd.execute(inputs)}
        for peer, fn in (("eager", eager), ("compile", torch.compile(eager, dynamic=False))):
            try:
                _report_difference(name, peer, fn(), ours, tolerance)
                fns[peer] = fn
            except Exception as e:     # noqa: BLE001 - a peer that fails is reported, not fatal
                print(f"# {name}: {peer} failed: {type(e).__name__}: {e}"[:300])
        rounds = [{k: nbytes / _bench(fn, reps=1) / 1e6 for k, fn in fns.items()}
                  for _ in range(ROUNDS)]
        gbs = {k: statistics.median(r[k] for r in rounds) for k in fns}
        best = max(v for k, v in gbs.items() if k != "pyfuser")
        ratio = statistics.median(r["pyfuser"] / max(v for k, v in r.items() if k != "pyfuser")
                                  for r in rounds)
        plan = ", ".join(f"{s.kind}:{s.name}" for s in run.segments) or ",".join(run.schedulers)
        print(f"{name} | {gbs['pyfuser']:.0f} | {gbs.get('eager', float('nan')):.0f} | "
              f"{gbs.get('compile', float('nan')):.0f} | {best:.0f} | {ratio:.2f}"
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
