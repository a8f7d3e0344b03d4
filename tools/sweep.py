"""Measure alternative heuristics of one catalogue case on the GPU (forced per call).

    python tools/sweep.py row_sum 16384 8192 "ReductionParams(True, 8, 256, 1, 4, (0,))" ...
    python tools/sweep.py softmax_dim0 2048 8192 "bdimx=4, bdimy=128, persistent_batch=16"

An argument of `field=value` pairs is the default heuristic with those fields replaced.
"""
import dataclasses
import sys

import torch

from pyfuser import catalogue
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers.pointwise import PointwiseParams  # noqa: F401 - for eval
from pyfuser.schedule.schedulers.outer_persistent import OuterPersistentParams  # noqa: F401
from pyfuser.schedule.schedulers.reduction import ReductionParams  # noqa: F401 - for eval
from pyfuser.schedule.schedulers.transpose import TransposeParams  # noqa: F401 - for eval


def main():
    name, M, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = catalogue.define(name)
    nbytes = catalogue.get(name).min_bytes(M, N, 2)
    sets = [catalogue.make_inputs(name, M, N, device="cuda") for _ in range(4)]
    fd.execute(sets[0])
    print(f"{name} {M}x{N} default {fd.last_run.heuristics[0]!r}")
    default = fd.last_run.heuristics[0]

    def candidate(text):
        if "(" not in text and "=" in text:       # fields of the default replaced
            return eval(f"dataclasses.replace(default, {text})", globals(), {"default": default})
        return eval(text)
    cands = [None] + [candidate(s) for s in sys.argv[4:] if s != "streaming"]
    streaming = "streaming" in sys.argv[4:]
    for h in cands:
        opt = {"heuristic": h} if h is not None else {}
        if streaming:
            opt["enable"] = ["streaming_loads"]
        k = [0]

        def run():
            k[0] = (k[0] + 1) % len(sets)
            return fd.execute(sets[k[0]], options=opt)
        run()
        torch.cuda.synchronize()
        t = _bench(run)
        tag = " streaming" if streaming else ""
        print(f"  {nbytes / t / 1e6:7.0f} GB/s  {t * 1e3:8.1f} us  {h!r}{tag}", flush=True)


if __name__ == "__main__":
    main()
