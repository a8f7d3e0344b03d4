"""logsumexp over rows of [4096, 128256] bf16 (issue 16's bar) beside the copy ceiling and
torch.compile, in 5 interleaved rounds of one process (GPU machine): GB/s of the floor's bytes,
do_bench medians with the L2 cleared, and pyfuser's share of the copy per round.

    PYTHONPATH=. python tools/bench_logsumexp_copy.py
"""
import sys, statistics
sys.path.insert(0, "tools")
import torch
from pyfuser.benchmark.harness import _bench, copy_bandwidth
import bench_issue16 as b16
fd, inputs, eager, nbytes = b16.logsumexp("cuda")
x = inputs[0]
out = fd.execute(inputs)[0]
err = (out.double() - torch.logsumexp(x.double(), 1)).abs().max().item()
compiled = torch.compile(eager)
compiled()
print("ran", fd.last_run.schedulers, "max abs err", err)
rows = {"copy": [], "pyfuser": [], "torch.compile": []}
for _ in range(5):
    rows["copy"].append(copy_bandwidth())
    rows["pyfuser"].append(nbytes / _bench(lambda: fd.execute([x])) / 1e6)
    rows["torch.compile"].append(nbytes / _bench(compiled) / 1e6)
for k, v in rows.items():
    print(f"{k:14s} GB/s median {statistics.median(v):7.0f}  all {[round(t) for t in v]}")
print("pyfuser / copy per round:", [round(p / c, 3) for p, c in zip(rows["pyfuser"], rows["copy"])])
