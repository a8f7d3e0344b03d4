// pyfuser device library: types.cuh
// 16- and 8-bit float types, fixed-size register arrays, numeric limits, casts, integer helpers.
// First in the concatenation order; depends on nothing. NVRTC compiles it without any CUDA header.

namespace pf {

// ---------------------------------------------------------------------------------------------
// bf16 / half: plain 16-bit aggregates (no constructors), so they can live in __shared__ arrays
// and unions, and so a generated kernel decides every conversion explicitly.
// ---------------------------------------------------------------------------------------------
struct alignas(2) bf16 {
  unsigned short bits;
};
struct alignas(2) half {
  unsigned short bits;
};

__device__ __forceinline__ bf16 bf16_from_bits(unsigned short b) {
  bf16 r;
  r.bits = b;
  return r;
}
__device__ __forceinline__ half half_from_bits(unsigned short b) {
  half r;
  r.bits = b;
  return r;
}

// Round-to-nearest-even, NaN -> canonical NaN, overflow -> inf: the hardware conversion, which is
// also what torch's CUDA kernels use, so results match torch bit for bit.
__device__ __forceinline__ bf16 float_to_bf16(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return bf16_from_bits(b);
}
__device__ __forceinline__ half float_to_half(float f) {
  unsigned short b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return half_from_bits(b);
}
// bf16 is the upper half of a float, so widening is exact with a shift (cheaper than cvt).
__device__ __forceinline__ float bf16_to_float(bf16 h) {
  return __uint_as_float(static_cast<unsigned>(h.bits) << 16);
}
__device__ __forceinline__ float half_to_float(half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}

// Two floats -> one 32-bit word holding two bf16 (lo in bits 0..15), for vectorized stores.
// cvt.rn.bf16x2.f32 puts its FIRST source in the upper half, hence the swapped operands.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// ---------------------------------------------------------------------------------------------
// float8 e4m3fn / e5m2 (sm_89+ cvt): one-byte aggregates, as bf16 / half. Every conversion equals
// torch's (c10::Float8_e4m3fn(float), Float8_e5m2(float); pyfuser/runtime/float8.py states the
// rules) bit for bit: cvt rounds to nearest even, and the checks around it are where torch and
// cvt differ. Into float8, cvt exists only with .satfinite (magnitudes past the largest finite
// value, infinity included, become it, as torch's e4m3fn does) and gives a NaN without its sign.
// Each converter passes its one value as both halves of the x2 instruction, so no lane order is
// assumed.
// ---------------------------------------------------------------------------------------------
struct alignas(1) fp8e4m3 {
  unsigned char bits;
};
struct alignas(1) fp8e5m2 {
  unsigned char bits;
};

__device__ __forceinline__ fp8e4m3 fp8e4m3_from_bits(unsigned b) {
  fp8e4m3 r;
  r.bits = static_cast<unsigned char>(b);
  return r;
}
__device__ __forceinline__ fp8e5m2 fp8e5m2_from_bits(unsigned b) {
  fp8e5m2 r;
  r.bits = static_cast<unsigned char>(b);
  return r;
}

namespace detail {
// |f|'s bits, and f's sign as a float8's top bit.
__device__ __forceinline__ unsigned float_magnitude_bits(float f) {
  return __float_as_uint(f) & 0x7fffffffu;
}
__device__ __forceinline__ unsigned float8_sign(float f) { return (__float_as_uint(f) >> 24) & 0x80u; }
constexpr unsigned kFloatInfBits = 0x7f800000u;   // magnitudes above it are NaN
constexpr unsigned kFloat464Bits = 0x43e80000u;   // e4m3fn's tie between 448 and (NaN) 480
constexpr bool kE4m3OverflowIsNan = false;        // the installed torch's rule: device_library.py
constexpr unsigned kFloat61440Bits = 0x47700000u; // e5m2's first magnitude that rounds to inf
}  // namespace detail

// float -> e4m3fn: past 448 (infinity included) +-448, as .satfinite gives and torch 2.13
// converts; with kE4m3OverflowIsNan (which codegen/device_library.py writes true for a torch
// before 2.13) a magnitude above 464 is NaN instead, as those releases convert. NaN keeps its
// sign (0x7f / 0xff).
__device__ __forceinline__ fp8e4m3 float_to_fp8e4m3(float f) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(pair) : "f"(f));
  const unsigned nan = 0x7fu | detail::float8_sign(f);
  const unsigned mag = detail::float_magnitude_bits(f);
  const unsigned limit = detail::kE4m3OverflowIsNan ? detail::kFloat464Bits : detail::kFloatInfBits;
  return fp8e4m3_from_bits(mag > limit ? nan : pair & 0xffu);
}
// float -> e5m2: IEEE-like in torch: from 61440 up (the tie between 57344 and 65536 goes to the
// even 65536) +-inf, where .satfinite gives +-57344; NaN keeps its sign.
__device__ __forceinline__ fp8e5m2 float_to_fp8e5m2(float f) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(pair) : "f"(f));
  const unsigned mag = detail::float_magnitude_bits(f), sign = detail::float8_sign(f);
  return fp8e5m2_from_bits(mag > detail::kFloatInfBits         ? 0x7fu | sign
                           : mag >= detail::kFloat61440Bits ? 0x7cu | sign
                                                            : pair & 0xffu);
}
// float8 -> float: exact (every float8 value is a half, then a float); the sign ORed back in,
// which a NaN would otherwise lose (torch keeps it) and which every other value already has.
__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float fp8e4m3_to_float(fp8e4m3 v) {
  unsigned halves;
  const unsigned short pair = static_cast<unsigned short>(v.bits * 0x101u);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
  const float f = half_bits_to_float(static_cast<unsigned short>(halves & 0xffffu));
  return __uint_as_float(__float_as_uint(f) | (static_cast<unsigned>(v.bits & 0x80u) << 24));
}
// e5m2 is the upper byte of a half: no cvt needed to widen it.
__device__ __forceinline__ float fp8e5m2_to_float(fp8e5m2 v) {
  const float f = half_bits_to_float(static_cast<unsigned short>(v.bits << 8));
  return __uint_as_float(__float_as_uint(f) | (static_cast<unsigned>(v.bits & 0x80u) << 24));
}

