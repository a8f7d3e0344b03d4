"""Checks math.cuh's div_shared_divisor (lower/shared_divisor.py) against IEEE division on the GPU:
wherever its range check passes, its quotient must be div.rn's bit for bit. Prints, per set of
pairs, how many were checked, how many took the fast quotient, and how many of those differ
(must be 0), with the first difference.

Sets:
- significands: every significand of a in [1, 2) against `--divisors` significands of b in
  [1, 2) (spread over the binade, its ends included; 2^23, the default, is every pair). Where the check passes nothing
  overflows or underflows, and every operation scales exactly with a power of two, so this
  covers every exponent the check lets through;
- exponents: every pair of exponent fields (0..255, subnormals, infinities and NaN included),
  each with `--per-exponent` random significands and signs: the range check's edges;
- random: random 32-bit patterns for both operands.

    PYTHONPATH=. python tools/check_shared_divisor.py [--divisors 8388608] [--per-exponent 8192]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from pyfuser.codegen.device_library import device_library_source
from pyfuser.runtime import launch
from pyfuser.runtime.nvrtc import compile_to_cubin

KERNELS = r"""
// One quotient: out[0] pairs whose check passed, out[1] of those differing from a / b,
// out[2] the first such a and b (bits, a high).
__device__ __forceinline__ void pf_check_one(float a, float b, unsigned& taken, unsigned& bad,
                                             unsigned long long* out) {
  bool ok = true;
  const float q = pf::div_shared_divisor(a, b, ok);
  const float ref = a / b;
  if (ok) {
    ++taken;
    if (__float_as_uint(q) != __float_as_uint(ref)) {
      ++bad;
      atomicCAS(&out[2], 0ull, (static_cast<unsigned long long>(__float_as_uint(a)) << 32)
                                   | __float_as_uint(b));
    }
  }
}

__device__ __forceinline__ void pf_flush(unsigned taken, unsigned bad, unsigned long long* out) {
  taken = __reduce_add_sync(0xffffffffu, taken);
  bad = __reduce_add_sync(0xffffffffu, bad);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&out[0], static_cast<unsigned long long>(taken));
    if (bad) atomicAdd(&out[1], static_cast<unsigned long long>(bad));
  }
}

// Thread t: a's significand t (of 2^23), against divisors b_first .. b_first + count - 1 of the
// spread list (significand k * stride | k % stride, stride a power of two: every part of
// the binade, both ends).
extern "C" __global__ void significands(int b_first, int count, int stride,
                                        unsigned long long* out) {
  const unsigned m = blockIdx.x * blockDim.x + threadIdx.x;
  const float a = __uint_as_float(0x3f800000u | m);
  unsigned taken = 0, bad = 0;
  for (int k = b_first; k < b_first + count; ++k) {
    unsigned mb = (static_cast<unsigned>(k) * static_cast<unsigned>(stride))
                  | (static_cast<unsigned>(k) & static_cast<unsigned>(stride - 1));
    if (mb > 0x7fffffu) mb = 0x7fffffu;
    pf_check_one(a, __uint_as_float(0x3f800000u | mb), taken, bad, out);
  }
  pf_flush(taken, bad, out);
}

__device__ __forceinline__ unsigned pf_hash(unsigned x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

// Block (ea, eb): exponent fields ea and eb, `per` random significands and signs each.
extern "C" __global__ void exponents(int per, int seed, unsigned long long* out) {
  const unsigned ea = blockIdx.x, eb = blockIdx.y;
  unsigned taken = 0, bad = 0;
  for (int k = threadIdx.x; k < per; k += blockDim.x) {
    const unsigned h1 = pf_hash((ea * 256u + eb) * 0x9e3779b9u + k * 2u + seed);
    const unsigned h2 = pf_hash(h1 ^ 0x5bd1e995u);
    const unsigned a = (h1 & 0x807fffffu) | (ea << 23), b = (h2 & 0x807fffffu) | (eb << 23);
    // every 8th pair takes a zero significand (powers of two, zeros, infinities)
    pf_check_one(__uint_as_float(k % 8 == 0 ? a & 0xff800000u : a),
                 __uint_as_float(k % 16 == 1 ? b & 0xff800000u : b), taken, bad, out);
  }
  pf_flush(taken, bad, out);
}

extern "C" __global__ void random_bits(int per, int seed, unsigned long long* out) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned taken = 0, bad = 0;
  for (int k = 0; k < per; ++k) {
    const unsigned h1 = pf_hash(t * 0x9e3779b9u + k * 0x85ebca6bu + seed);
    pf_check_one(__uint_as_float(h1), __uint_as_float(pf_hash(h1 + 0x27d4eb2fu)), taken, bad, out);
  }
  pf_flush(taken, bad, out);
}
"""


def _kernel(name: str):
    return launch.load(compile_to_cubin(device_library_source() + KERNELS, name))


def _run(name: str, grid, block, kinds, values, out: torch.Tensor) -> None:
    k = _kernel(name)
    layout = launch.ParamLayout(kinds + ["ptr"])
    k.launch(grid, block, layout.pack(list(values) + [out.data_ptr()]))


def _report(what: str, pairs: int, out: torch.Tensor, seconds: float) -> bool:
    torch.cuda.synchronize()
    taken, bad, first = (int(x) for x in out.tolist())
    line = (f"{what}: {pairs} pairs, fast quotient taken {taken} ({taken / pairs:.4f}), "
            f"differing from div.rn {bad}")
    if bad:
        line += f" (first: a=0x{first >> 32:08x} b=0x{first & 0xffffffff:08x})"
    print(f"{line}  [{seconds:.1f} s]", flush=True)
    return bad == 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--divisors", type=int, default=1 << 23)
    ap.add_argument("--per-exponent", type=int, default=8192)
    ap.add_argument("--random", type=int, default=1 << 32)
    args = ap.parse_args(argv)
    print(torch.cuda.get_device_name(), flush=True)
    good = True
    stride = 1 << max(0, 23 - max(1, args.divisors).bit_length() + 1)
    out = torch.zeros(3, dtype=torch.int64, device="cuda")
    t0 = time.time()
    kernel = _kernel("significands")
    layout = launch.ParamLayout(["i32", "i32", "i32", "ptr"])
    for first in range(0, args.divisors, 256):
        count = min(256, args.divisors - first)
        kernel.launch(((1 << 23) // 256, 1, 1), (256, 1, 1),
                      layout.pack([first, count, stride, out.data_ptr()]))
        if first % (1 << 20) == 0 and first:
            torch.cuda.synchronize()
            print(f"  {first} divisors, {time.time() - t0:.0f} s", flush=True)
    good &= _report("significands", (1 << 23) * args.divisors, out, time.time() - t0)
    out.zero_()
    t0 = time.time()
    _run("exponents", (256, 256, 1), (256, 1, 1), ["i32", "i32"], (args.per_exponent, 1), out)
    good &= _report("exponents", 256 * 256 * args.per_exponent, out, time.time() - t0)
    out.zero_()
    t0 = time.time()
    threads = 1 << 20
    per = max(1, args.random // threads)
    _run("random_bits", (threads // 256, 1, 1), (256, 1, 1), ["i32", "i32"], (per, 7), out)
    good &= _report("random", threads * per, out, time.time() - t0)
    print("ALL EQUAL" if good else "DIFFERENCES FOUND", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
