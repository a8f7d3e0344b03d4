"""What an indexing kernel's index check costs the caller (GPU machine):

    PYTHONPATH=. python tools/bench_index_check.py

The embedding bar (8192 ids in [128256, 4096] bf16) through fd.execute as it runs (the index
check's report read from host memory without waiting, runtime/index_check.py), with
sync_index_checks (a wait for the kernel after each launch), and with the reads of the report
skipped; eager and torch.compile in the same run. Times are medians of triton's do_bench (L2 cleared before each call).
"""
from __future__ import annotations

import sys

import bench_cases
import bench_issue17
import torch

from pyfuser.benchmark.harness import _bench
from pyfuser.runtime import index_check


def main() -> int:
    fd, inputs, eager, nbytes = bench_issue17.embedding("cuda")
    assert torch.equal(fd.execute(inputs)[0], eager())
    sync = {"enable": ["sync_index_checks"]}
    t = {"pyfuser": _bench(lambda: fd.execute(inputs)),
         "pyfuser, sync_index_checks": _bench(lambda: fd.execute(inputs, options=sync))}
    settle = index_check.DeferredIndexChecks.settle
    index_check.DeferredIndexChecks.settle = lambda self, late=True: None
    try:
        t["pyfuser, report not read"] = _bench(lambda: fd.execute(inputs))
    finally:
        index_check.DeferredIndexChecks.settle = settle
    t["eager"] = _bench(eager)
    t["compile"] = _bench(torch.compile(eager, dynamic=False))
    print(f"embedding {fd.last_run.heuristics[0].describe()}")
    bench_cases.print_times(t, nbytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
