"""Reductions with inputs of fewer dims (ef061a4: the reduction scheduler takes them), measured
both ways in one run with eager and torch.compile (GPU machine):

    PYTHONPATH=. python tools/bench_fewer_dim_inputs.py

"same-rank rule" rows refuse such inputs as the reduction scheduler did before (the plan then
splits them off into other kernels); "taken" rows are today's plan. BatchNorm forward is the
issue-16 bar (tools/bench_issue16.py); the weighted row sum and the row sum plus bias are
[8192, 4096] bf16. GB/s count the inputs read and the outputs written once.
"""
from __future__ import annotations

import functools

import bench_cases
import bench_issue16
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.ir.tensor import TensorView
from pyfuser.schedule.schedulers import reduction

F32 = DataType.Float
_TAKES = reduction.can_schedule


def _same_rank_inputs_only(fusion):
    reds = reduction.reduction_tensors(fusion)
    rank = len(reds[0].domain.maybe_root) if reds else None
    if any(isinstance(v, TensorView) and len(v.domain.logical) != rank for v in fusion.inputs):
        return False, "an input of another rank than the reduction's input"
    return _TAKES(fusion)


def _x(shape, device, seed=0):
    if device == "meta":
        return torch.empty(shape, device=device, dtype=torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g)


def weighted_row_sum(device):
    x, w = _x((8192, 4096), device), _x((4096,), device, 1)
    with FusionDefinition("weighted_row_sum") as fd:
        tx, tw = fd.from_pytorch(x), fd.from_pytorch(w)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.cast(tx, F32), fd.ops.cast(tw, F32)), [1]))
    return fd, [x, w], lambda: (x.float() * w.float()).sum(1), (x.numel() + w.numel()) * 2 + 8192 * 4


def row_sum_plus_bias(device):
    x, b = _x((8192, 4096), device), _x((8192,), device, 1)
    with FusionDefinition("row_sum_plus_bias") as fd:
        tx, tb = fd.from_pytorch(x), fd.from_pytorch(b)
        fd.add_output(fd.ops.add(fd.ops.sum(fd.ops.cast(tx, F32), [1]), fd.ops.cast(tb, F32)))
    return fd, [x, b], lambda: x.float().sum(1) + b.float(), x.numel() * 2 + 8192 * 6


def _with_rule(taken: bool, make, device):
    reduction.can_schedule = _TAKES if taken else _same_rank_inputs_only
    return make(device)


CASES = {}
for label, make in [
        ("batchnorm_fwd NCHW", functools.partial(bench_issue16.batchnorm_fwd, channels_last=False)),
        ("batchnorm_fwd NHWC", functools.partial(bench_issue16.batchnorm_fwd, channels_last=True)),
        ("weighted row sum [8192,4096] bf16", weighted_row_sum),
        ("row sum + bias [8192,4096] bf16", row_sum_plus_bias)]:
    for taken in (False, True):
        CASES[f"{label} {'taken' if taken else 'same-rank rule'}"] = functools.partial(
            _with_rule, taken, make)


if __name__ == "__main__":
    raise SystemExit(bench_cases.bench(CASES))
