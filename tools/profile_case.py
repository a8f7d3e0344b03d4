"""Run one catalogue fusion a few times on the GPU, for a profiler wrapped around it:
`ncu --kernel-name regex:softmax --launch-skip 3 --launch-count 1 python tools/profile_case.py
softmax 16384x1024`. Extra arguments are PYFUSER_ENABLE features for the call. A bench case of
the issue scripts is named MODULE:CASE with its shape as `-` (its own): `bench_issue18:dropout -`
runs tools/bench_issue18.py's dropout(device). PROFILE_DTYPE=fp16 picks a catalogue fusion's dtype
(bf16 by default)."""
import os
import sys

import torch

from pyfuser import catalogue

name, shape, *features = sys.argv[1:]
if ":" in name:
    import importlib
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    module, case = name.split(":")
    fd, inputs, _, _ = getattr(importlib.import_module(module), case)("cuda")
else:
    M, N = (int(x) for x in shape.split("x"))
    dtype = os.environ.get("PROFILE_DTYPE", "bf16")
    fd = catalogue.define(name, dtype)
    inputs = catalogue.make_inputs(name, M, N, dtype, device="cuda")
for _ in range(5):
    fd.execute(inputs, options={"enable": features} if features else None)
torch.cuda.synchronize()
print(name, shape, fd.last_run.schedulers, fd.last_run.heuristics[0].describe(), flush=True)
# With PROFILE_CUBIN_DIR set, the cubins of the kernels that ran (for cuobjdump -sass).
if os.environ.get("PROFILE_CUBIN_DIR"):
    os.makedirs(os.environ["PROFILE_CUBIN_DIR"], exist_ok=True)
    for k in fd.kernels(last_run=True):
        with open(os.path.join(os.environ["PROFILE_CUBIN_DIR"], k.name + ".cubin"), "wb") as f:
            f.write(k.module.cubin)