// ---------------------------------------------------------------------------------------------
// cast<To>(from): the one conversion the code generator emits between any two scalar types.
// Conversions into bf16/half/float8 go through float, as torch's c10::BFloat16/Half/Float8_*
// constructors do (double -> bf16 is therefore double-rounded exactly like torch).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float widen(bf16 v) { return bf16_to_float(v); }
__device__ __forceinline__ float widen(half v) { return half_to_float(v); }
__device__ __forceinline__ float widen(fp8e4m3 v) { return fp8e4m3_to_float(v); }
__device__ __forceinline__ float widen(fp8e5m2 v) { return fp8e5m2_to_float(v); }
template <typename T>
__device__ __forceinline__ T widen(T v) {
  return v;
}

namespace detail {
template <typename To>
struct CastTo {
  template <typename From>
  __device__ __forceinline__ static To apply(From v) {
    return static_cast<To>(widen(v));
  }
};
template <>
struct CastTo<bf16> {
  template <typename From>
  __device__ __forceinline__ static bf16 apply(From v) {
    return float_to_bf16(static_cast<float>(widen(v)));
  }
  __device__ __forceinline__ static bf16 apply(bf16 v) { return v; }
};
template <>
struct CastTo<half> {
  template <typename From>
  __device__ __forceinline__ static half apply(From v) {
    return float_to_half(static_cast<float>(widen(v)));
  }
  __device__ __forceinline__ static half apply(half v) { return v; }
};
template <>
struct CastTo<fp8e4m3> {
  template <typename From>
  __device__ __forceinline__ static fp8e4m3 apply(From v) {
    return float_to_fp8e4m3(static_cast<float>(widen(v)));
  }
  __device__ __forceinline__ static fp8e4m3 apply(fp8e4m3 v) { return v; }
};
template <>
struct CastTo<fp8e5m2> {
  template <typename From>
  __device__ __forceinline__ static fp8e5m2 apply(From v) {
    return float_to_fp8e5m2(static_cast<float>(widen(v)));
  }
  __device__ __forceinline__ static fp8e5m2 apply(fp8e5m2 v) { return v; }
};
}  // namespace detail

