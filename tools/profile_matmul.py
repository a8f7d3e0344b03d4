"""Run y = x @ w^T (bf16) with the matmul kernel's parameters forced, a few times, for a
profiler wrapped around it (GPU machine):

    ncu --kernel-name regex:matmul --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        python tools/profile_matmul.py 1x4096x4096 128x256 [--roles=2] [--split=8]

The parameters are fitted as the heuristic fits its own choice (matmul.fitted_params)."""
from __future__ import annotations

import sys

import torch

from bench_issue20 import linear_fusion


def main(argv) -> int:
    from pyfuser.runtime.device import query_device
    from pyfuser.schedule.schedulers import matmul
    words = [a for a in argv if not a.startswith("--")]
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    m, n, k = (int(v) for v in words[0].split("x"))
    tm, tn = (int(v) for v in words[1].split("x"))
    roles, split = int(flags.get("roles", 1)), int(flags.get("split", 1))
    tiles = -(-m // tm) * -(-n // tn)
    p = matmul.fitted_params(tm, tn, roles, tiles, query_device(), 2, "K", split_k=split)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fd = linear_fusion()
    opts = {"heuristic": p, "enable": ["matmul_few_rows"]}
    for _ in range(5):
        fd.execute([x, w], options=opts)
    torch.cuda.synchronize()
    print(words[0], fd.last_run.heuristics[0].describe(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
