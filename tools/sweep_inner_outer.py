"""Sweep the inner-outer persistent (norm backward) scheduler's variants on the GPU: the
multi-wave kernel with register rows, the same with rows copied by TMA into a circular buffer
(stages x persistent blocks per SM), and the warp-specialized kernel (stages x compute rows).

Each variant is checked against the float64 reference before it is timed; a wrong variant is
reported as such, never timed. Output: one line per (op, shape, variant) with GB/s counted with
ANCHORS.md's bytes and the workspace bytes the kernel moves, plus the copy ceiling of the same
run. The variant thresholds in schedule/schedulers/inner_outer_persistent.py come from these
tables (bench/results/).

    python tools/sweep_inner_outer.py [op ...] [--shapes 16384x1024,16384x4096] [--kinds ...]
        [--dtype fp16]

The `threads` kind (register rows) varies the elements per thread (and so the threads per
row), the resident blocks per SM given to ptxas as launch bounds, and the phase-2 column tile:
the knobs of rows whose length admits no vectors (odd N).
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
from pyfuser.schedule.schedulers import inner_outer_persistent as io


def default_params(fd, inputs, device_props):
    clone, info = heuristic_info(fd.fusion, inputs, device_props)
    return io.compute_heuristics(clone, info)


def thread_variants(p, N, sms):
    """Register-row variants: elements per thread, blocks per SM, where the column partials
    live, and phase-2 tiles."""
    for cols in (4, 8):
        yield f"registers col_vector {cols}", dataclasses.replace(
            p, stages=0, prefetch=0, tma_inputs=(), col_vector=cols)
    for batch in (8, 11, 16):
        bdimx = -(-N // (batch * p.vector))
        threads = -(-bdimx // 32) * 32
        for per_sm in (1, 2):
            if threads * per_sm > 2048:
                continue
            grid = sms * per_sm
            for shared in (False, True):
                where = "shared memory" if shared else "registers"
                yield (f"registers P{batch} x {bdimx} threads, {per_sm} block(s)/SM, column "
                       f"partials in {where}",
                       dataclasses.replace(p, stages=0, prefetch=0, tma_inputs=(),
                                           persistent_batch=batch, bdimx=bdimx, grid=grid,
                                           blocks_per_sm=per_sm, partials_in_shared=shared,
                                           col_vector=io.phase2_columns(N, grid, bdimx)))


def variants(p, N, sms, kinds):
    if "threads" in kinds:
        yield from thread_variants(p, N, sms)
    """(label, params) to time. `p` is the heuristic's multi-wave or warp-specialized choice."""
    rows = (0, 1)           # x and dy of rmsnorm_bwd / layernorm_bwd
    stage = 2 * N * 2       # one row of each, bf16
    if p.warp_specialized:
        if "ws" not in kinds:
            return
        for y in (1, 2, 3, 4, 6):
            if p.bdimx * y not in (256, 384):
                continue
            for stages in (2, 3, 4, 6, 8):
                if stages * y * stage > 219 * 1024:
                    continue
                yield (f"ws s{stages} y{y}",
                       dataclasses.replace(p, stages=stages, prefetch=stages - 1, compute_rows=y))
        return
    if "registers" in kinds:
        yield "registers", dataclasses.replace(p, stages=0, prefetch=0, tma_inputs=())
    if "tma" in kinds and not p.partials_in_shared:
        for stages in (2, 3, 4):
            for per_sm in (1, 2):
                if per_sm * (stages * stage + 8 * 1024) > 228 * 1024:
                    continue
                yield (f"tma s{stages} g{per_sm}x",
                       dataclasses.replace(p, stages=stages, prefetch=stages - 1,
                                           tma_inputs=rows, grid=sms * per_sm))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*", default=["rmsnorm_bwd", "layernorm_bwd"])
    ap.add_argument("--shapes", default="16384x1024,16384x4096,16384x16384")
    ap.add_argument("--kinds", default="registers,tma,ws",
                    help="variants to time: registers (multi-wave, register rows), tma "
                         "(multi-wave, rows through a TMA circular buffer), ws (warp-specialized), "
                         "threads (register rows: elements per thread, blocks per SM, phase-2 "
                         "tiles)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
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
            fd = catalogue.define(op, args.dtype)
            nbytes = catalogue.get(op).min_bytes(M, N, 2)
            sets = _input_sets(op, M, N, args.dtype, nbytes)
            todo = []
            for kind, over in (("multi-wave", {"disable": ["ws_normalization"]}),
                               ("warp-specialized", {"enable": ["ws_normalization"]})):
                if kind == "warp-specialized" and "ws" not in kinds:
                    continue
                with pf_options.override(**over):
                    q = default_params(fd, sets[0], props)
                if kind == "warp-specialized" and not q.warp_specialized:
                    print(f"{op} {M}x{N} ws: not possible: {q.reason}", flush=True)
                    continue
                todo.append((f"{kind} (heuristic)", q))
                if not args.defaults_only:
                    todo += list(variants(q, N, props.sm_count, kinds))
            for label, p in todo:
                print(f"{op} {M}x{N} " + time_forced_heuristic(fd, sets, p, label, nbytes),
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
