"""The bar of the Hopper matmul issue: y = x @ w^T (bf16 in and out, x [M, K], w [N, K]: the
torch Linear weight layout) through pyfuser's generated kernel, beside torch.matmul (cuBLAS)
and torch.compile of it, in one run (GPU machine); or each shape's plan on the CPU:

    PYTHONPATH=. python tools/bench_issue20.py [MxNxK..] [--a-mn] [--pingpong | --no-cluster]
        # GPU: TFLOP/s (all bar shapes by default; --a-mn: x column-major)
    PYTHONPATH=. python tools/bench_issue20.py --explain   # CPU: the plan of each shape (H100)

TFLOP/s count 2 M N K. Times are medians of triton's do_bench (pyfuser.benchmark.harness._bench,
which clears the L2 before each run; pyfuser and cuBLAS in turn three times, the median of
each) of the whole call (fd.execute: host work included, as a
user calls it), and of a CUDA graph of one call replayed (the GPU's time alone). Before timing, pyfuser's output is checked against float32 (relative error of
the largest element) and the plan is printed (a library segment would be torch itself). With
no shape given, issue 21's MN-major rows follow (c = a @ b, b row-major [K, N]).
"""
from __future__ import annotations

import sys

import torch

from pyfuser import DataType, FusionDefinition

BAR_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 8192), (8192, 3072, 8192),
              (16384, 8192, 2048), (16384, 256, 4096), (8192, 8192, 64), (1000, 1000, 1000)]


# Issue 21's MN-major bar row (b row-major [K, N], torch.matmul(a, b)) and its batched row
# (3 x [4096, 5120] @ [5120, 14336]), reported beside.
MN_MAJOR_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096)]
BATCHED_SHAPES = [(3, 4096, 14336, 5120)]


def matmul_fusion(batched: bool = False) -> FusionDefinition:
    shape = [-1, -1, -1] if batched else [-1, -1]
    with FusionDefinition("matmul") as fd:
        a = fd.define_tensor(shape=shape, dtype=DataType.BFloat16)
        b = fd.define_tensor(shape=shape, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.matmul(a, b))
    return fd


def linear_fusion(x_stride_order=None) -> FusionDefinition:
    """y = x @ w^T; `x_stride_order` (define_tensor's) for a column-major x: [0, 1]."""
    with FusionDefinition("linear") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16,
                             stride_order=x_stride_order)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.linear(x, w))
    return fd


def _shapes(argv) -> list:
    words = [a for a in argv if not a.startswith("--")]
    return [tuple(int(v) for v in w.split("x")) for w in words] or BAR_SHAPES


def explain(shapes) -> int:
    fd = linear_fusion()
    for m, n, k in shapes:
        x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
        w = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
        print(f"== {m}x{n}x{k}\n{fd.explain([x, w], device='h100', compile=True)}\n")
    return 0


