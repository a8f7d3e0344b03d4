"""Attention-style scores over two batch dims (GPU machine): scores = q @ k^T * scale + mask
with q, k of [B, S, H, D] viewed per head ([B, H, S, D], batch strides not nested) and a mask
of [B, 1, S, S], bf16, as one pyfuser kernel (4-D tensor maps, the epilogue fused) beside
eager and torch.compile of the same function and the bare matmul (cuBLAS), in one run:

    PYTHONPATH=. python tools/bench_batch_dims.py [--permute] [BxHxSxD ...]

Times are medians of do_bench (L2 cleared) of the whole call, in turn, three rounds."""
from __future__ import annotations

import sys

import torch

from pyfuser import FusionDefinition

SHAPES = [(4, 16, 1024, 128), (2, 32, 2048, 128), (8, 8, 512, 64)]
# --permute: k passed as [B, H, S, D] and permuted in the fusion (a view segment of the plan).
PERMUTE_IN_FUSION = "--permute" in sys.argv


def main(argv) -> int:
    from pyfuser.benchmark.harness import _bench
    words = [a for a in argv if not a.startswith("--")]
    shapes = [tuple(int(v) for v in w.split("x")) for w in words] or SHAPES
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("BxHxSxD | pyfuser ms | eager ms | compile ms | bare matmul ms | best peer / pyfuser | "
          "rel. error | plan")
    print("--- | --- | --- | --- | --- | --- | --- | ---")
    for bsz, h, s, d in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16,
                        generator=g).transpose(1, 2)
        k = torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16,
                        generator=g).permute(0, 2, 3, 1)
        mask = torch.randn(bsz, 1, s, s, device="cuda", dtype=torch.bfloat16, generator=g)
        scale = d ** -0.5
        # --permute: the fusion takes k per head, [B, H, S, D], and permutes it itself.
        k_in = k.transpose(2, 3) if PERMUTE_IN_FUSION else k
        with FusionDefinition("scores") as fd:
            tq, tk, tm = (fd.from_pytorch(t) for t in (q, k_in, mask))
            if PERMUTE_IN_FUSION:
                tk = fd.ops.permute(tk, [0, 1, 3, 2])
            fd.add_output(fd.ops.matmul(tq, tk) * scale + tm)
        inputs = [q, k_in, mask]
        y = fd.execute(inputs)[0]
        ref = (q.double() @ k.double()) * scale + mask.double()
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        run = fd.last_run
        plan = f"{run.num_kernels} kernel(s) {run.schedulers}, segments {run.segments}, " + (
            run.heuristics[0].describe() if run.heuristics and hasattr(
                run.heuristics[0], "describe") else "")

        def eager():
            return torch.matmul(q, k) * scale + mask
        compiled = torch.compile(eager, dynamic=False)
        runs = {"pyfuser": lambda: fd.execute(inputs), "eager": eager, "compile": compiled,
                "bare": lambda: torch.matmul(q, k)}
        for fn in runs.values():
            fn()
        times = {name: [] for name in runs}
        for _ in range(3):
            for name, fn in runs.items():
                times[name].append(_bench(fn, reps=1))
        t = {name: sorted(v)[1] for name, v in times.items()}
        best = min(t["eager"], t["compile"])
        print(f"{bsz}x{h}x{s}x{d} | {t['pyfuser']:.3f} | {t['eager']:.3f} | {t['compile']:.3f} "
              f"| {t['bare']:.3f} | {best / t['pyfuser']:.2f} | {err:.1e} | {plan}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
