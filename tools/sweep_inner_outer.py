"""Sweep the inner-outer persistent (norm backward) scheduler's variants on the GPU: the
multi-wave kernel with register rows, the same with rows copied by TMA into a circular buffer
(stages x persistent blocks per SM), and the warp-specialized kernel (stages x compute rows).

Each variant is checked against the float64 reference before it is timed; a wrong variant is
reported as such, never timed. Output: one line per (op, shape, variant) with GB/s counted with
ANCHORS.md's bytes and the workspace bytes the kernel moves, plus the copy ceiling of the same
run. The variant thresholds in schedule/schedulers/inner_outer_persistent.py come from these
tables (bench/results/).

    python tools/sweep_inner_outer.py [op ...] [--shapes 16384x1024,16384x4096] [--kinds ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from pyfuser import catalogue
from pyfuser import options as pf_options
from pyfuser.benchmark.harness import _bench, _input_sets, _Rotation, copy_bandwidth
from pyfuser.ir.dtype import from_torch
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.reference import evaluate
from pyfuser.schedule.schedulers import inner_outer_persistent as io
from pyfuser.testing import TOLERANCE, rel_error


def default_params(fd, inputs, device_props):
    from pyfuser.schedule.schedulers.base import InputFacts, RuntimeInfo
    bindings = check_inputs(fd.fusion, inputs)
    clone, mapping = fd.fusion.clone()
    cb = {mapping[id(k)]: v for k, v in bindings.items() if id(k) in mapping}
    facts = tuple(InputFacts(tuple(x.shape), tuple(x.stride()), 16)
                  if isinstance(x, torch.Tensor) else None for x in inputs)
    return io.compute_heuristics(clone, RuntimeInfo(cb, facts, device_props))


def variants(p, N, sms, kinds):
    if "registers" in kinds:
        yield "registers", p
    rows = (0, 1)           # x and dy of rmsnorm_bwd / layernorm_bwd
    stage = 2 * N * 2       # one row of each, bf16
    if "tma" in kinds and not p.warp_specialized:
        for stages in (2, 3, 4):
            for per_sm in (1, 2):
                if per_sm * (stages * stage + 8 * 1024) > 220 * 1024:
                    continue
                yield (f"tma s{stages} g{per_sm}x",
                       dataclasses.replace(p, stages=stages, prefetch=stages - 1,
                                           tma_inputs=rows, grid=sms * per_sm))
    if "ws" in kinds and getattr(p, "compute_rows", 0):
        for rows_ in sorted({1, 2, 3} & {r for r in (1, 2, 3) if r * p.bdimx % 128 == 0}):
            for stages in (2, 4, 6):
                if stages * rows_ * stage > 200 * 1024:
                    continue
                yield (f"ws s{stages} y{rows_}",
                       dataclasses.replace(p, stages=stages, prefetch=stages - 1,
                                           compute_rows=rows_))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*", default=["rmsnorm_bwd", "layernorm_bwd"])
    ap.add_argument("--shapes", default="16384x1024,16384x4096,16384x16384")
    ap.add_argument("--kinds", default="registers,tma,ws",
                    help="variants to time: registers (multi-wave, register rows), tma "
                         "(multi-wave, rows through a TMA circular buffer), ws (warp-specialized)")
    ap.add_argument("--defaults-only", action="store_true",
                    help="time each kind as its heuristic chooses it, without the knob sweep")
    args = ap.parse_args(argv)
    from pyfuser.runtime.device import get_device_properties
    props = get_device_properties(0)
    kinds = args.kinds.split(",")
    print(f"# {torch.cuda.get_device_name()} copy {copy_bandwidth():.0f} GB/s", flush=True)
    for op in args.ops:
        for shape in args.shapes.split(","):
            M, N = (int(x) for x in shape.split("x"))
            fd = catalogue.define(op, "bf16")
            nbytes = catalogue.get(op).min_bytes(M, N, 2)
            sets = _input_sets(op, M, N, "bf16", nbytes)
            todo = []
            for kind, feature in (("registers", None), ("ws", "ws_normalization")):
                if kind not in kinds and not (kind == "registers" and "tma" in kinds):
                    continue
                over = ({"enable": [feature]} if feature else {"disable": ["ws_normalization"]})
                try:
                    with pf_options.override(**over):
                        q = default_params(fd, sets[0], props)
                except Exception as e:  # noqa: BLE001 - reported
                    print(f"{op} {M}x{N} {kind}: no heuristic: {e}", flush=True)
                    continue
                if args.defaults_only:
                    todo.append((f"{kind} (heuristic)", q))
                else:
                    todo += list(variants(q, N, props.sm_count, kinds))
            for label, p in todo:
                try:
                    outs = fd.execute(sets[0], options={"heuristic": p, "enable": ["poison_outputs"]})
                    refs = evaluate(fd.fusion, list(sets[0]), promote_to_double=True,
                                    extent_bindings=check_inputs(fd.fusion, sets[0]))
                    errs = [rel_error(o, r) for o, r in zip(outs, refs)]
                    ok = all(e <= TOLERANCE[from_torch(o.dtype)] for e, o in zip(errs, outs))
                    if not ok:
                        print(f"{op} {M}x{N} {label}: WRONG rel err {errs}", flush=True)
                        continue
                    run = fd.last_run
                    rot = _Rotation(sets)
                    t = _bench(lambda: fd.execute(rot.next(), options={"heuristic": p}))
                    print(f"{op} {M}x{N} {label}: {nbytes / t / 1e6:.0f} GB/s  {t * 1e3:.1f} us"
                          f"  [{run.kind} {'/'.join(run.schedulers)} x{run.num_kernels}]", flush=True)
                except Exception as e:  # noqa: BLE001 - reported
                    print(f"{op} {M}x{N} {label}: failed {type(e).__name__}: {str(e)[:300]}",
                          flush=True)
            del sets
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
