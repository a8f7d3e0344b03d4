"""One matmul of pyfuser's, run a few times, for a profiler (ncu) on the GPU machine:

    ncu --kernel-name regex:fusion_matmul --launch-skip 2 --launch-count 1 \\
        python tools/profile_matmul.py 4096 4096 4096 [--mn]

y = x @ w^T (x [M, K], w [N, K], bf16), or with --mn a @ b with b row-major [K, N]."""
import sys

import torch

from pyfuser import DataType, FusionDefinition

m, n, k = (int(v) for v in sys.argv[1:4])
mn = "--mn" in sys.argv
with FusionDefinition("matmul") as fd:
    a = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
    b = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
    fd.add_output(fd.ops.matmul(a, b) if mn else fd.ops.linear(a, b))
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(*((k, n) if mn else (n, k)), device="cuda", dtype=torch.bfloat16)
for _ in range(4):
    fd.execute([x, w])
torch.cuda.synchronize()
print(fd.last_run.heuristics[0].describe())
