"""The plan bars of the issue "A plan of kernels", same run as the peers (GPU machine).

    PYTHONPATH=. python tools/bench_plans.py

1. linear + bias + tanh-GELU, x [8192, 4096], W [16384, 4096], b [16384] bf16: pyfuser's plan
   (a cuBLAS segment, then the epilogue kernel) against eager (F.linear + F.gelu) and
   torch.compile of the same function.
2. softmax over rows whose result is also summed over columns, x [16384, 4096] bf16 (outputs
   softmax bf16 and column sum fp32): pyfuser's plan against eager and torch.compile.
Times are medians of triton's do_bench (pyfuser.benchmark.harness._bench), in ms; each line
says what pyfuser ran (RunInfo.segments).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pyfuser import DataType, FusionDefinition
from pyfuser.benchmark.harness import _bench

BF16, F32 = DataType.BFloat16, DataType.Float


def linear_gelu():
    M, K, N = 8192, 4096, 16384
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) / 64
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g)
    with FusionDefinition("linear_bias_gelu") as fd:
        y = fd.ops.linear(fd.from_pytorch(x), fd.from_pytorch(w), fd.from_pytorch(b))
        fd.add_output(fd.ops.cast(fd.ops.gelu(fd.ops.cast(y, F32), approximate="tanh"), BF16))

    def eager():
        return F.gelu(F.linear(x, w, b), approximate="tanh")
    compiled = torch.compile(eager, dynamic=False)
    (out,) = fd.execute([x, w, b])
    err = ((out.double() - eager().double()).norm() / eager().double().norm()).item()
    t = {"pyfuser": _bench(lambda: fd.execute([x, w, b])), "eager": _bench(eager),
         "torch.compile": _bench(compiled),
         "cuBLAS linear alone": _bench(lambda: F.linear(x, w, b))}
    return "linear+bias+gelu_tanh 8192x4096 @ 16384x4096 bf16", t, fd.last_run, err


def softmax_colsum():
    M, N = 16384, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    with FusionDefinition("softmax_colsum") as fd:
        xf = fd.ops.cast(fd.from_pytorch(x), F32)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        s = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        fd.add_output(fd.ops.cast(s, BF16))
        fd.add_output(fd.ops.sum(s, [0]))

    def eager():
        s = torch.softmax(x.float(), dim=1)
        return s.to(torch.bfloat16), s.sum(0)
    compiled = torch.compile(eager, dynamic=False)
    outs = fd.execute([x])
    ref = eager()
    err = max(((o.double() - r.double()).norm() / r.double().norm()).item()
              for o, r in zip(outs, ref))
    t = {"pyfuser": _bench(lambda: fd.execute([x])), "eager": _bench(eager),
         "torch.compile": _bench(compiled)}
    return "softmax rows + column sum 16384x4096 bf16", t, fd.last_run, err


def main() -> int:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for case in (linear_gelu, softmax_colsum):
        name, t, run, err = case()
        best_peer = min(v for k, v in t.items() if k in ("eager", "torch.compile"))
        print(f"\n{name}: relative error vs eager {err:.2e}")
        for k, v in t.items():
            print(f"  {k:22s} {v:8.3f} ms")
        print(f"  pyfuser / best of eager and compile: {best_peer / t['pyfuser']:.2f}x speed")
        print(f"  ran: kind={run.kind} schedulers={run.schedulers} segments="
              f"{[(s.kind, s.name) for s in run.segments]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
