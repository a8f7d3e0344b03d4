"""The cross-entropy bar against Liger's fused cross-entropy, in one run with pyfuser and
torch.compile (GPU machine, after the peer wheels are installed: ../shared/tools/peer-wheels.sh,
two calls, the second `source .peer-wheels/b/peer-install.sh` before this):

    PYTHONPATH=.:$PYTHONPATH python tools/bench_liger_ce.py

Logits [8192, 128256] bf16, int64 targets; the loss and dlogits for a gradient scale of 1/8192.
Liger (LigerCrossEntropyFunction, reduction "mean") writes dlogits into its input during the
forward; pyfuser's fusion (tools/bench_issue17.cross_entropy) writes them to an output beside
the per-row losses. Both read the logits once and write dlogits once (the floor's bytes).
Liger's dlogits are compared with pyfuser's before timing.
"""
from __future__ import annotations

import sys

import bench_cases
import bench_issue17
import torch

from pyfuser.benchmark.harness import _bench


def main() -> int:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    fd, inputs, eager, nbytes = bench_issue17.cross_entropy("cuda")
    x, t = inputs
    loss, dx = fd.execute(inputs)
    xl = x.clone().requires_grad_(True)

    def liger():
        return LigerCrossEntropyFunction.apply(xl, t, None, -100, 0.0, 0.0, "mean")[0]
    got = liger()
    diff = (xl.detach().float() - dx.float()).abs().max().item()
    print(f"liger: mean loss {got.item():.6f} (pyfuser {loss.mean().item():.6f}); dlogits differ "
          f"from pyfuser's by at most {diff:.3g}")
    t_ = {"pyfuser": _bench(lambda: fd.execute(inputs)), "liger": _bench(liger),
          "compile": _bench(torch.compile(eager, dynamic=False))}
    bench_cases.print_times(t_, nbytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