template <typename To, typename From>
__device__ __forceinline__ To cast(From v) {
  return detail::CastTo<To>::apply(v);
}

// ---------------------------------------------------------------------------------------------
// Array<T, N>: a register array that can be moved with one vector instruction. Its alignment is
// the largest power of two dividing sizeof(T) * N, capped at 16 (the widest ld/st), and never
// below alignof(T).
// ---------------------------------------------------------------------------------------------
namespace detail {
__host__ __device__ constexpr int array_align(int bytes, int min_align) {
  int a = 1;
  while (a < 16 && bytes % (a * 2) == 0) a *= 2;
  return a < min_align ? min_align : a;
}
}  // namespace detail

template <typename T, int N, int Align = detail::array_align(int(sizeof(T)) * N, int(alignof(T)))>
struct alignas(Align) Array {
  static_assert(N > 0, "pf::Array needs N > 0");
  // A function, not a static data member: NVRTC would emit the member as a .global symbol.
  __host__ __device__ static constexpr int size() { return N; }
  T data[N];
  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }
};

// ---------------------------------------------------------------------------------------------
// Integer helpers. Two template types so that mixed operands (int64 extent, int literal) deduce.
// ---------------------------------------------------------------------------------------------
template <typename A, typename B>
__host__ __device__ __forceinline__ constexpr auto ceil_div(A a, B b) -> decltype(a + b) {
  return (a + b - 1) / b;
}
template <typename A, typename B>
__host__ __device__ __forceinline__ constexpr auto round_up(A a, B b) -> decltype(a + b) {
  return ceil_div(a, b) * b;
}
// max and min of two integers of mixed types (a slice's clamped extent: max(0, n - 13) with n
// an int64 parameter), in their common type; CUDA's overloads of max/min are ambiguous there.
// Not constexpr, as CUDA's max is not: a divisor max(1 - 1, 0) (the variance of a one-element
// row, 0 / 0 = NaN as in torch) is then no constant zero the front end warns about.
template <typename A, typename B>
__host__ __device__ __forceinline__ auto imax(A a, B b) -> decltype(a + b) {
  return a > b ? a : b;
}
template <typename A, typename B>
__host__ __device__ __forceinline__ auto imin(A a, B b) -> decltype(a + b) {
  return a < b ? a : b;
}

// ---------------------------------------------------------------------------------------------
// Numeric limits without <limits>. lowest/highest are the finite extremes (as std::numeric_limits);
// max_identity/min_identity are the reduction init values (-inf/+inf for floating types).
// ---------------------------------------------------------------------------------------------
template <typename T>
struct Limits;

