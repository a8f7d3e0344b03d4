"""Conversion into float8 as torch makes it, for the evaluators that run on the CPU: the
reference evaluator and the kernel-IR interpreter. The device library's pf::cast computes the
same bits on the GPU (codegen/runtime_src/types.cuh, float_to_fp8e4m3 / float_to_fp8e5m2).

torch (c10's Float8_e4m3fn and Float8_e5m2 constructors, which take a float) converts through
float32, so a double or an int64 is rounded to float32 first; then to nearest even. e4m3fn has
no infinity: a magnitude past 448, infinity included, saturates to +-448 (torch 2.13; older
releases give NaN above 464, and the device library follows the installed torch:
ir/dtype.e4m3fn_overflow_is_nan). e5m2 is IEEE-like: past 57344 it rounds to +-inf (61440 and up, the tie
going to the even 65536). A NaN stays a NaN of the same sign (0x7f / 0xff).
"""
from __future__ import annotations

import torch

from ..ir.dtype import DataType, to_torch


def to_float8(x: torch.Tensor, dtype: DataType) -> torch.Tensor:
    """x (floating, integer or bool) converted to the float8 `dtype`, bit for bit as torch."""
    return x.to(torch.float32).to(to_torch(dtype))
