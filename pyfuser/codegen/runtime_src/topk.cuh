// pyfuser device library: topk.cuh
// Block top-k: the k largest (or smallest) elements of each row of the block and their indices,
// the row held in registers across threadIdx.x (lower/topk.py). Depends on types.cuh (widen,
// cast), math.cuh (float_order) and reduce.cuh (linear_row_idx).

namespace pf {

namespace detail {
// A top-k key orders a row's elements, the k largest keys being the k results in order: high
// 32 bits the value's order (math.cuh's float_order: -0 as +0, which torch counts equal; int32
// as it is), inverted for the smallest; NaN above every number for the largest and below for
// the smallest (torch.topk counts NaN larger than any number either way). Low 32 bits
// (2^31 - 1 - index) << 1, so of equal values the lowest index wins a max, and in bit 0 whether
// the value is -0 (the value comes back from the key bit for bit, NaN as the canonical NaN).
// Indices must be below 2^31 (rows of at most 16384: schedulers/topk.py). Every key is above
// topk_none() (an element taken, or past the row).
__device__ __forceinline__ constexpr long long topk_none() {
  return static_cast<long long>(0x8000000000000000ull);
}
__device__ __forceinline__ long long topk_key_of(int order, long long i, bool negative_zero) {
  const unsigned low = ((0x7fffffffu - static_cast<unsigned>(i)) << 1) | unsigned(negative_zero);
  return static_cast<long long>(
      (static_cast<unsigned long long>(static_cast<unsigned>(order)) << 32) | low);
}
template <bool LARGEST>
__device__ __forceinline__ long long topk_key(float v, long long i) {
  const int order = v != v ? (LARGEST ? 0x7fffffff : int(0x80000000u))
                           : (LARGEST ? float_order(v) : ~float_order(v));
  return topk_key_of(order, i, __float_as_int(v) == int(0x80000000u));
}
template <bool LARGEST>
__device__ __forceinline__ long long topk_key(int v, long long i) {
  return topk_key_of(LARGEST ? v : ~v, i, false);
}
__device__ __forceinline__ long long topk_key_index(long long key) {
  return 0x7fffffff - static_cast<long long>(static_cast<unsigned>(key) >> 1);
}
template <bool LARGEST>
__device__ __forceinline__ float topk_value(long long key, float*) {
  const int order = LARGEST ? int(key >> 32) : ~int(key >> 32);   // NaN: 0x7fffffff either way
  if (order == 0x7fffffff) return __int_as_float(0x7fc00000);
  if (key & 1) return __int_as_float(int(0x80000000u));
  return __int_as_float(order ^ ((order >> 31) & 0x7fffffff));    // float_order's inverse
}
template <bool LARGEST>
__device__ __forceinline__ int topk_value(long long key, int*) {
  return LARGEST ? int(key >> 32) : ~int(key >> 32);
}
__device__ __forceinline__ long long topk_max(long long a, long long b) { return a > b ? a : b; }
// The largest of N keys in registers, as a tree (log2 N dependent steps).
template <int N>
__device__ __forceinline__ long long topk_tree_max(const long long (&key)[N]) {
  long long t[N];
#pragma unroll
  for (int e = 0; e < N; ++e) t[e] = key[e];
#pragma unroll
  for (int s = 1; s < N; s <<= 1) {
#pragma unroll
    for (int e = 0; e + s < N; e += 2 * s) t[e] = topk_max(t[e], t[e + s]);
  }
  return t[0];
}
// The warp's max key in every lane: redux.sync (sm_80+) on the high words, then on the low
// words of the lanes holding the highest (others give 0, below every key's low word but
// topk_none()'s, which then is the max). Two warp reductions where shuffles took five steps of
// a 64-bit compare.
__device__ __forceinline__ long long topk_warp_max(long long v) {
  const int hi = int(v >> 32);
  int max_hi;
  asm volatile("redux.sync.max.s32 %0, %1, 0xffffffff;" : "=r"(max_hi) : "r"(hi));
  const unsigned lo = hi == max_hi ? static_cast<unsigned>(v) : 0u;
  unsigned max_lo;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(max_lo) : "r"(lo));
  return static_cast<long long>(
      (static_cast<unsigned long long>(static_cast<unsigned>(max_hi)) << 32) | max_lo);
}
}  // namespace detail

// Thread t holds elements t * CHUNK + e (e < CHUNK) of its row in `chunk`; those at or past `n`
// are ignored. Each thread keys its elements once (registers); then K rounds: the row-wide max
// of the threads' best keys (topk_warp_max; across warps, one shared slot per warp,
// double-buffered so that one barrier a round suffices, reduced the same way again), recorded in the row's
// result slot j; the thread holding it drops that key and takes the tree max of the rest.
// After the rounds, result j (its value and index decoded from the key) goes to
// values[j / STRIDE] and indices[j / STRIDE] of thread j % STRIDE (STRIDE 0: values[j],
// indices[j] of every thread). Every thread of the block calls it (blockDim.x whole warps; rows
// along y and z); smem: rows x (2 x warps + K) int64 slots.
template <int CHUNK, int KOUT, int STRIDE, int K, bool LARGEST, typename T>
__device__ __forceinline__ void block_topk_x(const T (&chunk)[CHUNK], long long n,
                                             T (&values)[KOUT], long long (&indices)[KOUT],
                                             long long* smem) {
  static_assert(CHUNK <= 32 && (STRIDE ? KOUT * STRIDE : KOUT) >= K,
                "pf::block_topk_x: chunk or results");
  using Order = decltype(widen(chunk[0]));
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  const unsigned nw = (blockDim.x + 31) / 32;
  long long* slots = smem + linear_row_idx() * (2 * nw + K);
  long long* found = slots + 2 * nw;
  const long long base = static_cast<long long>(threadIdx.x) * CHUNK;
  long long key[CHUNK];
#pragma unroll
  for (int e = 0; e < CHUNK; ++e) {
    const long long k = detail::topk_key<LARGEST>(widen(chunk[e]), base + e);
    key[e] = base + e < n ? k : detail::topk_none();
  }
  long long best = detail::topk_tree_max(key);
  for (int j = 0; j < K; ++j) {
    long long w = detail::topk_warp_max(best);
    if (nw > 1) {
      long long* round = slots + (j & 1) * nw;
      if (lane == 0) round[warp] = w;
      __syncthreads();
      w = detail::topk_warp_max(lane < nw ? round[lane] : detail::topk_none());
    }
    if (threadIdx.x == 0) found[j] = w;
    if (best == w) {  // keys are unique: this thread holds the round's element
#pragma unroll
      for (int e = 0; e < CHUNK; ++e) key[e] = key[e] == w ? detail::topk_none() : key[e];
      best = detail::topk_tree_max(key);
    }
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < KOUT; ++q) {
    const int j = STRIDE ? q * STRIDE + int(threadIdx.x) : q;
    if ((STRIDE == 0 || threadIdx.x < unsigned(STRIDE)) && j < K) {
      const long long w = found[j];
      indices[q] = detail::topk_key_index(w);
      values[q] = cast<T>(detail::topk_value<LARGEST>(w, static_cast<Order*>(nullptr)));
    }
  }
  __syncthreads();  // the slots are read by all before the workspace may be reused
}

}  // namespace pf
