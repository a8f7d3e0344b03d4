"""The inner persistent rule that sends long rows with only per-row outputs (an argmax, a
variance) to reduction kernels that read the rows again (REREAD_CLUSTER in
schedule/schedulers/inner_persistent.py), measured both ways in one run with eager and
torch.compile (GPU machine):

    PYTHONPATH=. python tools/bench_reread_rule.py

"cluster" rows hold each row in a cluster of blocks (the rule switched off), "reread" rows are
the plan the rule picks. GB/s count the input read once and the outputs written once.
"""
from __future__ import annotations

import functools

import bench_cases
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.schedule.schedulers import inner_persistent

DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def _x(shape, device, dtype):
    if device == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    g = torch.Generator(device=device).manual_seed(0)
    return torch.randn(shape, device=device, dtype=dtype, generator=g)


def var_mean_rows(shape, dtype, device):
    x = _x(shape, device, dtype)
    with FusionDefinition("var_mean_rows") as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), [1])
        fd.add_output(var)
        fd.add_output(mean)
    return fd, [x], lambda: torch.var_mean(x, 1), x.numel() * x.element_size() + 2 * shape[0] * 4


def var_rows(shape, dtype, device):
    x = _x(shape, device, dtype)
    with FusionDefinition("var_rows") as fd:
        fd.add_output(fd.ops.var(fd.from_pytorch(x), [1]))
    return fd, [x], lambda: torch.var(x, 1), x.numel() * x.element_size() + shape[0] * 4


def argmax_rows(shape, dtype, device):
    x = _x(shape, device, dtype)
    with FusionDefinition("argmax_rows") as fd:
        fd.add_output(fd.ops.argmax(fd.from_pytorch(x), 1))
    return fd, [x], lambda: torch.argmax(x, 1), x.numel() * x.element_size() + shape[0] * 8


def _with_rule(on: bool, make, device):
    inner_persistent.REREAD_CLUSTER = _DEFAULT if on else 1 << 30
    return make(device)


_DEFAULT = inner_persistent.REREAD_CLUSTER
CASES = {}
for label, make in [
        ("var_mean rows [4096,65536] bf16", functools.partial(var_mean_rows, (4096, 65536), torch.bfloat16)),
        ("var_mean rows [4096,65536] fp32", functools.partial(var_mean_rows, (4096, 65536), torch.float32)),
        ("var rows [4096,65536] fp32", functools.partial(var_rows, (4096, 65536), torch.float32)),
        ("var rows [8192,128256] bf16", functools.partial(var_rows, (8192, 128256), torch.bfloat16)),
        ("argmax rows [4096,65536] fp32", functools.partial(argmax_rows, (4096, 65536), torch.float32)),
        ("argmax rows [8192,128256] bf16", functools.partial(argmax_rows, (8192, 128256), torch.bfloat16))]:
    for on in (False, True):
        CASES[f"{label} {'reread' if on else 'cluster'}"] = functools.partial(_with_rule, on, make)


if __name__ == "__main__":
    raise SystemExit(bench_cases.bench(CASES))
