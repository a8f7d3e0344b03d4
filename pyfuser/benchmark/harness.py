"""Measure pyfuser and its peers in one run: GB/s by ANCHORS.md's byte counts, the copy ceiling
measured in the same run, and ratios. Timing: triton.testing.do_bench medians (CUDA events),
inputs rotated over sets larger than L2, each case timed three times and the median kept.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

from .. import catalogue
from ..ir.dtype import parse_dtype
from .peers import PEERS, PeerMissing

ROTATE_BYTES = 200 * 2 ** 20   # well above the 50-60 MB L2
# Fusions whose scheduler has variants the user can force (ws_normalization): each is timed too.
VARIANT_OPS = ("rmsnorm_bwd", "layernorm_bwd")


@dataclasses.dataclass
class Result:
    name: str
    M: int
    N: int
    bytes: int
    gbps: dict            # implementation -> GB/s (None if missing)
    ms: dict
    notes: dict           # implementation -> why missing / what ran


def _bench(fn, reps: int = 3) -> float:
    """Median over `reps` runs of do_bench's median time, in ms."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = _event_bench
    times = [do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(reps)]
    return statistics.median(times)


def _event_bench(fn, warmup=25, rep=100, return_mode="median"):
    import torch
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(10, rep // 2)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, bytes read plus written."""
    import torch
    n = 2 ** 30
    ms = _copy_ms(n)
    torch.cuda.empty_cache()        # the 2 GiB of the copy are gone once _copy_ms returns
    return 2 * n / ms / 1e6


def _copy_ms(n: int) -> float:
    import torch
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return _bench(lambda: dst.copy_(src))


class _Rotation:
    def __init__(self, sets):
        self.sets = sets
        self.k = 0

    def next(self):
        s = self.sets[self.k]
        self.k = (self.k + 1) % len(self.sets)
        return s


def _input_sets(name, M, N, dtype, nbytes):
    import torch
    count = max(1, min(8, -(-ROTATE_BYTES // max(nbytes, 1))))
    sets = [catalogue.make_inputs(name, M, N, dtype, device="cuda") for _ in range(count)]
    torch.cuda.synchronize()
    return sets


def measure_case(name: str, M: int, N: int, dtype="bf16", peers=("eager", "compile"),
                 eps: float = 1e-6) -> Result:
    import torch
    entry = catalogue.get(name)
    elem = parse_dtype(dtype).size
    nbytes = entry.min_bytes(M, N, elem)
    sets = _input_sets(name, M, N, dtype, nbytes)
    gbps, ms, notes = {}, {}, {}
    fd = catalogue.define(name, dtype, eps)
    rot = _Rotation(sets)
    variants = [("pyfuser", None)]
    if name in VARIANT_OPS:
        # Norm backward: each variant forced as well as the automatic choice.
        variants += [("pyfuser-multi-wave", {"disable": ["ws_normalization"]}),
                     ("pyfuser-warp-specialized", {"enable": ["ws_normalization"]})]
    for label, opts in variants:
        try:
            fd.execute(sets[0], options=opts)
            run = fd.last_run
            what = ','.join(run.schedulers) or run.reason
            if run.heuristics and hasattr(run.heuristics[0], "variant"):
                what += f" ({run.heuristics[0].variant})"
            if run.workspace_bytes:
                what += f"; workspace {run.workspace_bytes} bytes"
            notes[label] = f"{run.kind}: {what}"
            if opts and run.heuristics and label.split("-", 1)[1] != run.heuristics[0].variant:
                gbps[label] = None
                notes[label] = f"not possible: {run.heuristics[0].reason}"
                continue
            t = _bench(lambda: fd.execute(rot.next(), options=opts))
            ms[label], gbps[label] = t, nbytes / t / 1e6
        except Exception as e:  # noqa: BLE001 - reported, never hidden
            gbps[label] = None
            notes[label] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    for peer in peers:
        if peer == "compile":
            # A fresh dynamo state per case: static shapes recompile per shape, and the limit
            # of 8 recompilations would otherwise be hit inside a sweep of shapes.
            torch._dynamo.reset()
            from .peers import _compiled
            _compiled.cache_clear()
        try:
            fns = [PEERS[peer](name, s, eps) for s in sets]
            k = [0]

            def run():
                f = fns[k[0]]
                k[0] = (k[0] + 1) % len(fns)
                return f()
            run()
            torch.cuda.synchronize()
            t = _bench(run)
            ms[peer], gbps[peer] = t, nbytes / t / 1e6
        except PeerMissing as e:
            gbps[peer] = None
            notes[peer] = f"missing: {e}"
        except Exception as e:  # noqa: BLE001
            gbps[peer] = None
            notes[peer] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    del sets
    torch.cuda.empty_cache()
    return Result(name, M, N, nbytes, gbps, ms, notes)


def time_forced_heuristic(fd, sets, params, label: str, nbytes: int) -> str:
    """One line of a forced-heuristic sweep: the variant checked against the float64 reference
    on the first input set (a wrong variant is reported, never timed), then timed over the
    rotated sets: "LABEL: GB/s  us  [what ran]", "LABEL: WRONG ...", or "LABEL: failed ..."."""
    from ..ir.dtype import from_torch
    from ..runtime.inputs import check_inputs
    from ..runtime.reference import evaluate
    from ..testing import TOLERANCE, rel_error
    try:
        outs = fd.execute(sets[0], options={"heuristic": params, "enable": ["poison_outputs"]})
        refs = evaluate(fd.fusion, list(sets[0]), promote_to_double=True,
                        extent_bindings=check_inputs(fd.fusion, sets[0]))
        errs = [rel_error(o, r) for o, r in zip(outs, refs)]
        if not all(e <= TOLERANCE[from_torch(o.dtype)] for e, o in zip(errs, outs)):
            return f"{label}: WRONG rel err {errs}"
        run = fd.last_run
        rot = _Rotation(sets)
        t = _bench(lambda: fd.execute(rot.next(), options={"heuristic": params}))
        return (f"{label}: {nbytes / t / 1e6:.0f} GB/s  {t * 1e3:.1f} us"
                f"  [{run.kind} {'/'.join(run.schedulers)} x{run.num_kernels}]")
    except Exception as e:  # noqa: BLE001 - reported
        return f"{label}: failed {type(e).__name__}: {str(e)[:300]}"


def host_time_us(name="rmsnorm_fwd", M=1, N=4096, calls=2000) -> float:
    """Wall time per cached execute() of a tiny case (GPU work negligible), in microseconds."""
    import torch
    import warnings
    warnings.simplefilter("ignore")
    fd = catalogue.define(name)
    ins = catalogue.make_inputs(name, M, N, device="cuda")
    for _ in range(50):
        fd.execute(ins)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fd.execute(ins)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def format_table(results, copy_gbps: float, peers) -> str:
    impls = ["pyfuser"] + list(peers)
    head = ["op", "M", "N", *[f"{i} GB/s" for i in impls], "pyfuser %copy", "best peer", "ratio"]
    extra = [v for v in ("pyfuser-multi-wave", "pyfuser-warp-specialized")
             if any(v in r.gbps for r in results)]
    if extra:
        head[3:3] = [f"{v[8:]} GB/s" for v in extra]
        head.append("workspace MB")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in results:
        cells = [r.name, str(r.M), str(r.N)]
        for v in extra:
            g = r.gbps.get(v)
            cells.append(f"{g:.0f}" if g else ("-" if v not in r.gbps else "n/a"))
        for i in impls:
            v = r.gbps.get(i)
            cells.append(f"{v:.0f}" if v else ("missing" if "missing" in r.notes.get(i, "") else "fails"))
        p = r.gbps.get("pyfuser")
        best = max((r.gbps[i] for i in peers if r.gbps.get(i)), default=None)
        cells.append(f"{100 * p / copy_gbps:.1f}%" if p else "-")
        cells.append(f"{best:.0f}" if best else "-")
        cells.append(f"{p / best:.3f}" if p and best else "-")
        if extra:
            import re
            m = re.search(r"workspace (\d+) bytes", r.notes.get("pyfuser", ""))
            cells.append(f"{int(m.group(1)) / 1e6:.1f}" if m else "0")
        rows.append(" | ".join(cells))
    return "\n".join(rows)


def run(names, shapes, dtype, peers, out_path=None) -> dict:
    import torch
    dev = torch.cuda.get_device_name()
    print(f"# device {dev}, torch {torch.__version__}", file=sys.stderr)
    copy = copy_bandwidth()
    print(f"# copy bandwidth {copy:.0f} GB/s", file=sys.stderr)
    results = []
    for name in names:
        for (M, N) in shapes(name):
            t0 = time.time()
            r = measure_case(name, M, N, dtype, peers)
            results.append(r)
            cells = ", ".join(f"{k} {v:.0f}" if v else f"{k} -" for k, v in r.gbps.items())
            print(f"[{time.time() - t0:5.1f}s] {name} {M}x{N}: {cells} GB/s", file=sys.stderr,
                  flush=True)
    table = format_table(results, copy, peers)
    host = {}
    for name in ("silu_mul", "rmsnorm_fwd"):
        try:
            host[name] = host_time_us(name)
            print(f"# host time of a cached execute ({name}, 1x4096): {host[name]:.1f} us",
                  file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            host[name] = f"failed: {e}"
    report = {"device": dev, "torch": torch.__version__, "copy_gbps": copy, "dtype": dtype,
              "date": time.strftime("%Y-%m-%d"), "peers": list(peers),
              "results": [dataclasses.asdict(r) for r in results], "table": table,
              "host_time_us": host}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    print(table)
    return report
