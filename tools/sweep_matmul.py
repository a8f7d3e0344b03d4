"""Sweep the matmul kernel's tile shapes on shapes of issues 20-21,
beside cuBLAS in the same run, to ground the heuristic's choice (GPU machine):

    PYTHONPATH=. python tools/sweep_matmul.py [MxNxK ...] [--pingpong] [--split=1,2,4,8]
        [--tiles=128x128,128x256] [--l2=256,128,0] [--boxes=0,all] [--cluster=1,m2,n2]
        [--stages=6,8] [--stream]

y = x @ w^T (x [M, K], w [N, K], bf16). Each variant is forced through options["heuristic"]
(the heuristic's own choice, with the tile, stages, grid and kind replaced), checked
against float32, and timed as a CUDA graph of one call (the GPU's time alone: do_bench median,
L2 cleared), in turn with cuBLAS. The heuristic's own choice is marked "*". --split: each
variant with each of these split-K factors too (those matmul.split_k_choices offers for it).
"""
from __future__ import annotations

import sys

import torch

from bench_issue20 import _graphed, linear_fusion

SHAPES = [(3000, 2056, 1032), (64, 4096, 4096), (1, 4096, 4096), (4096, 14336, 5120),
          (1000, 1000, 1000), (8192, 3072, 8192), (16384, 256, 4096)]
TILES = [(128, 64), (128, 128), (128, 192), (128, 256)]
PINGPONG = "--pingpong" in sys.argv
SPLITS = next((tuple(int(v) for v in a.split("=", 1)[1].split(",")) for a in sys.argv
               if a.startswith("--split=")), (1,))
TILES = next(([tuple(int(v) for v in w.split("x")) for w in a.split("=", 1)[1].split(",")]
              for a in sys.argv if a.startswith("--tiles=")), TILES)
# --l2=256,128,0: the tensor maps' L2 promotion, rows on sectors or not (runtime/tensor_map.
# TILE_L2_PROMOTION and TILE_L2_PROMOTION_MID_SECTOR),
# each value with fresh plans (the maps are encoded when a plan is made).
# --cluster=1,m2,n2: each variant in clusters of these CTAs along M (m2, or 2:
# MatmulParams.cluster_m, B multicast to the cluster) or N (n2: cluster_n, A multicast), where
# the shared tile splits into that many shares.
CLUSTERS = next((tuple(("n", int(v[1:])) if v.startswith("n") else ("m", int(v.lstrip("m")))
                       for v in a.split("=", 1)[1].split(",")) for a in sys.argv
                 if a.startswith("--cluster=")), (("m", 1),))
L2 = next((tuple(int(v) for v in a.split("=", 1)[1].split(",")) for a in sys.argv
           if a.startswith("--l2=")), (None,))
# --boxes=auto,0,3: the epilogue's staging boxes per warp group (MatmulParams.epilogue_boxes;
# auto fitted_params' choice, 0 the default rule, "all" the boxes of a tile), each count
# dividing a tile's boxes.
# --stages=6,8: each variant with these stage counts too (where the shared memory holds them
# beside the staging boxes; fitted_params gives at most matmul.MAX_STAGES).
STAGES = next((tuple(int(v) for v in a.split("=", 1)[1].split(",")) for a in sys.argv
               if a.startswith("--stages=")), (None,))
# --stream: each cooperative tile as stream-K too (matmul.stream_k_choice's CTAs per tile).
STREAM = "--stream" in sys.argv
BOXES = next((tuple(a.split("=", 1)[1].split(",")) for a in sys.argv
              if a.startswith("--boxes=")), ("auto",))
# The kernel at any M (matmuls of 64 rows or fewer run torch unless asked).
KERNEL = {"enable": ["matmul_few_rows"]}


