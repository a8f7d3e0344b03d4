"""The fused-epilogue bars of issue 21 (GPU machine): gelu_tanh(x @ W^T + b) and x @ W^T + r
(bf16, x [M, K], W [N, K]) as one pyfuser kernel, beside eager, torch.compile (and with
--autotune torch.compile(mode="max-autotune-no-cudagraphs")) of the same function and the bare
cuBLAS matmul x @ W^T, in one run:

    PYTHONPATH=. python tools/bench_issue21.py [--autotune] [--kinds] [--kind=NAME..] [MxNxK..]
    PYTHONPATH=. python tools/bench_issue21.py --explain           # CPU: the plans (H100)

Times are medians of triton's do_bench (pyfuser.benchmark.harness._bench, L2 cleared before
each run) of the whole call, pyfuser and the peers in turn three times, the median of each.
The bar: pyfuser at least 1.10x the best peer's speed and at most 1.06x the bare matmul's time.
--kinds: also pyfuser with ping-pong forced on and forced off (options feature matmul_pingpong),
timed in the same rounds (the heuristic's cost model counts no epilogue).
--no-cluster: also pyfuser without clusters of CTAs (options feature matmul_cluster off).
--kind=NAME (repeatable): the fusions measured, of FUSIONS (default bias_gelu and residual);
bias_gelu_preact stores the pre-activation x @ W^T + b beside its GELU (two outputs);
bias_gelu_f32 stores the GELU in fp32 (the output cast fused, 4-byte stores).
"""
from __future__ import annotations

import sys

import torch

from pyfuser import DataType, FusionDefinition

SHAPES = [(8192, 16384, 4096), (4096, 14336, 5120), (3000, 2056, 1032)]


def fusion(kind: str) -> FusionDefinition:
    with FusionDefinition(kind) as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        if kind == "bias_gelu":
            b = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
            y = fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh")
        elif kind == "bias_gelu_preact":
            b = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
            h = fd.ops.linear(x, w, b)
            fd.add_output(h)
            y = fd.ops.gelu(h, approximate="tanh")
        elif kind == "bias_gelu_f32":
            b = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
            y = fd.ops.cast(fd.ops.gelu(fd.ops.linear(x, w, b), approximate="tanh"),
                            DataType.Float)
        else:
            r = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
            y = fd.ops.linear(x, w) + r
        fd.add_output(y)
    return fd


def inputs(kind, m, n, k, device):
    g = torch.Generator(device=device).manual_seed(0) if device != "meta" else None

    def randn(*shape, scale=1.0):
        if device == "meta":
            return torch.empty(shape, dtype=torch.bfloat16, device="meta")
        return torch.randn(*shape, dtype=torch.bfloat16, device=device, generator=g) * scale
    x, w = randn(m, k), randn(n, k, scale=k ** -0.5)
    return [x, w, randn(n) if kind.startswith("bias_gelu") else randn(m, n)]


def eager_fn(kind, x, w, extra):
    F = torch.nn.functional
    if kind == "bias_gelu":
        return lambda: F.gelu(F.linear(x, w, extra), approximate="tanh")
    if kind == "bias_gelu_f32":
        return lambda: F.gelu(F.linear(x, w, extra), approximate="tanh").float()
    if kind == "bias_gelu_preact":
        def both():
            h = F.linear(x, w, extra)
            return h, F.gelu(h, approximate="tanh")
        return both
    return lambda: F.linear(x, w) + extra


FUSIONS = ("bias_gelu", "residual", "bias_gelu_preact", "bias_gelu_f32")


def _kinds(argv) -> list:
    named = [a.split("=", 1)[1] for a in argv if a.startswith("--kind=")]
    unknown = [k for k in named if k not in FUSIONS]
    if unknown:
        raise SystemExit(f"unknown --kind {unknown}; one of {FUSIONS}")
    return named or ["bias_gelu", "residual"]


def _shapes(argv):
    words = [a for a in argv if not a.startswith("--")]
    return [tuple(int(v) for v in w.split("x")) for w in words] or SHAPES


def explain(shapes) -> int:
    for kind in _kinds(sys.argv[1:]):
        for m, n, k in shapes:
            print(f"== {kind} {m}x{n}x{k}\n"
                  f"{fusion(kind).explain(inputs(kind, m, n, k, 'meta'), device='h100')}\n")
    return 0


def bench(shapes, autotune: bool) -> int:
    from pyfuser.benchmark.harness import _bench
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("case | pyfuser ms | eager ms | compile ms | autotune ms | best peer / pyfuser | "
          "pyfuser / bare matmul | max rel. diff | plan")
    print("--- | --- | --- | --- | --- | --- | --- | --- | ---")
    for kind in _kinds(sys.argv[1:]):
        fd = fusion(kind)
        for m, n, k in shapes:
            x, w, extra = inputs(kind, m, n, k, "cuda")
            ours = fd.execute([x, w, extra])[-1]
            run = fd.last_run
            eager = eager_fn(kind, x, w, extra)
            ref = eager()
            ref = ref[-1] if isinstance(ref, tuple) else ref
            diff = ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            torch._dynamo.reset()
            peers = {"eager": eager, "compile": torch.compile(eager, dynamic=False)}
            if autotune:
                peers["autotune"] = torch.compile(eager, dynamic=False,
                                                  mode="max-autotune-no-cudagraphs")
            for fn in peers.values():
                fn()
            fns = {"pyfuser": lambda: fd.execute([x, w, extra]), **peers,
                   "matmul": lambda: torch.matmul(x, w.t())}
            if KINDS:
                for name, opts in KINDS.items():
                    fd.execute([x, w, extra], options=opts)
                    fns[name] = lambda opts=opts: fd.execute([x, w, extra], options=opts)
            rounds = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    rounds[name].append(_bench(fn))
            t = {name: sorted(v)[1] for name, v in rounds.items()}
            best = min(v for name, v in t.items()
                       if name not in ("pyfuser", "matmul", *KINDS))
            plan = ", ".join(f"{s.kind}:{s.name}" for s in run.segments) or \
                ",".join(run.schedulers)
            nan = float("nan")
            print(f"{kind} {m}x{n}x{k} | {t['pyfuser']:.3f} | {t['eager']:.3f} | "
                  f"{t['compile']:.3f} | {t.get('autotune', nan):.3f} | "
                  f"{best / t['pyfuser']:.2f} | {t['pyfuser'] / t['matmul']:.3f} | {diff:.1e} | "
                  f"{run.kind}: {plan} {run.heuristics[0].describe() if run.heuristics else ''}"
                  + "".join(f"; {name} {t[name]:.3f} ms ({best / t[name]:.2f} of the best peer, "
                            f"{t[name] / t['matmul']:.3f} of the bare matmul)" for name in KINDS),
                  flush=True)
    return 0


KINDS = ({"ping-pong": {"enable": ["matmul_pingpong"]},
          "cooperative": {"disable": ["matmul_pingpong"]}} if "--kinds" in sys.argv else {})
# --no-cluster: also pyfuser without clusters (options feature matmul_cluster off).
if "--no-cluster" in sys.argv:
    KINDS["no cluster"] = {"disable": ["matmul_cluster"]}

if __name__ == "__main__":
    chosen = _shapes(sys.argv[1:])
    raise SystemExit(explain(chosen) if "--explain" in sys.argv
                     else bench(chosen, "--autotune" in sys.argv))
