"""The reduction scheduler's few-columns rule (outer reductions of at most FEW_COLUMNS column
vectors) against the general outer rule, same process, on the GPU:

    PYTHONPATH=. python tools/sweep_few_columns.py

Column sums of row-major [R, C] tensors over R (outer reductions), BatchNorm's channels-last
statistics, and BatchNorm forward channels-last (tools/bench_issue16.py). GB/s count the input
read once.
"""
from __future__ import annotations

import os
import sys

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.benchmark.harness import _bench
from pyfuser.schedule.schedulers import reduction

SHAPES = [((100352, 256), torch.bfloat16), ((16384, 512), torch.bfloat16),
          ((16384, 256), torch.bfloat16), ((65536, 128), torch.bfloat16),
          ((8192, 64), torch.bfloat16), ((4096, 256), torch.bfloat16),
          ((1024, 512), torch.bfloat16), ((262144, 32), torch.bfloat16),
          ((100352, 128), torch.float32), ((16384, 256), torch.float32)]


def _column_sum(x, dims):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.from_pytorch(x), DataType.Float), dims))
    return fd


def _time(make, inputs, rule: bool):
    reduction.FEW_COLUMNS_RULE = rule
    fd = make()
    fd.execute(inputs)
    return _bench(lambda: fd.execute(inputs)), fd.last_run.heuristics


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_issue16
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("case | general rule GB/s | few-columns rule GB/s | ratio | few-columns heuristic")
    print("--- | --- | --- | --- | ---")
    cases = []
    for shape, dtype in SHAPES:
        x = torch.randn(shape, device="cuda").to(dtype)
        cases.append((f"column sum {list(shape)} {str(dtype)[6:]}",
                      lambda x=x: _column_sum(x, [0]), [x], x.numel() * x.element_size()))
    x = torch.randn(32, 256, 56, 56, device="cuda").bfloat16().contiguous(
        memory_format=torch.channels_last)
    cases.append(("BatchNorm statistics sum, channels-last [32, 256, 56, 56] bf16",
                  lambda: _column_sum(x, [0, 2, 3]), [x], x.numel() * 2))
    _, bn_inputs, _, bn_bytes = bench_issue16.CASES["batchnorm_fwd NHWC"]("cuda")
    cases.append(("BatchNorm forward channels-last (plan)",
                  lambda: bench_issue16.CASES["batchnorm_fwd NHWC"]("cuda")[0], bn_inputs,
                  bn_bytes))
    for name, make, inputs, nbytes in cases:
        old, _ = _time(make, inputs, False)
        new, heuristics = _time(make, inputs, True)
        few = [h.describe() for h in heuristics if getattr(h, "grid_split", None) is not None]
        print(f"{name} | {nbytes / old / 1e6:.0f} | {nbytes / new / 1e6:.0f} | {old / new:.2f} | "
              f"{'; '.join(few)}", flush=True)
    reduction.FEW_COLUMNS_RULE = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