def variants(chosen, m, n, k, dev):
    """Each tile of TILES fitted as the heuristic fits its own choice (matmul.fitted_params:
    stages, grid on `dev`), cooperative, and with --pingpong each tile of n <= 128 as
    ping-pong too; each with the split-K factors of --split that split_k_choices offers."""
    from pyfuser.schedule.schedulers import matmul
    for tm, tn in TILES:
        for roles in (1, 2) if PINGPONG and tn <= 128 else (1,):
            tiles = -(-m // tm) * -(-n // tn)
            shape = matmul.TileShape(tm, tn, roles, 0, 0)
            offered = (1,) + matmul.split_k_choices(shape, tiles, -(-k // matmul.TILE_K),
                                                    dev.sm_count, True)
            per_tile = matmul.MatmulParams(tile_m=tm, tile_n=tn,
                                           compute_roles=roles).boxes_per_tile
            counts = list(dict.fromkeys(
                None if b == "auto" else per_tile if b == "all" else int(b) for b in BOXES))
            for s in SPLITS:
                for boxes in counts:
                    for along, c in CLUSTERS:
                        if s in offered and (not boxes or per_tile % boxes == 0) and (
                                c == 1 or (s == 1 and (tn if along == "m" else tm) % c == 0)):
                            for stages in STAGES:
                                p = matmul.fitted_params(
                                    tm, tn, roles, tiles, dev, 2, chosen.b_major,
                                    chosen.output_bytes, s, chosen.a_major, boxes,
                                    cluster_m=c if along == "m" else 1,
                                    cluster_n=c if along == "n" else 1,
                                    max_stages=stages or matmul.MAX_STAGES)
                                if stages is None or p.stages == stages:   # else: no room
                                    yield p
            sk = matmul.stream_k_choice(shape, tiles, -(-k // matmul.TILE_K), dev.sm_count)
            if STREAM and sk:
                yield matmul.fitted_params(tm, tn, roles, tiles, dev, 2, chosen.b_major,
                                           chosen.output_bytes, 1, chosen.a_major,
                                           stream_k=sk)


def main(argv) -> int:
    from pyfuser.benchmark.harness import _bench
    words = [a for a in argv if not a.startswith("--")]
    shapes = [tuple(int(v) for v in w.split("x")) for w in words] or SHAPES
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("MxNxK | variant | pyfuser us (graph) | cuBLAS us (graph) | ratio | TFLOP/s | rel. error")
    print("--- | --- | --- | --- | --- | --- | ---")
    from pyfuser.runtime.device import query_device
    dev = query_device()
    from pyfuser.runtime import tensor_map
    for m, n, k, l2 in [(*s, l2) for s in shapes for l2 in L2]:
        if l2 is not None:
            tensor_map.TILE_L2_PROMOTION = tensor_map.TILE_L2_PROMOTION_MID_SECTOR = l2
            print(f"# operand maps' L2 promotion: {l2} bytes", flush=True)
        fd = linear_fusion()
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = x.float() @ w.float().t()
        fd.execute([x, w], options=KERNEL)
        chosen = fd.last_run.heuristics[0]
        cublas = _graphed(lambda: torch.matmul(x, w.t()))
        flops = 2 * m * n * k
        for p in variants(chosen, m, n, k, dev):
            opts = {"heuristic": p, **KERNEL}
            try:
                y = fd.execute([x, w], options=opts)[0]
            except Exception as e:      # noqa: BLE001 - a variant that fails is reported
                print(f"{m}x{n}x{k} | {p.describe()} | failed: {type(e).__name__}: {e}"[:300])
                continue
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            mine = _graphed(lambda: fd.execute([x, w], options=opts))
            t_me, t_cu = [], []
            for _ in range(3):
                t_me.append(_bench(mine, reps=1))
                t_cu.append(_bench(cublas, reps=1))
            me, cu = sorted(t_me)[1], sorted(t_cu)[1]
            mark = "*" if p == chosen else ""
            print(f"{m}x{n}x{k} | {mark}{p.describe()} | {me * 1e3:.1f} | {cu * 1e3:.1f} | "
                  f"{cu / me:.2f} | {flops / me / 1e9:.0f} | {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
