"""Host time per call of a bench case's plan beside its GPU time (GPU machine):

    PYTHONPATH=. python tools/plan_host_time.py bench_issue16 "batchnorm_fwd NCHW" ...

For each case of MODULE.CASES (a tools/bench_issue*.py): the host's time per fd.execute with
the GPU left to run behind it (30 calls, best of 5 loops, no synchronization inside a loop),
triton's do_bench time (pyfuser.benchmark.harness._bench, L2 cleared before each call), and 30
calls back to back between two CUDA events. A plan whose host time exceeds its kernels' time
runs at the host's pace: do_bench and the back-to-back figure then follow the host time.
"""
from __future__ import annotations

import importlib
import os
import sys
import time

import torch

from pyfuser.benchmark.harness import _bench


def main(module: str, names: list) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    cases = importlib.import_module(module).CASES
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in names:
        fd, inputs, _, _ = cases[name]("cuda")
        for _ in range(5):
            fd.execute(inputs)
        host = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(30):
                fd.execute(inputs)
            host = min(host, (time.perf_counter() - t) / 30)
            torch.cuda.synchronize()
        bench = _bench(lambda: fd.execute(inputs))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(30):
            fd.execute(inputs)
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: host {host * 1e6:.1f} us per call; do_bench {bench * 1e3:.1f} us; "
              f"back to back {start.elapsed_time(end) / 30 * 1e3:.1f} us per call; kernels "
              f"{', '.join(fd.last_run.kernel_names)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2:]))
