"""Sweep the inner persistent scheduler's variants on the GPU: the register kernel and the TMA
circular-buffered kernel over stages, rows per block and persistent grid sizes.

Each variant is checked against the float64 reference before it is timed; a wrong variant is
reported as such, never timed. Output: one line per (op, shape, variant) with GB/s counted with
ANCHORS.md's bytes, plus the copy ceiling of the same run. The heuristic's thresholds
(schedule/schedulers/inner_persistent.py) come from these tables (bench/results/).

    python tools/sweep_inner_persistent.py [op ...] [--shapes 16384x1024,16384x4096]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from pyfuser import catalogue
from pyfuser import options as pf_options
from pyfuser.benchmark.harness import _input_sets, copy_bandwidth, time_forced_heuristic
from pyfuser.runtime.inputs import heuristic_info
from pyfuser.schedule.schedulers import inner_persistent as ip


def default_params(fd, inputs, device_props):
    clone, info = heuristic_info(fd.fusion, inputs, device_props)
    return ip.compute_heuristics(clone, info), clone


def ws_variants(p):
    """The warp-specialized variant at several stage counts and compute row counts (compute
    threads whole warp groups, 256..768, so that compute gets more registers than at entry)."""
    if not p.warp_specialized:
        return
    producer = max(p.bdimx, 128)
    for bdimy in sorted({p.bdimy, p.bdimy * 3 // 2, p.bdimy * 2, p.bdimy * 3}):
        compute = p.bdimx * bdimy
        if compute % 128 or not 256 <= compute <= 768 or compute + producer > 1024:
            continue
        for stages in (2, 4, 8):
            if stages * bdimy * p.row_extents[0] * 2 * len(p.tma_inputs) > 200 * 1024:
                continue
            yield (f"ws s{stages} y{bdimy}",
                   dataclasses.replace(p, bdimy=bdimy, stages=stages, prefetch=stages - 1))


def variants(p, fd, N, sms):
    if p.cluster > 1:
        # Long rows: blocks per row (cluster size); each block's share in registers.
        for c in (2, 4, 8):
            if N % (c * p.vector):
                continue
            batch, bdimx = ip.persistent_batch(N // (p.vector * c))
            yield f"cluster {c} ({bdimx} threads x {batch} x {p.vector})", dataclasses.replace(
                p, cluster=c, persistent_batch=batch, bdimx=bdimx)
        return
    yield "registers", dataclasses.replace(p, stages=0, prefetch=0, grid=0, tma_inputs=())
    rows = tuple(k for k, v in enumerate(fd.fusion.inputs)
                 if hasattr(v, "domain") and len(v.domain.logical) == 2)
    for bdimy in sorted({p.bdimy, p.bdimy * 2}):
        for stages in (2, 4):
            smem = stages * bdimy * N * 2 * len(rows)
            if smem > 200 * 1024:
                continue
            for per_sm in (1, 2, 4):
                if per_sm * smem > 220 * 1024 or per_sm * bdimy * max(p.bdimx, 32) > 2048:
                    continue
                q = dataclasses.replace(p, bdimy=bdimy, stages=stages, prefetch=stages - 1,
                                        grid=sms * per_sm, tma_inputs=rows)
                yield f"tma s{stages} y{bdimy} g{per_sm}x", q


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*", default=["rmsnorm_fwd", "softmax", "layernorm_fwd"])
    ap.add_argument("--shapes", default="16384x1024,16384x4096,16384x16384")
    ap.add_argument("--kinds", default="registers,tma,ws",
                    help="variants to time: registers, tma (pipelined), ws (warp-specialized), tmap "
                         "(the TMA ones again with tensor-map boxes)")
    ap.add_argument("--defaults-only", action="store_true",
                    help="time each kind as its heuristic chooses it, without the knob sweep")
    args = ap.parse_args(argv)
    from pyfuser.runtime.device import get_device_properties
    props = get_device_properties(0)
    print(f"# {torch.cuda.get_device_name()} copy {copy_bandwidth():.0f} GB/s", flush=True)
    for op in args.ops:
        for shape in args.shapes.split(","):
            M, N = (int(x) for x in shape.split("x"))
            fd = catalogue.define(op, "bf16")
            sets = _input_sets(op, M, N, "bf16", catalogue.get(op).min_bytes(M, N, 2))
            nbytes = catalogue.get(op).min_bytes(M, N, 2)
            p0, _ = default_params(fd, sets[0], props)
            kinds = args.kinds.split(",")
            todo = [(lb, q) for lb, q in variants(p0, fd, N, props.sm_count)
                    if lb.split()[0] in kinds or (lb.startswith("cluster") and "registers" in kinds)]
            if "ws" in kinds and p0.cluster == 1:
                with pf_options.override(enable=["ws_inner_persistent"]):
                    pw, _ = default_params(fd, sets[0], props)
                todo += list(ws_variants(pw))
            if args.defaults_only:
                # Each kind as its heuristic chooses it, no knob sweep.
                todo = [("registers", p0)] if "registers" in kinds else []
                for kind, feature in (("tma", "tma_inner_persistent"),
                                      ("ws", "ws_inner_persistent")):
                    if kind in kinds:
                        with pf_options.override(enable=[feature]):
                            q, _ = default_params(fd, sets[0], props)
                        if q.stages:
                            todo.append((f"{kind} s{q.stages} y{q.bdimy}", q))
            if "tmap" in kinds:
                # The same TMA variants with one tensor-map box per stage.
                todo += [(f"tmap {label}", dataclasses.replace(q, tensor_map=True))
                         for label, q in todo if q.stages]
            for label, p in todo:
                print(f"{op} {M}x{N} " + time_forced_heuristic(fd, sets, p, label, nbytes),
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
