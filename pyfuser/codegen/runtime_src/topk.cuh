// pyfuser device library: topk.cuh
// Block top-k: the k largest (or smallest) elements of each row of the block and their indices,
// the row held in registers across threadIdx.x (lower/topk.py). Depends on types.cuh (widen),
// math.cuh (the arg keys) and reduce.cuh (shfl_xor, linear_row_idx).

namespace pf {

namespace detail {
// A top-k key: as arg_max_key (value order high, 2^32 - 1 - index low, so of equal values the
// lowest index wins a max), NaN above every number for the largest, below for the smallest
// (torch.topk counts NaN larger than any number either way). Every key of an index below
// 2^32 - 1 is above topk_none() (an element taken, or past the row).
__device__ __forceinline__ constexpr long long topk_none() {
  return static_cast<long long>(0x8000000000000000ull);
}
template <bool LARGEST>
__device__ __forceinline__ long long topk_key(float v, long long i) {
  return LARGEST ? arg_max_key(v, i) : arg_key(v != v ? int(0x80000000u) : ~float_order(v), i);
}
template <bool LARGEST>
__device__ __forceinline__ long long topk_key(int v, long long i) {
  return LARGEST ? arg_max_key(v, i) : arg_min_key(v, i);
}
__device__ __forceinline__ float topk_order_value(float v) { return v; }
__device__ __forceinline__ float topk_order_value(bf16 v) { return widen(v); }
__device__ __forceinline__ float topk_order_value(half v) { return widen(v); }
__device__ __forceinline__ int topk_order_value(int v) { return v; }
// The largest key of the chunk's valid elements (index below n) not in `taken`.
template <bool LARGEST, int CHUNK, typename T>
__device__ __forceinline__ long long topk_best(const T (&chunk)[CHUNK], long long base,
                                               long long n, unsigned taken) {
  long long best = topk_none();
#pragma unroll
  for (int e = 0; e < CHUNK; ++e) {
    const long long k = topk_key<LARGEST>(topk_order_value(chunk[e]), base + e);
    best = (base + e < n && !((taken >> e) & 1u) && k > best) ? k : best;
  }
  return best;
}
}  // namespace detail

// Thread t holds elements t * CHUNK + e (e < CHUNK) of its row in `chunk`; those at or past `n`
// are ignored. K rounds: each takes the row-wide max of the threads' best remaining keys
// (shuffles; across warps, one slot per warp in shared memory, double-buffered so that one
// barrier a round suffices), and the thread holding that element writes its index and value
// into the row's result slots j. After a barrier, result j goes to values[j / STRIDE] and
// indices[j / STRIDE] of thread j % STRIDE (STRIDE 0: to values[j], indices[j] of every thread). Every thread of the block calls it (blockDim.x whole
// warps; rows along y and z); smem: rows x (2 x warps + 2 x K) int64 slots.
template <int CHUNK, int KOUT, int STRIDE, int K, bool LARGEST, typename T>
__device__ __forceinline__ void block_topk_x(const T (&chunk)[CHUNK], long long n,
                                             T (&values)[KOUT], long long (&indices)[KOUT],
                                             long long* smem) {
  static_assert(CHUNK <= 32 && (STRIDE ? KOUT * STRIDE : KOUT) >= K,
                "pf::block_topk_x: chunk or results");
  static_assert(sizeof(T) <= 8, "pf::block_topk_x: values of 8 bytes at most");
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  const unsigned nw = (blockDim.x + 31) / 32;
  long long* slots = smem + linear_row_idx() * (2 * nw + 2 * K);
  long long* found_index = slots + 2 * nw;
  T* found_value = reinterpret_cast<T*>(found_index + K);
  const long long base = static_cast<long long>(threadIdx.x) * CHUNK;
  // Keys are recomputed from the values rather than kept (2 registers each): only the thread
  // holding a round's element scans its chunk again.
  unsigned taken = 0;
  long long best = detail::topk_best<LARGEST>(chunk, base, n, taken);
  for (int j = 0; j < K; ++j) {
    long long w = best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const long long other = shfl_xor(w, o);
      w = other > w ? other : w;
    }
    if (nw > 1) {
      long long* round = slots + (j & 1) * nw;
      if (lane == 0) round[warp] = w;
      __syncthreads();
      w = round[0];
      for (unsigned q = 1; q < nw; ++q) w = round[q] > w ? round[q] : w;
    }
    if (best == w) {  // keys are unique: this thread holds the round's element
      const int e = int(arg_key_index(w) - base);
      found_index[j] = base + e;
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) {
        if (c == e) found_value[j] = chunk[c];
      }
      taken |= 1u << e;
      best = detail::topk_best<LARGEST>(chunk, base, n, taken);
    }
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < KOUT; ++q) {
    const int j = STRIDE ? q * STRIDE + int(threadIdx.x) : q;
    if ((STRIDE == 0 || threadIdx.x < unsigned(STRIDE)) && j < K) {
      indices[q] = found_index[j];
      values[q] = found_value[j];
    }
  }
  __syncthreads();  // the slots are read by all before the workspace may be reused
}

}  // namespace pf
