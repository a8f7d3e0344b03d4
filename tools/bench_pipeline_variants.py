"""The circular-buffer variants of the norm kernels, each forced, timed on the GPU: the bench
of issue 19's bar (the pipeline mechanism must keep each variant's speed).

Each variant is forced with its PYFUSER_ENABLE features, checked against the float64 reference
on the first input set (a wrong variant is reported, never timed) and timed over rotated input
sets; the line says what ran. Run it once per checkout (PYTHONPATH) in one device call,
alternating, to compare two commits; `--peers` adds eager and torch.compile for context.

    PYTHONPATH=. python tools/bench_pipeline_variants.py [--peers] [--only ws_pp,...]
"""
from __future__ import annotations

import argparse
import os

import torch

from pyfuser import catalogue
from pyfuser.benchmark.harness import PEERS, _bench, _input_sets, _Rotation
from pyfuser.ir.dtype import from_torch
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import TOLERANCE, rel_error

# (label, features forced, what must have run: a predicate of the heuristic)
VARIANTS = {
    "registers": ((), lambda p: p.stages == 0),
    "tma": (("tma_inner_persistent",), lambda p: p.stages >= 2 and not p.warp_specialized
            and bool(p.tma_inputs) and not p.tensor_map),
    "tma_tmap": (("tma_inner_persistent", "tma_tensor_map"), lambda p: p.tensor_map
                 and not p.warp_specialized),
    "cp.async": (("tma_inner_persistent",), lambda p: bool(p.cp_async_inputs)),
    "ws": (("ws_inner_persistent",), lambda p: p.warp_specialized and not p.tensor_map
           and getattr(p, "compute_roles", 1) == 1),
    "ws_tmap": (("ws_inner_persistent", "tma_tensor_map"), lambda p: p.warp_specialized
                and p.tensor_map and getattr(p, "compute_roles", 1) == 1),
    "ws_pp": (("ws_inner_persistent", "ws_pingpong"),
              lambda p: getattr(p, "compute_roles", 1) == 2 and not p.tensor_map),
    "ws_pp_tmap": (("ws_inner_persistent", "ws_pingpong", "tma_tensor_map"),
                   lambda p: getattr(p, "compute_roles", 1) == 2 and p.tensor_map),
    "bwd_multi_wave": ((), lambda p: not p.warp_specialized),
    "bwd_ws": (("ws_normalization",), lambda p: p.warp_specialized),
}
FORWARD = ["registers", "tma", "tma_tmap", "ws", "ws_tmap", "ws_pp", "ws_pp_tmap"]
CASES = ([(op, 16384, n, v) for op in ("rmsnorm_fwd", "layernorm_fwd", "softmax")
          for n in (1024, 4096) for v in FORWARD]
         + [("rmsnorm_fwd", 16384, 4100, v) for v in ("registers", "cp.async")]
         + [(op, 16384, 4096, v) for op in ("rmsnorm_bwd", "layernorm_bwd")
            for v in ("bwd_multi_wave", "bwd_ws")])


def time_variant(name, M, N, variant) -> str:
    features, ran = VARIANTS[variant]
    entry = catalogue.get(name)
    nbytes = entry.min_bytes(M, N, 2)
    sets = _input_sets(name, M, N, "bf16", nbytes)
    fd = catalogue.define(name)
    opts = {"enable": list(features)} if features else (
        {"disable": ["ws_normalization"]} if variant == "bwd_multi_wave" else None)
    label = f"{name} {M}x{N} {variant}"
    try:
        outs = fd.execute(sets[0], options={**(opts or {}), "enable":
                                            list(features) + ["poison_outputs"]})
        p = fd.last_run.heuristics[0]
        if not ran(p):
            return f"{label}: not possible: {p.reason}"
        refs = evaluate(fd.fusion, list(sets[0]), promote_to_double=True,
                        extent_bindings=check_inputs(fd.fusion, sets[0]))
        errs = [rel_error(o, r) for o, r in zip(outs, refs)]
        if not all(e <= TOLERANCE[from_torch(o.dtype)] for e, o in zip(errs, outs)):
            return f"{label}: WRONG rel err {errs}"
        rot = _Rotation(sets)
        t = _bench(lambda: fd.execute(rot.next(), options=opts))
        return f"{label}: {nbytes / t / 1e6:.0f} GB/s  {t * 1e3:.1f} us"
    except Exception as e:  # noqa: BLE001 - reported
        return f"{label}: failed {type(e).__name__}: {str(e)[:200]}"
    finally:
        del sets
        torch.cuda.empty_cache()


def time_peer(name, M, N, peer) -> str:
    entry = catalogue.get(name)
    nbytes = entry.min_bytes(M, N, 2)
    sets = _input_sets(name, M, N, "bf16", nbytes)
    try:
        if peer == "compile":
            torch._dynamo.reset()
        fns = [PEERS[peer](name, s, 1e-6) for s in sets]
        k = [0]

        def run():
            f = fns[k[0]]
            k[0] = (k[0] + 1) % len(fns)
            return f()
        run()
        t = _bench(run)
        return f"{name} {M}x{N} {peer}: {nbytes / t / 1e6:.0f} GB/s  {t * 1e3:.1f} us"
    except Exception as e:  # noqa: BLE001
        return f"{name} {M}x{N} {peer}: failed {type(e).__name__}: {str(e)[:200]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--only", default="", help="comma list of variants")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    print(f"# {torch.cuda.get_device_name()}; pyfuser from {os.path.dirname(catalogue.__file__)}",
          flush=True)
    done = set()
    for name, M, N, variant in CASES:
        if only and variant not in only:
            continue
        print(time_variant(name, M, N, variant), flush=True)
        if args.peers and (name, M, N) not in done:
            done.add((name, M, N))
            for peer in ("eager", "compile"):
                print(time_peer(name, M, N, peer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
