"""Cross-entropy's loss and dlogits over logits [8192, 128256] bf16 (tools/bench_issue17.py's
fusion, its scattered one-hot form, and its form with dlogits from the log-probabilities): pyfuser's default plan, the cluster kernel forced
(looped variant off), eager, torch.compile and Liger's fused cross-entropy where installed
(../shared/tools/peer-wheels.sh), in one process, each output checked against eager's first:

    PYTHONPATH=.:$PYTHONPATH python tools/bench_cross_entropy.py
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import bench_issue17
from pyfuser.benchmark.harness import _bench

fd, inputs, eager, nbytes = bench_issue17.cross_entropy("cuda")
x, t = inputs
ref_loss, ref_dx = eager()

def check(tag, loss, dx):
    dl = (loss.float() - ref_loss.float()).abs().max().item()
    dd = (dx.float() - ref_dx.float()).abs().max().item()
    print(f"  {tag}: loss max diff {dl:.3g}, dlogits max diff {dd:.3g}", flush=True)

times = {}
def run_variant(tag, opts):
    out = fd.execute(inputs, options=opts)
    torch.cuda.synchronize()
    r = fd.last_run
    print(f"{tag}: {r.kind} {r.schedulers} clusters {r.clusters} {r.heuristics[0] if r.heuristics else ''}", flush=True)
    check(tag, *out)
    times[tag] = _bench(lambda: fd.execute(inputs, options=opts))
    print(f"  {tag}: {times[tag]*1e3:.1f} us {nbytes/times[tag]/1e6:.0f} GB/s", flush=True)
    return r

run_variant("default", {})
run_variant("cluster (looped off)", {"disable": ["looped_inner_persistent"]})
for tag, make in (("scatter one-hot", bench_issue17.cross_entropy_scatter),
                  ("dlogits from log-probs", bench_issue17.cross_entropy_log_probs)):
    fd2, inputs2, _, _ = make("cuda")
    out = fd2.execute(inputs2)
    torch.cuda.synchronize()
    print(f"{tag}:", fd2.last_run.schedulers, fd2.last_run.heuristics[0].looped)
    check(tag, *out)
    times[tag] = _bench(lambda: fd2.execute(inputs2))
times["eager"] = _bench(eager)
times["compile"] = _bench(torch.compile(eager, dynamic=False))
try:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    xl = x.clone().requires_grad_(True)
    def liger():
        return LigerCrossEntropyFunction.apply(xl, t, None, -100, 0.0, 0.0, "mean")[0]
    liger()
    times["liger"] = _bench(liger)
except ImportError as e:
    print("no liger", e)
for k, v in times.items():
    print(f"{k:24s} {v*1e3:8.1f} us {nbytes/v/1e6:6.0f} GB/s")