template <>
struct Limits<float> {
  __device__ __forceinline__ static float infinity() { return __int_as_float(0x7f800000); }
  __device__ __forceinline__ static float quiet_nan() { return __int_as_float(0x7fc00000); }
  __device__ __forceinline__ static float lowest() { return __int_as_float(0xff7fffff); }
  __device__ __forceinline__ static float highest() { return __int_as_float(0x7f7fffff); }
  __device__ __forceinline__ static float max_identity() { return -infinity(); }
  __device__ __forceinline__ static float min_identity() { return infinity(); }
};
template <>
struct Limits<double> {
  __device__ __forceinline__ static double infinity() { return __longlong_as_double(0x7ff0000000000000ll); }
  __device__ __forceinline__ static double quiet_nan() { return __longlong_as_double(0x7ff8000000000000ll); }
  __device__ __forceinline__ static double lowest() { return __longlong_as_double(0xffefffffffffffffull); }
  __device__ __forceinline__ static double highest() { return __longlong_as_double(0x7fefffffffffffffll); }
  __device__ __forceinline__ static double max_identity() { return -infinity(); }
  __device__ __forceinline__ static double min_identity() { return infinity(); }
};
template <>
struct Limits<bf16> {
  __device__ __forceinline__ static bf16 infinity() { return bf16_from_bits(0x7f80); }
  __device__ __forceinline__ static bf16 quiet_nan() { return bf16_from_bits(0x7fc0); }
  __device__ __forceinline__ static bf16 lowest() { return bf16_from_bits(0xff7f); }
  __device__ __forceinline__ static bf16 highest() { return bf16_from_bits(0x7f7f); }
  __device__ __forceinline__ static bf16 max_identity() { return bf16_from_bits(0xff80); }
  __device__ __forceinline__ static bf16 min_identity() { return infinity(); }
};
template <>
struct Limits<half> {
  __device__ __forceinline__ static half infinity() { return half_from_bits(0x7c00); }
  __device__ __forceinline__ static half quiet_nan() { return half_from_bits(0x7e00); }
  __device__ __forceinline__ static half lowest() { return half_from_bits(0xfbff); }
  __device__ __forceinline__ static half highest() { return half_from_bits(0x7bff); }
  __device__ __forceinline__ static half max_identity() { return half_from_bits(0xfc00); }
  __device__ __forceinline__ static half min_identity() { return infinity(); }
};

namespace detail {
template <typename T, T Lo, T Hi>
struct IntLimits {
  __device__ __forceinline__ static T lowest() { return Lo; }
  __device__ __forceinline__ static T highest() { return Hi; }
  __device__ __forceinline__ static T max_identity() { return Lo; }
  __device__ __forceinline__ static T min_identity() { return Hi; }
};
}  // namespace detail

template <>
struct Limits<bool> : detail::IntLimits<bool, false, true> {};
template <>
struct Limits<signed char> : detail::IntLimits<signed char, -128, 127> {};
template <>
struct Limits<unsigned char> : detail::IntLimits<unsigned char, 0, 255> {};
template <>
struct Limits<short> : detail::IntLimits<short, -32768, 32767> {};
template <>
struct Limits<unsigned short> : detail::IntLimits<unsigned short, 0, 65535> {};
template <>
struct Limits<int> : detail::IntLimits<int, -2147483647 - 1, 2147483647> {};
template <>
struct Limits<unsigned> : detail::IntLimits<unsigned, 0u, 4294967295u> {};
template <>
struct Limits<long long>
    : detail::IntLimits<long long, -9223372036854775807ll - 1, 9223372036854775807ll> {};
template <>
struct Limits<unsigned long long>
    : detail::IntLimits<unsigned long long, 0ull, 18446744073709551615ull> {};

template <typename T>
__device__ __forceinline__ T infinity() {
  return Limits<T>::infinity();
}
template <typename T>
__device__ __forceinline__ T quiet_nan() {
  return Limits<T>::quiet_nan();
}
template <typename T>
__device__ __forceinline__ T lowest() {
  return Limits<T>::lowest();
}
template <typename T>
__device__ __forceinline__ T highest() {
  return Limits<T>::highest();
}
template <typename T>
__device__ __forceinline__ T max_identity() {
  return Limits<T>::max_identity();
}
template <typename T>
__device__ __forceinline__ T min_identity() {
  return Limits<T>::min_identity();
}

// Raw 8- and 16-byte register bundles for vector memory instructions and 64-bit shuffles.
namespace detail {
struct alignas(8) U32x2 {
  unsigned x, y;
};
struct alignas(16) U32x4 {
  unsigned x, y, z, w;
};
}  // namespace detail

// Reinterpret the bits of a trivially copyable value (used by shuffles and asynchronous stores).
template <typename To, typename From>
__device__ __forceinline__ To bit_cast(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "pf::bit_cast needs equal sizes");
  // Union punning is the form NVVM reliably folds into a register move (no memcpy without headers).
  union {
    From from;
    To to;
  } u;
  u.from = v;
  return u.to;
}

}  // namespace pf
