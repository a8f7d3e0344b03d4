"""Pointwise fusions whose tensors iterate the output's elements through broadcasts, expanded
dims and reshapes, and their inputs: shared by the interpreter tests
(tests/lower/test_broadcast_reshape_fusions.py) and the GPU tests
(tests/gpu/test_broadcast_reshape_gpu.py). Each was an internal error (a fallback to the
reference evaluator) in the fuzzer's first runs (/work/notes/fuzz-triage.md P6, P7, P8).

Each builder takes (M, N, device) and returns (FusionDefinition, inputs).
"""
from __future__ import annotations

import torch

from pyfuser import DataType, FusionDefinition

F32, BF16 = DataType.Float, DataType.BFloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def int64_row_plus_fp32(M, N, device="cpu"):
    """fp32 [M, N] + int64 [1, N]: the row is read 2-wide (16 bytes of int64) in the output's
    loop of 4 fp32 lanes."""
    g = _gen(0)
    x = torch.randn(M, N, generator=g).to(device)
    r = torch.randint(-50, 50, (1, N), generator=g).to(device)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=F32)
        b = fd.define_tensor([1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.add(a, b))
    return fd, [x, r]


def fp32_bias_times_bf16(M, N, device="cpu"):
    """bf16 [M, N] * fp32 [N]: the bias is read 4-wide in a loop of 8 bf16 lanes."""
    g = _gen(1)
    x = torch.randn(M, N, generator=g).to(device=device, dtype=torch.bfloat16)
    w = torch.randn(N, generator=g).to(device)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=BF16)
        b = fd.define_tensor([-1], dtype=F32)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(a, F32), b), BF16))
    return fd, [x, w]


def expanded_row_over_new_outer_dim(M, N, device="cpu"):
    """a [2, M, N] + b [M(expanded, stride 0), N]: b is broadcast over a new outer dim too."""
    g = _gen(2)
    a = torch.randn(2, M, N, generator=g).to(device)
    b = torch.randn(1, N, generator=g).to(device).expand(M, N)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1], dtype=F32)
        y = fd.define_tensor([-1, -1], dtype=F32, expanded=[True, False])
        fd.add_output(fd.ops.add(x, y))
    return fd, [a, b]


def where_of_an_expanded_bf16(M, N, device="cpu"):
    """Fuzz case 7:664: where(f32 [1, M, N, 2] >= .5, bf16 [1, M, N, 2], bf16 [M(exp), N, 2])."""
    g = _gen(3)
    c = torch.rand(1, M, N, 2, generator=g).to(device)
    t = torch.randn(1, M, N, 2, generator=g).to(device=device, dtype=torch.bfloat16)
    e = torch.randn(1, N, 2, generator=g).to(device=device, dtype=torch.bfloat16).expand(M, N, 2)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1, -1], dtype=F32)
        y = fd.define_tensor([-1, -1, -1, -1], dtype=BF16)
        z = fd.define_tensor([-1, -1, -1], dtype=BF16, expanded=[True, False, False])
        fd.add_output(fd.ops.where(fd.ops.ge(x, 0.5), y, z))
    return fd, [c, t, e]


def two_flattened_outputs(M, N, device="cpu"):
    """reshape(x, [-1]) and reshape(x, [M * N]) of one bf16 [M, N] input, both outputs."""
    x = torch.randn(M, N, generator=_gen(4)).to(device=device, dtype=torch.bfloat16)
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1], dtype=BF16)
        fd.add_output(fd.ops.reshape(a, [-1]))
        fd.add_output(fd.ops.reshape(a, [M * N]))
    return fd, [x]


def flattened_broadcast_beside_its_input(M, N, device="cpu"):
    """y = x * 0.5 [K] and reshape(broadcast_in_dim(y, [1, 1, K, 1]), [K]) (K = M * N), both
    outputs (fuzz case 20261123:548, shrunk): the reshape merges the broadcast dims away."""
    K = M * N
    x = torch.randn(K, generator=_gen(5)).to(device=device, dtype=torch.float16)
    with FusionDefinition() as fd:
        a = fd.define_tensor([K], dtype=DataType.Half)
        y = fd.ops.mul(a, 0.5)
        fd.add_output(y)
        fd.add_output(fd.ops.reshape(fd.ops.broadcast_in_dim(y, [1, 1, K, 1], [2]), [K]))
    return fd, [x]


def reshape_with_a_size_1_dim(M, N, device="cpu"):
    """Fuzz case 20261123:279, shrunk: a [5, 2, 1, 47 * N] input of permuted strides reshaped
    to [5, 2, 1, 47, N]; the size-1 dim the reshape splits off is a broadcast of the output and
    an iteration of extent 1 of the input's cache (M is not used)."""
    n = 47 * N
    x = torch.randn(2 * (8 * n + 8), generator=_gen(6)).to(device=device, dtype=torch.bfloat16)
    # Dim 0 innermost (stride 1), then dim 3 (stride 8), then dim 1; dim 2 has size 1.
    x = x.as_strided((5, 2, 1, n), (1, 8 * n + 8, 12, 8))
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1, -1, -1], contiguity=[False, False, False, True],
                             dtype=BF16, stride_order=[0, 3, 1, 2])
        fd.add_output(fd.ops.reshape(a, [5, 2, 1, 47, -1]))
    return fd, [x]


FUSIONS = {f.__name__: f for f in (
    int64_row_plus_fp32, fp32_bias_times_bf16, expanded_row_over_new_outer_dim,
    where_of_an_expanded_bf16, two_flattened_outputs, flattened_broadcast_beside_its_input,
    reshape_with_a_size_1_dim)}