def _graphed(fn):
    """fn captured in a CUDA graph (after a warm-up call); the replay, to time."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def bench(shapes) -> int:
    from pyfuser.benchmark.harness import _bench
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("MxNxK | pyfuser TFLOP/s | cuBLAS TFLOP/s | compile TFLOP/s | pyfuser / cuBLAS | "
          "pyfuser graph | cuBLAS graph | graph ratio | rel. error | plan")
    print("--- | --- | --- | --- | --- | --- | --- | --- | --- | ---")
    cases = [((1,) + s, False) for s in shapes]
    if shapes is BAR_SHAPES:
        cases += [((1,) + s, True) for s in MN_MAJOR_SHAPES]
        cases += [(s, True) for s in BATCHED_SHAPES]
    for (batch, m, n, k), mn_major in cases:
        fd = matmul_fusion(batch > 1) if mn_major else linear_fusion([0, 1] if A_MN else None)
        g = torch.Generator(device="cuda").manual_seed(0)
        lead = (batch,) if batch > 1 else ()
        if A_MN:            # a column-major x: the kernel reads A MN-major
            x = torch.randn(*lead, k, m, device="cuda", dtype=torch.bfloat16,
                            generator=g).transpose(-1, -2)
        else:
            x = torch.randn(*lead, m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        if mn_major:
            w = torch.randn(*lead, k, n, device="cuda", dtype=torch.bfloat16, generator=g)
            wt = w
        else:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
            wt = w.t()
        y = fd.execute([x, w])[0]
        run = fd.last_run
        ref = x.float() @ wt.float()
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()

        def cublas():
            return torch.matmul(x, wt)
        torch._dynamo.reset()           # one compiled function per shape, never a recompile
        compiled = torch.compile(cublas, dynamic=False)
        flops = 2 * batch * m * n * k
        # pyfuser and cuBLAS timed in turn, three times each, each the median of its three:
        # clocks and power drift over a run by several percent.
        rounds: dict = {"pyfuser": [], "cublas": []}
        if VARIANT:
            label, opts = VARIANT
            rounds[label] = []
            fd.execute([x, w], options=opts)
            pp_run = fd.last_run
        for _ in range(3):
            rounds["pyfuser"].append(_bench(lambda: fd.execute([x, w])))
            rounds["cublas"].append(_bench(cublas))
            if VARIANT:
                rounds[label].append(_bench(lambda: fd.execute([x, w], options=opts)))
        t = {name: sorted(v)[1] for name, v in rounds.items()}
        try:
            compiled()
            t["compile"] = _bench(compiled)
        except Exception as e:      # noqa: BLE001 - a peer that fails is reported, not fatal
            print(f"# compile failed: {type(e).__name__}: {e}"[:300])
        # The GPU time alone: each call captured in a CUDA graph and replayed (pyfuser's host
        # work per call is ~10 us, a 1000^3 matmul's whole time on the GPU).
        for name, fn in (("pyfuser graph", lambda: fd.execute([x, w])), ("cublas graph", cublas)):
            try:
                t[name] = _bench(_graphed(fn))
            except Exception as e:      # noqa: BLE001
                print(f"# {name} failed: {type(e).__name__}: {e}"[:300])
        tf = {name: flops / ms / 1e9 for name, ms in t.items()}
        plan = ", ".join(f"{s.kind}:{s.name}" for s in run.segments) or ",".join(run.schedulers)
        nan = float("nan")
        heuristics = "; ".join(h.describe() if hasattr(h, "describe") else repr(h)
                               for h in run.heuristics)
        if VARIANT:
            pp = tf[label]
            heuristics = (f"{label} {pp:.0f} TFLOP/s ({pp / tf['cublas']:.2f} of cuBLAS; "
                          f"{pp_run.heuristics[0].describe()}); " + heuristics)
        name = (f"{batch}x" * (batch > 1) + f"{m}x{n}x{k}{' A MN-major' if A_MN else ''}"
                f"{' B MN-major' if mn_major else ''}")
        print(f"{name} | {tf['pyfuser']:.0f} | "
              f"{tf['cublas']:.0f} | "
              f"{tf.get('compile', nan):.0f} | {tf['pyfuser'] / tf['cublas']:.2f} | "
              f"{tf.get('pyfuser graph', nan):.0f} | {tf.get('cublas graph', nan):.0f} | "
              f"{tf.get('pyfuser graph', nan) / tf.get('cublas graph', nan):.2f} | "
              f"{err:.1e} | {run.kind}: {plan} {heuristics}", flush=True)
    return 0


# --pingpong: also time the ping-pong variant (options feature matmul_pingpong) in each round;
# --no-cluster: the kernel without clusters (feature matmul_cluster off).
PINGPONG = "--pingpong" in sys.argv
PINGPONG_ON = {"enable": ["matmul_pingpong"]}
VARIANT = (("ping-pong", PINGPONG_ON) if PINGPONG else
           ("no cluster", {"disable": ["matmul_cluster"]}) if "--no-cluster" in sys.argv
           else None)
# --a-mn: x column-major (x.t() of a row-major [K, M]), read by the kernel as an MN-major A.
A_MN = "--a-mn" in sys.argv

if __name__ == "__main__":
    chosen = _shapes(sys.argv[1:])
    raise SystemExit(explain(chosen) if "--explain" in sys.argv else bench(chosen))
