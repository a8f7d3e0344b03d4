"""BatchNorm's statistics reduction alone (the sum over N, H, W of cast(x), x [32, 256, 56, 56]
bf16, NCHW or channels-last) under forced reduction heuristics, on the GPU:

    PYTHONPATH=. python tools/sweep_bn_stats.py "grid_split=2" "grid_split=4, bdimx=256" ...

Each argument is the default heuristic with those fields replaced. GB/s count x read once.
"""
import dataclasses
import sys

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers.reduction import ReductionParams  # noqa: F401 - for eval


def main(variants) -> int:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for channels_last in (False, True):
        x = torch.randn(32, 256, 56, 56, device="cuda").bfloat16()
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with FusionDefinition() as fd:
            tx = fd.from_pytorch(x)
            fd.add_output(fd.ops.sum(fd.ops.cast(tx, DataType.Float), [0, 2, 3]))
        ref = x.float().sum((0, 2, 3))
        fd.execute([x])
        default = fd.last_run.heuristics[0]
        layout = "NHWC" if channels_last else "NCHW"
        for text in [None] + list(variants):
            h = None if text is None else eval(f"dataclasses.replace(default, {text})",
                                               globals(), {"default": default})
            opt = {"heuristic": h} if h is not None else None
            try:
                out = fd.execute([x], options=opt)[0]
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                ms = _bench(lambda: fd.execute([x], options=opt))
            except Exception as e:      # noqa: BLE001 - a variant the scheduler refuses
                print(f"{layout} {text}: {type(e).__name__}: {e}"[:200])
                continue
            used = fd.last_run.heuristics[0]
            print(f"{layout} {text or 'default'}: {x.numel() * 2 / ms / 1e6:.0f} GB/s, "
                  f"{ms * 1e3:.1f} us, err {err:.1e}; {used.describe()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
