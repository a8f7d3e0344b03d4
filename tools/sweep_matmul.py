"""Sweep the matmul kernel's tile shapes on shapes of issues 20-21,
beside cuBLAS in the same run, to ground the heuristic's choice (GPU machine):

    PYTHONPATH=. python tools/sweep_matmul.py [MxNxK ...] [--pingpong]

y = x @ w^T (x [M, K], w [N, K], bf16). Each variant is forced through options["heuristic"]
(the heuristic's own choice, with the tile, stages, grid and kind replaced), checked
against float32, and timed as a CUDA graph of one call (the GPU's time alone: do_bench median,
L2 cleared), in turn with cuBLAS. The heuristic's own choice is marked "*".
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from pyfuser import DataType, FusionDefinition

SHAPES = [(3000, 2056, 1032), (64, 4096, 4096), (1, 4096, 4096), (4096, 14336, 5120),
          (1000, 1000, 1000), (8192, 3072, 8192), (16384, 256, 4096)]
TILES = [(128, 64), (128, 128), (128, 192), (128, 256)]
PINGPONG = "--pingpong" in sys.argv
# The kernel at any M (matmuls of 64 rows or fewer run torch unless asked).
KERNEL = {"enable": ["matmul_few_rows"]}


def linear_fusion() -> FusionDefinition:
    with FusionDefinition("linear") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def _graphed(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def variants(chosen, m, n):
    """The heuristic's choice with each tile of TILES (stages to fill shared memory, grid
    min(tiles, 132)), and with --pingpong each tile of n <= 128 as ping-pong too."""
    for tm, tn in TILES:
        stage_bytes = (tm + tn) * 64 * 2
        boxes = 2 if (tn // 64) % 2 == 0 else 1
        stages = min(6, (232448 - 2 * boxes * 8192 - 2048) // stage_bytes)
        tiles = -(-m // tm) * -(-n // tn)
        p = dataclasses.replace(chosen, tile_m=tm, tile_n=tn, stages=stages, compute_roles=1,
                                grid=max(1, min(tiles, 132)))
        yield p
        if tn <= 128 and PINGPONG:      # ping-pong: each warp group a whole tile
            yield dataclasses.replace(p, compute_roles=2)


def main(argv) -> int:
    from pyfuser.benchmark.harness import _bench
    words = [a for a in argv if not a.startswith("--")]
    shapes = [tuple(int(v) for v in w.split("x")) for w in words] or SHAPES
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("MxNxK | variant | pyfuser us (graph) | cuBLAS us (graph) | ratio | TFLOP/s | rel. error")
    print("--- | --- | --- | --- | --- | --- | ---")
    fd = linear_fusion()
    for m, n, k in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = x.float() @ w.float().t()
        fd.execute([x, w], options=KERNEL)
        chosen = fd.last_run.heuristics[0]
        cublas = _graphed(lambda: torch.matmul(x, w.t()))
        flops = 2 * m * n * k
        for p in variants(chosen, m, n):
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
