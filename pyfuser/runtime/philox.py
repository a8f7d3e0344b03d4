"""pyfuser's random numbers: Philox4x32-10 (Salmon et al., SC'11) keyed by a seed, counted by
the element's index and an offset, on numpy arrays. The reference evaluator and the kernel-IR
interpreter draw through these functions; generated kernels through the device library's
`pf::philox` (codegen/runtime_src/math.cuh), which computes the same bits.

The stream of a random op (ir.exprs.RandOp): the element at row-major index i of the op's
output, with seed s and offset o (o already includes the op's stream number), is drawn from
block philox(counter = (lo(i // 4), hi(i // 4), lo(o), hi(o)), key = (lo(s), hi(s))), word
i % 4 for 32-bit draws. A float in [0, 1) is that word's top `bits` bits times 2^-bits, the
significand of the output's dtype (24 for float32 and float64, 11 for float16, 8 for bfloat16,
as torch draws them), so u is exact in the dtype and below 1; uniform(a, b) is a + u * (b - a)
in float32 with each operation rounded (no fused multiply-add), then rounded to the dtype, so
every path gets the same bits. A normal draw takes two words of block
i // 2 (words 2 * (i % 2) and the next) through Box-Muller in float32; its transcendental
functions round differently on the GPU and the CPU, so normal draws agree to float32 rounding,
not bit for bit.
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


def words(index, seed: int, offset: int, per_block: int):
    """For each element index, the `per_block` consecutive 32-bit words the stream gives it
    (4 // per_block elements share a block): an array [n, per_block] of uint64."""
    index = np.asarray(index, dtype=np.int64)
    per = 4 // per_block
    block, slot = index // per, index % per
    lo, hi = _split(block)
    o_lo, o_hi = _split(offset)
    s_lo, s_hi = _split(seed)
    out = np.stack(philox4x32_10(lo, hi, o_lo, o_hi, s_lo, s_hi), axis=-1)
    first = (slot * per_block)[..., None] + np.arange(per_block)
    return np.take_along_axis(out, first, axis=-1)


def uniform01(index, seed: int, offset: int, bits: int = 24) -> np.ndarray:
    """Floats in [0, 1) as float32: the top `bits` bits of the element's word times 2^-bits."""
    w = words(index, seed, offset, 1)[..., 0]
    return (w >> np.uint64(32 - bits)).astype(np.float32) * np.float32(2.0 ** -bits)


def uniform(index, seed: int, offset: int, low: float, high: float,
            bits: int = 24) -> np.ndarray:
    """low + u * (high - low) in float32, each operation rounded."""
    u = uniform01(index, seed, offset, bits)
    return (u * np.float32(high - low)) + np.float32(low)


def normal(index, seed: int, offset: int, mean: float, std: float) -> np.ndarray:
    """mean + std * sqrt(-2 log(u1)) * cos(2 pi u2) in float32, u1 in (0, 1] and u2 in [0, 1)
    from the element's two words."""
    w = words(index, seed, offset, 2)
    scale = np.float32(2.0 ** -24)
    u1 = ((w[..., 0] >> np.uint64(8)).astype(np.float32) + np.float32(1)) * scale
    u2 = (w[..., 1] >> np.uint64(8)).astype(np.float32) * scale
    radius = np.sqrt(np.float32(-2) * np.log(u1))
    z = radius * np.cos(np.float32(2 * np.pi) * u2)
    return (z * np.float32(std)) + np.float32(mean)


def draw(dist: str, dtype_name: str, index, seed: int, offset: int, a: float, b: float):
    """A RandOp's float32 values at `index`: uniform in [a, b) with the dtype's bits, or
    normal with mean a and standard deviation b."""
    if dist == "uniform":
        return uniform(index, seed, offset, a, b, UNIFORM_BITS[dtype_name])
    return normal(index, seed, offset, a, b)
