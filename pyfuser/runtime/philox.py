"""pyfuser's random numbers: Philox4x32-10 (Salmon et al., SC'11) keyed by a seed, on numpy
arrays. The reference evaluator and the kernel-IR interpreter draw through these functions;
generated kernels through the device library's `pf::philox_*` (codegen/runtime_src/math.cuh),
which compute the same bits.

The stream of a random op (ir.exprs.RandOp), in torch's (curand's) counter layout: the element
at row-major index i of the op's output, with seed s and offset o, is drawn from block
philox(counter = (lo(c), hi(c), lo(b), hi(b)), key = (lo(s), hi(s))) where c = o // 4 + the
op's stream number and b = i // 4 (i // 2 for normal draws), word i % 4 (words 2 * (i % 2) and
the next). As in torch, an offset counts 32-bit draws per element in steps of 4, and execute
reserves 4 per random op of the fusion when it takes the offset from torch's generator, so its
draws and torch's own never share a counter.

A uniform draw takes the top `bits` bits of its word (the output dtype's significand: 24 for
float32 and float64, 11 for float16, 8 for bfloat16) as u = bits * 2^-bits, exact and below 1;
low + u * (high - low) is computed in float32 (float64 for a float64 output) with each operation
rounded (no fused multiply-add), rounded to the output dtype, and a value that rounds to `high`
is `low`, as torch folds it, so every draw lies in [low, high) and every path gets the same
bits. A normal draw is Box-Muller in float32; its logf, sqrtf and cosf round differently on the
GPU and the CPU, so normal draws agree to float32 rounding, not bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..ir.exprs import UNIFORM_BITS

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
ROUNDS = 10


def philox4x32_10(c0, c1, c2, c3, k0, k1) -> tuple:
    """The four 32-bit words of Philox4x32-10 for counters (c0..c3) and key (k0, k1): numpy
    uint64 arrays (or numbers) holding 32-bit values, broadcast together."""
    c0, c1, c2, c3, k0, k1 = (np.asarray(v, dtype=np.uint64) & _MASK
                              for v in (c0, c1, c2, c3, k0, k1))
    for r in range(ROUNDS):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _32) ^ c1 ^ k0, p1 & _MASK, (p0 >> _32) ^ c3 ^ k1, p0 & _MASK)
        if r < ROUNDS - 1:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return c0, c1, c2, c3


def _split(v) -> tuple:
    v = np.asarray(v, dtype=np.int64).astype(np.uint64)
    return v & _MASK, v >> _32


def words(index, seed: int, counter: int, per_block: int):
    """For each element index, the `per_block` consecutive 32-bit words the stream at
    `counter` (offset // 4 + stream) gives it (4 // per_block elements share a block): an array
    [n, per_block] of uint64."""
    index = np.asarray(index, dtype=np.int64)
    per = 4 // per_block
    block, slot = index // per, index % per
    lo, hi = _split(block)
    c_lo, c_hi = _split(counter)
    s_lo, s_hi = _split(seed)
    out = np.stack(philox4x32_10(c_lo, c_hi, lo, hi, s_lo, s_hi), axis=-1)
    first = (slot * per_block)[..., None] + np.arange(per_block)
    return np.take_along_axis(out, first, axis=-1)


def uniform01(index, seed: int, counter: int, bits: int = 24) -> np.ndarray:
    """Floats in [0, 1) as float32: the top `bits` bits of the element's word times 2^-bits."""
    w = words(index, seed, counter, 1)[..., 0]
    return (w >> np.uint64(32 - bits)).astype(np.float32) * np.float32(2.0 ** -bits)


def uniform(index, seed: int, counter: int, low: float, high: float,
            dtype_name: str = "float32") -> np.ndarray:
    """low + u * (high - low) with each operation rounded, in float32 (float64 for a float64
    output), rounded to the output dtype; a value equal to `high` there becomes `low`. Float32
    (float64) values exact in the dtype."""
    u = uniform01(index, seed, counter, UNIFORM_BITS[dtype_name])
    if dtype_name == "float64":
        v = u.astype(np.float64) * np.float64(high - low) + np.float64(low)
        return np.where(v == np.float64(high), np.float64(low), v)
    v = _round_to(u * np.float32(high - low) + np.float32(low), dtype_name)
    return np.where(v == _round_to(np.float32(high), dtype_name),
                    _round_to(np.float32(low), dtype_name), v)


def _round_to(v, dtype_name: str) -> np.ndarray:
    """float32 values rounded to float32, float16 or bfloat16 (to nearest even, as pf::cast),
    as float32."""
    import torch
    if dtype_name == "float32":
        return np.asarray(v, dtype=np.float32)
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    return torch.from_numpy(np.atleast_1d(np.asarray(v, dtype=np.float32))).to(dt).float() \
        .numpy().reshape(np.shape(v))


def normal(index, seed: int, counter: int, mean: float, std: float) -> np.ndarray:
    """mean + std * sqrt(-2 log(u1)) * cos(2 pi u2) in float32, u1 in (0, 1] and u2 in [0, 1)
    from the element's two words."""
    w = words(index, seed, counter, 2)
    scale = np.float32(2.0 ** -24)
    u1 = ((w[..., 0] >> np.uint64(8)).astype(np.float32) + np.float32(1)) * scale
    u2 = (w[..., 1] >> np.uint64(8)).astype(np.float32) * scale
    radius = np.sqrt(np.float32(-2) * np.log(u1))
    z = radius * np.cos(np.float32(2 * np.pi) * u2)
    return (z * np.float32(std)) + np.float32(mean)


def draw(dist: str, dtype_name: str, index, seed: int, offset: int, stream: int, a: float,
         b: float):
    """A RandOp's values at `index` (float32, or float64 for a float64 uniform output):
    uniform in [a, b) rounded to the dtype, or normal with mean a and standard deviation b."""
    counter = (int(offset) >> 2) + stream
    if dist == "uniform":
        return uniform(index, seed, counter, a, b, dtype_name)
    return normal(index, seed, counter, a, b)
