"""Matmuls of few rows (GPU machine): linear(x, W) and gelu_tanh(linear(x, W, b)) over M rows of
x (bf16), pyfuser's plan beside the same fusion with the rewrite off (torch's matmul, then the
epilogue kernel), eager, torch.compile and the bare cuBLAS matmul, in one run:

    PYTHONPATH=. python tools/bench_few_rows.py [--max-rows=R] [--x-row] [--kind=linear|bias_gelu ..] [MxNxK ..]

--x-row defines x as [1, K] (a size-1 dim, as fd.from_pytorch gives a row; the rewrite squeezes
it and the reduction streams W past L1) instead of [-1, K]. --max-rows=R sets schedule/few_row_matmuls.REDUCTION_MAX_ROWS for this process (to measure the
rewrite beyond its limit). Times are medians of triton's do_bench (harness._bench, L2 cleared
before each run), all in turn three times, the median of each; GB/s counts W, x and the output
once. Each pyfuser result is checked against float64 first (max error over max |y|).
"""
from __future__ import annotations

import sys

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.schedule import few_row_matmuls

SHAPES = [(1, 4096, 4096), (1, 14336, 5120), (1, 4096, 14336), (1, 16384, 4096)]
OFF = {"disable": ["matmul_as_reduction"]}


def fusion(kind: str, x_row: bool = False) -> FusionDefinition:
    with FusionDefinition(f"few_rows_{kind}") as fd:
        x = fd.define_tensor(shape=[1 if x_row else -1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        if kind == "bias_gelu":
            b = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
            y = fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh")
        else:
            y = fd.ops.linear(x, w)
        fd.add_output(y)
    return fd


def main(argv) -> int:
    from pyfuser.benchmark.harness import _bench
    for a in argv:
        if a.startswith("--max-rows="):
            few_row_matmuls.REDUCTION_MAX_ROWS = int(a.split("=", 1)[1])
    kinds = [a.split("=", 1)[1] for a in argv if a.startswith("--kind=")] or ["linear",
                                                                               "bias_gelu"]
    shapes = [tuple(int(v) for v in w.split("x")) for w in argv if not w.startswith("--")] \
        or SHAPES
    F = torch.nn.functional
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"REDUCTION_MAX_ROWS {few_row_matmuls.REDUCTION_MAX_ROWS}, x defined as "
          + ("[1, K]" if "--x-row" in argv else "[-1, K]"))
    print("case | pyfuser us | rewrite off us | eager us | compile us | cuBLAS matmul us | "
          "pyfuser GB/s | best peer / pyfuser | cuBLAS / pyfuser | rel. error | plan")
    print("--- | --- | --- | --- | --- | --- | --- | --- | --- | --- | ---")
    for kind in kinds:
        fd = fusion(kind, "--x-row" in argv)
        for m, n, k in shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) * k ** -0.5
            b = torch.randn(n, dtype=torch.bfloat16, device="cuda", generator=g)
            ins = [x, w, b] if kind == "bias_gelu" else [x, w]
            ours = fd.execute(ins)[0]
            run = fd.last_run
            ref = F.linear(x.double(), w.double(), b.double() if kind == "bias_gelu" else None)
            if kind == "bias_gelu":
                ref = F.gelu(ref, approximate="tanh")
            err = ((ours.double() - ref).abs().max() / ref.abs().max()).item()
            fd.execute(ins, options=OFF)
            off_run = fd.last_run

            def eager():
                y = F.linear(x, w, b if kind == "bias_gelu" else None)
                return F.gelu(y, approximate="tanh") if kind == "bias_gelu" else y
            torch._dynamo.reset()
            compiled = torch.compile(eager, dynamic=False)
            compiled()
            fns = {"pyfuser": lambda: fd.execute(ins),
                   "off": lambda: fd.execute(ins, options=OFF),
                   "eager": eager, "compile": compiled, "matmul": lambda: torch.matmul(x, w.t())}
            rounds = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    rounds[name].append(_bench(fn) * 1e3)
            t = {name: sorted(v)[1] for name, v in rounds.items()}
            best = min(t["eager"], t["compile"])
            gbs = (n * k + m * k + m * n) * 2 / (t["pyfuser"] * 1e-6) / 1e9
            plan = ", ".join(f"{s.kind}:{s.name}" for s in run.segments) or \
                ",".join(run.schedulers)
            off_plan = ", ".join(f"{s.kind}:{s.name}" for s in off_run.segments) or \
                ",".join(off_run.schedulers)
            print(f"{kind} {m}x{n}x{k} | {t['pyfuser']:.1f} | {t['off']:.1f} | {t['eager']:.1f} | "
                  f"{t['compile']:.1f} | {t['matmul']:.1f} | {gbs:.0f} | "
                  f"{best / t['pyfuser']:.2f} | {t['matmul'] / t['pyfuser']:.2f} | {err:.1e} | "
                  f"{plan} ({run.heuristics[0].describe() if run.heuristics else ''}); "
                  f"rewrite off: {off_plan}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
