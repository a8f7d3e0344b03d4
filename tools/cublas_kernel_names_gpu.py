"""The kernels cuBLAS runs for torch.matmul(x, w.t()) (bf16) at a few matmul shapes, with their
device time from torch.profiler (one call after three warm-ups): what tile and cluster the
matmul bars are measured against, read from the kernel names (GPU machine).

    PYTHONPATH=. python tools/cublas_kernel_names_gpu.py
"""
import torch
from torch.profiler import profile, ProfilerActivity
for m, n, k in [(1000, 1000, 1000), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 3072, 8192)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(x, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.matmul(x, w.t())
        torch.cuda.synchronize()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            print(f"{m}x{n}x{k}: {e.name[:160]} {e.device_time:.1f} us")
