// pyfuser device library: math.cuh
// Elementwise math for float and double, matching torch's CUDA kernels: accurate library
// functions (expf, not __expf) and the same formulas and operation order as ATen, so results
// agree with torch to the last bit or nearly. NVRTC declares the CUDA math builtins (expf, erff,
// tanhf, powf, rsqrtf, ...) without any header; these wrappers give them one overloaded name per
// operation so the code generator prints `pf::exp(x)` whatever the type.
// Depends on types.cuh.

namespace pf {

// Functions whose inline expansion is large (branchy slow paths: powf, sinf and cosf with their
// argument reduction, log1pf, and every double transcendental) are compiled once and called:
// a matmul epilogue unrolls its ops over every accumulator of a thread (128 per role in
// ping-pong, twice), and ptxas took 125 s on such a kernel with powf inline, 57 with sinf and
// 23 with log1pf, against 7-8 s with them called (fuzz case 20263601:1, NVRTC 13.0; tanhf,
// erff, erfcf, expf, logf stay inline: 7-8 s). The call costs a few instructions per element.
#define PF_OUTLINED __device__ __noinline__

// --- absolute value, sign-free basics -------------------------------------------------------
__device__ __forceinline__ float abs(float x) { return fabsf(x); }
__device__ __forceinline__ double abs(double x) { return fabs(x); }
__device__ __forceinline__ int abs(int x) { return x < 0 ? -x : x; }
__device__ __forceinline__ long long abs(long long x) { return x < 0 ? -x : x; }

__device__ __forceinline__ bool isnan(float x) { return x != x; }
__device__ __forceinline__ bool isnan(double x) { return x != x; }
__device__ __forceinline__ bool isinf(float x) { return fabsf(x) == Limits<float>::infinity(); }
__device__ __forceinline__ bool isinf(double x) { return fabs(x) == Limits<double>::infinity(); }
__device__ __forceinline__ bool isfinite(float x) { return fabsf(x) < Limits<float>::infinity(); }
__device__ __forceinline__ bool isfinite(double x) { return fabs(x) < Limits<double>::infinity(); }

// --- exponentials and logarithms ------------------------------------------------------------
__device__ __forceinline__ float exp(float x) { return expf(x); }
PF_OUTLINED double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float exp2(float x) { return exp2f(x); }
PF_OUTLINED double exp2(double x) { return ::exp2(x); }
__device__ __forceinline__ float expm1(float x) { return expm1f(x); }
PF_OUTLINED double expm1(double x) { return ::expm1(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
PF_OUTLINED double log(double x) { return ::log(x); }
__device__ __forceinline__ float log2(float x) { return log2f(x); }
PF_OUTLINED double log2(double x) { return ::log2(x); }
__device__ __forceinline__ float log10(float x) { return log10f(x); }
PF_OUTLINED double log10(double x) { return ::log10(x); }
PF_OUTLINED float log1p(float x) { return log1pf(x); }
PF_OUTLINED double log1p(double x) { return ::log1p(x); }
PF_OUTLINED float pow(float x, float y) { return powf(x, y); }
PF_OUTLINED double pow(double x, double y) { return ::pow(x, y); }
// Integer pow as torch computes it for integer tensors: exact, by repeated squaring, wrapping
// around like the integer multiply (done unsigned, where wrapping is defined); a negative
// exponent gives 1 / x truncated: 1 for x = 1, +-1 for x = -1 (by the exponent's parity), else
// 0 (0 included). Without these, pf::pow(long long, long long) is ambiguous between the float
// and double overloads.
namespace detail {
template <typename T, typename U>
__device__ __forceinline__ T integer_pow(T x, T y) {
  if (y < 0) {
    if (x == 1) return 1;
    if (x == -1) return (y & 1) ? -1 : 1;
    return 0;
  }
  U result = 1, base = static_cast<U>(x);
  for (U e = static_cast<U>(y); e != 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return static_cast<T>(result);
}
}  // namespace detail
__device__ __forceinline__ int pow(int x, int y) { return detail::integer_pow<int, unsigned>(x, y); }
__device__ __forceinline__ long long pow(long long x, long long y) {
  return detail::integer_pow<long long, unsigned long long>(x, y);
}

// --- roots and reciprocals ------------------------------------------------------------------
// sqrt and 1/x are IEEE-rounded (NVRTC's default -prec-sqrt/-prec-div=true), as in torch.
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
// torch's CUDA rsqrt is rsqrtf (about 2 ulp), not 1/sqrtf; keep the same so results agree.
__device__ __forceinline__ float rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double rsqrt(double x) { return ::rsqrt(x); }
__device__ __forceinline__ float reciprocal(float x) { return 1.0f / x; }
__device__ __forceinline__ double reciprocal(double x) { return 1.0 / x; }

// --- trigonometric / hyperbolic -------------------------------------------------------------
PF_OUTLINED float sin(float x) { return sinf(x); }
PF_OUTLINED double sin(double x) { return ::sin(x); }
PF_OUTLINED float cos(float x) { return cosf(x); }
PF_OUTLINED double cos(double x) { return ::cos(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
PF_OUTLINED double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float erf(float x) { return erff(x); }
PF_OUTLINED double erf(double x) { return ::erf(x); }
__device__ __forceinline__ float erfc(float x) { return erfcf(x); }
PF_OUTLINED double erfc(double x) { return ::erfc(x); }

// --- rounding -------------------------------------------------------------------------------
__device__ __forceinline__ float floor(float x) { return floorf(x); }
__device__ __forceinline__ double floor(double x) { return ::floor(x); }
__device__ __forceinline__ float ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double ceil(double x) { return ::ceil(x); }
__device__ __forceinline__ float trunc(float x) { return truncf(x); }
__device__ __forceinline__ double trunc(double x) { return ::trunc(x); }
// torch.round rounds half to even, which is rint, not C's round (half away from zero).
__device__ __forceinline__ float round(float x) { return rintf(x); }
__device__ __forceinline__ double round(double x) { return ::rint(x); }

// --- quotients by a shared divisor (lower/shared_divisor.py) -------------------------------
// a / b as div.rn computes it, through y = RN(1/b): q = RN(a y), then one residual step
// q1 = RN(q + r y), r = a - b q exact in a multiply-add (Markstein's correction). q1 is a / b
// correctly rounded where q is normal and r is representable: |b| in [2^-26, 2^100] (y normal)
// and |q1| >= 2^-75 give |a| >= 2^-101 (r's last bit at least 2^-148) and a normal q. An
// overflow of a y makes r, then q1, NaN, which fails the check. A +0 dividend gives +0 or -0 as
// IEEE does (r = +0, q1 = q = 0 y); -0 would give +0 where b > 0, so it is left to div.rn.
// tools/check_shared_divisor.py compares it with div.rn on the GPU, bit for bit.
// Where the check fails the quotient clears `ok`, and its loop runs again with div.rn.
__device__ __forceinline__ float div_shared_divisor(float a, float b, bool& ok) {
  const float y = __frcp_rn(b);
  const bool b_in_range = fabsf(b) >= 0x1p-26f && fabsf(b) <= 0x1p100f;
  const float q = __fmul_rn(a, y);
  const float q1 = __fmaf_rn(__fmaf_rn(-b, q, a), y, q);
  ok &= b_in_range & ((__float_as_uint(a) == 0u) | (fabsf(q1) >= 0x1p-75f));
  return q1;
}

// An int64 equality as two 32-bit ones: the compiler then tests a half that is the same along
// a loop once, not per element (the high half of a one-hot's target against a 32-bit iota
// index, which is 0: one compare per element instead of a 64-bit compare's two).
__device__ __forceinline__ bool eq_by_halves(long long a, long long b) {
  return (static_cast<unsigned>(a) == static_cast<unsigned>(b))
       & (static_cast<int>(a >> 32) == static_cast<int>(b >> 32));
}

// --- max / min ------------------------------------------------------------------------------
// A product rounded on its own: __fmul_rn is never merged into a multiply-add with the add or
// subtract that reads it (an inline-asm mul.rn did the same, but made ptxas spill 8 bytes in a
// norm backward kernel). Printed for a product the kernel computes
// twice (a recomputed copy and its original, schedule/recompute.py): contracted into different
// consumers, the two copies would differ by the product's rounding error, and var of a
// one-element row, (x - mean)^2 / 0, would give inf where torch gives NaN.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// maximum/minimum propagate NaN like torch.maximum/torch.max: a NaN in either operand gives NaN.
// max.NaN.f32 is one instruction on sm_80+; there is no f64 form, so double uses comparisons.
__device__ __forceinline__ float maximum(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float minimum(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ double maximum(double a, double b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ double minimum(double a, double b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ int maximum(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int minimum(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ unsigned maximum(unsigned a, unsigned b) { return a > b ? a : b; }
__device__ __forceinline__ unsigned minimum(unsigned a, unsigned b) { return a < b ? a : b; }
__device__ __forceinline__ long long maximum(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long minimum(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ unsigned long long maximum(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}
__device__ __forceinline__ unsigned long long minimum(unsigned long long a, unsigned long long b) {
  return a < b ? a : b;
}

// --- argmax / argmin in one pass ------------------------------------------------------------
// An element's key: an int64 whose largest over a row is the key of the row's first largest
// element (arg_max_key) or first smallest (arg_min_key), so an argmax is one max reduction that
// reads the row once. High 32 bits: the value's order as a signed int (a float's bits with the
// magnitude bits flipped for negatives; -0 as +0, which torch counts equal; NaN above every
// number, torch's argmax and argmin both pick it), inverted for argmin. Low 32 bits: the index
// counted down from 2^32 - 1, so of equal values the smaller index wins. Indices must be below
// 2^32: the frontend checks the extent (FusionDefinition ops argmax / argmin).
namespace detail {
__device__ __forceinline__ int float_order(float v) {
  int b = __float_as_int(v);
  b = b == int(0x80000000u) ? 0 : b;
  return b ^ ((b >> 31) & 0x7fffffff);
}
// ~index in 32 bits is 2^32 - 1 - index (index < 2^32): one instruction, the high word a move.
__device__ __forceinline__ long long arg_key(int high, long long index) {
  return static_cast<long long>((static_cast<unsigned long long>(static_cast<unsigned>(high)) << 32)
                                | ~static_cast<unsigned>(index));
}
}  // namespace detail
__device__ __forceinline__ long long arg_max_key(float v, long long i) {
  return detail::arg_key(v != v ? 0x7fffffff : detail::float_order(v), i);
}
__device__ __forceinline__ long long arg_min_key(float v, long long i) {
  return detail::arg_key(v != v ? 0x7fffffff : ~detail::float_order(v), i);
}
__device__ __forceinline__ long long arg_max_key(int v, long long i) { return detail::arg_key(v, i); }
__device__ __forceinline__ long long arg_min_key(int v, long long i) { return detail::arg_key(~v, i); }
// The index an arg key holds.
__device__ __forceinline__ long long arg_key_index(long long key) {
  return ~static_cast<unsigned>(key);
}
// --- logsumexp in one pass -------------------------------------------------------------------
// A running (m, s) in an int64 (m's float bits low, s's high): m the largest element so far, s the
// sum of exp(x - m) over them. max(x) and sum(exp(x - max(x))) over the same dims become one
// reduction of these keys (ReductionOpType.LogSumExp, OpLogSumExp in reduce.cuh; the rewrite is
// schedule/logsumexp.py), which reads the row once. A combine takes one exp and no branch on the
// identity (-inf, 0): a difference of maxima that is NaN (two -inf, two +inf, a NaN) is taken as
// 0, so the identity and -inf elements add up without a NaN. What the two reductions give for
// special values comes out of lse_sum: NaN where m is +inf (an element's exp(inf - inf)), NaN, or
// -inf with s not 0 (a largest element of -inf: exp(-inf - -inf)); no elements give (-inf, 0).
// The key of no elements, (-inf, 0) (ir/exprs.py LSE_IDENTITY).
__device__ __forceinline__ constexpr long long lse_identity() { return 0xff800000LL; }
namespace detail {
__device__ __forceinline__ long long lse_pack(float m, float s) {
  return static_cast<long long>((static_cast<unsigned long long>(__float_as_uint(s)) << 32) |
                                __float_as_uint(m));
}
__device__ __forceinline__ float lse_m(long long k) {
  return __uint_as_float(static_cast<unsigned>(k));
}
__device__ __forceinline__ float lse_s(long long k) {
  return __uint_as_float(static_cast<unsigned>(static_cast<unsigned long long>(k) >> 32));
}
}  // namespace detail
__device__ __forceinline__ long long lse_key(float x) { return detail::lse_pack(x, 1.0f); }
// The scale exp(-|d|) is one ex2.approx.ftz of -|d| * log2(e) (__expf adds a denormal fixup of
// three instructions; a scale below 2^-126 of the kept sum is far below its rounding): a combine
// per element of a row read at memory speed must stay within the SM's issue rate. fminf maps a
// NaN difference to 0 (a scale of 1) in the same instruction that clamps; the selects, not a
// branch, keep the warp converged. About 9 instructions per element (SASS, sm_90a).
__device__ __forceinline__ float lse_scale(float d) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fminf(fabsf(d) * -1.4426950408889634f, 0.0f)));
  return e;
}
__device__ __forceinline__ long long lse_combine(long long a, long long b) {
  const float ma = detail::lse_m(a), sa = detail::lse_s(a);
  const float mb = detail::lse_m(b), sb = detail::lse_s(b);
  const float d = mb - ma;
  const float e = lse_scale(d);         // the smaller one's scale: exp(min - max)
  const bool b_larger = d > 0.0f;
  const float scaled = b_larger ? sa : sb, kept = b_larger ? sb : sa;
  return detail::lse_pack(maximum(ma, mb), fmaf(scaled, e, kept));
}
// acc combined at once with the key of N lanes (lower/lse_lanes.py): m their largest value (NaN
// if one is NaN, as maximum gives), s the sum of exp(lane - m). Where every lane is -inf, s is
// N, what N per-element keys add up to (lse_sum then gives NaN if the whole row is -inf, as the
// two passes do); the lanes are shifted by 0 there, not by -inf, so no exp sees inf - inf. A
// lane minus a finite m is at most 0: no clamp is needed. About 6 instructions a lane against a
// combine's 10 (SASS, sm_90a): a one-pass logsumexp of a bf16 row at memory speed.
template <int N>
__device__ __forceinline__ long long lse_fold_lanes(long long acc, const float (&lanes)[N]) {
  float m = lanes[0];
#pragma unroll
  for (int i = 1; i < N; ++i) m = maximum(m, lanes[i]);
  const bool none = __float_as_uint(m) == 0xff800000u;
  const float shift = none ? 0.0f : m;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((lanes[i] - shift) * 1.4426950408889634f));
    s += e;
  }
  return lse_combine(acc, detail::lse_pack(m, none ? static_cast<float>(N) : s));
}
__device__ __forceinline__ float lse_max(long long k) { return detail::lse_m(k); }
__device__ __forceinline__ float lse_sum(long long k) {
  const float m = detail::lse_m(k), s = detail::lse_s(k);
  const bool undefined = __float_as_uint(m) == 0x7f800000u || m != m ||
                         (__float_as_uint(m) == 0xff800000u && s != 0.0f);
  return undefined ? __uint_as_float(0x7fc00000u) : s;
}
// fmax/fmin ignore a NaN operand (C semantics, torch.fmax/torch.fmin).
__device__ __forceinline__ float fmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double fmax(double a, double b) { return ::fmax(a, b); }
__device__ __forceinline__ float fmin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double fmin(double a, double b) { return ::fmin(a, b); }
// clamp(x, lo, hi) = minimum(maximum(x, lo), hi): NaN x stays NaN, as torch.clamp.
template <typename T>
__device__ __forceinline__ T clamp(T x, T lo, T hi) {
  return minimum(maximum(x, lo), hi);
}

// --- activations (ATen's formulas and order, but for the gelus' forms without cancellation) --
// relu keeps NaN (torch.relu(nan) == nan); relu(-0.0) is +0.0 as in torch.
__device__ __forceinline__ float relu(float x) { return maximum(x, 0.0f); }
__device__ __forceinline__ double relu(double x) { return maximum(x, 0.0); }
__device__ __forceinline__ int relu(int x) { return x > 0 ? x : 0; }
__device__ __forceinline__ long long relu(long long x) { return x > 0 ? x : 0; }
// sigmoid and silu: 1 / (1 + exp(-x)) and x / (1 + exp(-x)), computed as rcp(1 + 2^(-x log2 e))
// (times x): one ex2 and one reciprocal, the approximations (4-5 SASS instructions), instead of
// expf's range reduction and the IEEE division's checked path (about 25). A matmul epilogue pays
// them per element with the tensor cores idle: x @ W^T then silu at 4096x14336x5120 took 1254 us
// against 918 for the bare matmul on the H200 (bench/results/2026-12-01/
// h200-matmul-epilogue-session33.txt). Within 1e-5 relative of the float64 function
// where sigmoid(x) > 2^-126 (the rounded argument x log2 e: about |x| 6e-8 relative), 1e-6 for
// |x| < 8; for x below -87.3 the reciprocal of 1 + exp(-x) > 2^126 flushes to zero (ATen's float
// form is zero below x = -88.7, where expf overflows). The edge values are ATen's: -inf gives
// NaN for silu (-inf * 0) and 0 for sigmoid, +inf gives inf and 1, -0 gives -0 and 0.5.
__device__ __forceinline__ float scaled_sigmoid(float x, float scale) {    // scale / (1 + exp(-x))
  const float log2e = 1.4426950408889634f;
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -log2e));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return scale * r;
}
__device__ __forceinline__ float sigmoid(float x) { return scaled_sigmoid(x, 1.0f); }
__device__ __forceinline__ double sigmoid(double x) { return 1.0 / (1.0 + ::exp(-x)); }
__device__ __forceinline__ float silu(float x) { return scaled_sigmoid(x, x); }
__device__ __forceinline__ double silu(double x) { return x / (1.0 + ::exp(-x)); }
// gelu(approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))), computed as 0.5 x erfc(-x / sqrt 2),
// the same function without ATen's cancellation: 1 + erff(x / sqrt 2) keeps 1e-3 relative of the
// result at x = -4 and none below x = -5.9, erfcf keeps its 4 ulp down to results of 1e-38.
// +-inf and NaN give what ATen's form gives (inf, NaN for -inf * 0, NaN).
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * erfcf(x * -0.70710678118654752440f);
}
__device__ __forceinline__ double gelu(double x) {
  return 0.5 * x * ::erfc(x * -0.70710678118654752440);
}
// gelu(approximate='tanh'): 0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 * x^3),
// computed as x / (1 + exp(-2u)), the same function: one ex2 and one reciprocal (7 instructions,
// SASS sm_90a) instead of tanhf's ~25, which a matmul epilogue pays per element with the tensor
// cores idle. It is also the more accurate form: 1 + tanh(u) cancels for negative u (ATen's
// float formula is off by up to 100% of a tiny result from x = -5 and zero below -5.3, 1e-5
// relative at x = -3); this one stays within 1e-5 relative of the float64 function down to
// results of 1e-36 (the reciprocal of 1 + exp(-2u) > 2^126 flushes to zero), 8e-7 for |x| < 3,
// and within 2e-6 relative + 1e-6 absolute of ATen's result (the device-library GPU tests).
// -2u log2(e) = x (k0 + k1 x^2); exp overflowing to inf gives x * 0 = -0 for a large negative
// x, as ATen's 0.5 x (1 - 1) does; -inf gives NaN (-inf * 0) as ATen does, NaN stays NaN.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = -2.3022082f;              // -2 sqrt(2/pi) log2(e)
  const float k1 = -0.10294324f;             // k0 * 0.044715
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * fmaf(k1, x * x, k0)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return x * r;
}
__device__ __forceinline__ double gelu_tanh(double x) {    // the same form, in float64
  const double kBeta = 0.79788456080286535588;
  const double kKappa = 0.044715;
  const double inner = kBeta * (x + kKappa * (x * x * x));
  return x / (1.0 + ::exp(-2.0 * inner));
}

// --- fast approximations: NOT torch-accurate; only where a heuristic asks for them ----------
// fast_exp: ex2.approx after a multiply (__expf), ~2 ulp plus the scaling error for large |x|.
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
// fast_tanh: tanh.approx.f32, max relative error about 2^-11.
__device__ __forceinline__ float fast_tanh(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// --- random numbers: Philox4x32-10 -----------------------------------------------------------
// The stream runtime/philox.py defines, bit for bit, in torch's counter layout: counter =
// (`counter` = offset / 4 + the op's stream, the element's block), key = the 64-bit seed.
// 64-bit products give the mulhi/mullo pairs (one IMAD.WIDE each).
struct PhiloxBlock {
  unsigned w[4];
};

__device__ __forceinline__ PhiloxBlock philox(unsigned long long counter, unsigned long long block,
                                              unsigned long long seed) {
  unsigned c0 = static_cast<unsigned>(counter), c1 = static_cast<unsigned>(counter >> 32);
  unsigned c2 = static_cast<unsigned>(block), c3 = static_cast<unsigned>(block >> 32);
  unsigned k0 = static_cast<unsigned>(seed), k1 = static_cast<unsigned>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    const unsigned n0 = static_cast<unsigned>(p1 >> 32) ^ c1 ^ k0;
    const unsigned n2 = static_cast<unsigned>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<unsigned>(p1);
    c3 = static_cast<unsigned>(p0);
    c0 = n0;
    c2 = n2;
    if (r < 9) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }
  return {{c0, c1, c2, c3}};
}

// u in [0, 1) from a word's top Bits bits (the output dtype's significand: exact in it).
template <int Bits>
__device__ __forceinline__ float philox_unit(unsigned word) {
  return static_cast<float>(word >> (32 - Bits)) * (1.0f / static_cast<float>(1u << Bits));
}

// Block `block` of the stream of (seed, counter), the int64 scalars a random op reads.
__device__ __forceinline__ PhiloxBlock philox_block(long long seed, long long counter,
                                                    unsigned long long block) {
  return philox(static_cast<unsigned long long>(counter), block,
                static_cast<unsigned long long>(seed));
}

// `use(q, block)` for the Blocks consecutive blocks from `first`: the draws of a vector of
// consecutive elements, one block per 4 uniform or 2 normal draws (an element at a time
// computes a block each, for the same bits).
template <int Blocks, typename Use>
__device__ __forceinline__ void philox_blocks(long long seed, long long counter,
                                              unsigned long long first, Use use) {
#pragma unroll
  for (int q = 0; q < Blocks; ++q) use(q, philox_block(seed, counter, first + q));
}

// The element's 32-bit word of a uniform draw: word index % 4 of block index / 4.
__device__ __forceinline__ unsigned philox_word(long long index, long long seed, long long counter) {
  return philox_block(seed, counter, static_cast<unsigned long long>(index) >> 2).w[index & 3];
}

// A uniform draw from its word: low + u * (high - low) in float, each operation rounded on its
// own (no multiply-add), rounded to T, and a value equal to high folded to low, as
// runtime/philox.uniform does. float64: the same 24 random bits, the affine map in double.
template <typename T, int Bits>
struct UniformFromWord {
  __device__ __forceinline__ static T apply(unsigned word, double low, double high) {
    const float u = philox_unit<Bits>(word);
    const T v = cast<T>(
        __fadd_rn(__fmul_rn(u, static_cast<float>(high - low)), static_cast<float>(low)));
    return cast<float>(v) == cast<float>(cast<T>(static_cast<float>(high)))
               ? cast<T>(static_cast<float>(low)) : v;
  }
};
template <>
struct UniformFromWord<double, 24> {
  __device__ __forceinline__ static double apply(unsigned word, double low, double high) {
    const double u = static_cast<double>(philox_unit<24>(word));
    const double v = __dadd_rn(__dmul_rn(u, high - low), low);
    return v == high ? low : v;
  }
};

template <typename T, int Bits>
__device__ __forceinline__ T philox_uniform(long long index, long long seed, long long counter,
                                            double low, double high) {
  return UniformFromWord<T, Bits>::apply(philox_word(index, seed, counter), low, high);
}

// The uniform draws of N consecutive elements from index0 (both multiples of 4, lower/
// vectorize.py checks): the 4 words of each block.
template <typename T, int Bits, int N>
__device__ __forceinline__ void philox_uniform_vec(T* out, long long index0, long long seed,
                                                   long long counter, double low, double high) {
  static_assert(N % 4 == 0, "pf::philox_uniform_vec: N must be a multiple of 4");
  philox_blocks<N / 4>(seed, counter, static_cast<unsigned long long>(index0) >> 2,
                       [&](int q, const PhiloxBlock& b) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[4 * q + k] = UniformFromWord<T, Bits>::apply(b.w[k], low, high);
  });
}

// mean + std * sqrt(-2 log u1) * cos(2 pi u2) (Box-Muller) from two words: as
// runtime/philox.normal up to the rounding of logf, sqrtf and cosf.
__device__ __forceinline__ float normal_from_words(unsigned w1, unsigned w2, double mean,
                                                   double std) {
  const float u1 = __fmul_rn(static_cast<float>(w1 >> 8) + 1.0f, 5.9604644775390625e-08f);
  const float u2 = philox_unit<24>(w2);
  const float z = __fmul_rn(sqrtf(__fmul_rn(-2.0f, logf(u1))), cosf(__fmul_rn(6.2831855f, u2)));
  return __fadd_rn(__fmul_rn(z, static_cast<float>(std)), static_cast<float>(mean));
}

// The element's normal draw: words 2 * (index % 2) and the next of block index / 2.
__device__ __forceinline__ float philox_normal(long long index, long long seed, long long counter,
                                               double mean, double std) {
  const PhiloxBlock b = philox_block(seed, counter, static_cast<unsigned long long>(index) >> 1);
  const int first = 2 * static_cast<int>(index & 1);
  return normal_from_words(b.w[first], b.w[first + 1], mean, std);
}

// The normal draws of N consecutive elements from index0 (both multiples of 4): two per block.
template <typename T, int N>
__device__ __forceinline__ void philox_normal_vec(T* out, long long index0, long long seed,
                                                  long long counter, double mean, double std) {
  static_assert(N % 4 == 0, "pf::philox_normal_vec: N must be a multiple of 4");
  philox_blocks<N / 2>(seed, counter, static_cast<unsigned long long>(index0) >> 1,
                       [&](int q, const PhiloxBlock& b) {
    out[2 * q] = cast<T>(normal_from_words(b.w[0], b.w[1], mean, std));
    out[2 * q + 1] = cast<T>(normal_from_words(b.w[2], b.w[3], mean, std));
  });
}

#undef PF_OUTLINED

}  // namespace pf
