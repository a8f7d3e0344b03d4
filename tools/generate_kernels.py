"""The plan and CUDA of every catalogue fusion at several shapes (bf16 and fp32) and of the
tools/bench_issue16.py and bench_issue17.py cases, for the H200's table entry, without a GPU:
one .plan file per fusion and one .cuda.txt per kernel in OUT. Run it from two trees and diff
the folders to see which kernels a change touches:

    PYFUSER_DUMP=cuda PYFUSER_DUMP_DIR=/tmp/k_new PYTHONPATH=. python tools/generate_kernels.py /tmp/k_new
"""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from pyfuser import catalogue
from pyfuser.runtime.explain import explain_fusion
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

def _strides(x, m, n):
    shape = [{3: m, 5: n, 1: 1}[d] for d in x.shape]
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    st = [0] * x.dim(); acc = 1
    for d in reversed(order):
        st[d] = acc; acc *= shape[d]
    return st

def dump(tag, fusion, inputs):
    try:
        e = explain_fusion(fusion, inputs, device="h200", name=tag)
    except Exception as err:  # noqa
        open(f"{out}/{tag}.err", "w").write(repr(err))
        return
    open(f"{out}/{tag}.plan", "w").write(str(e))

shapes = [(16384, 8192), (4096, 50257), (16383, 1001), (4096, 32769), (2048, 4096), (8192, 128256), (16384, 4097)]
for name in catalogue.names():
    ent = catalogue.get(name)
    for (m, n) in shapes:
        for dt in ("bf16", "fp32"):
            fd = catalogue.define(name, dt)
            try:
                small = catalogue.make_inputs(name, 3, 5, dt, seed=0)
                inputs = [torch.empty([{3: m, 5: n, 1: 1}[d] for d in x.shape], dtype=x.dtype, device="meta")
                          .as_strided([{3: m, 5: n, 1: 1}[d] for d in x.shape], _strides(x, m, n)) for x in small]
            except Exception as err:
                continue
            dump(f"{name}_{m}x{n}_{dt}", fd.fusion, inputs)
import bench_issue16, bench_issue17
for mod in (bench_issue16, bench_issue17):
    for k, f in mod.CASES.items():
        try:
            fd, inputs, *_ = f("meta")
        except Exception as err:
            continue
        tag = "".join(c if c.isalnum() else "_" for c in k)[:60]
        dump(tag, fd.fusion, inputs)
