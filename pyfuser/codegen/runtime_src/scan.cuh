// pyfuser device library: scan.cuh
// Block and cluster scans: the exclusive prefix of one value per thread (a thread's chunk total)
// in threadIdx.x order within each row (threadIdx.y) of the block, and across the CTAs of a
// thread-block cluster in rank order. Depends on types.cuh (bit_cast), memory.cuh (smem_addr),
// reduce.cuh (operators, identity, linear_row_idx) and cluster.cuh (ranks, mapa, the cluster
// barrier).
//
// Scan operators: OpSum (reduce.cuh) and OpProd. They need associativity (up to rounding),
// not commutativity: every combine is op(earlier, later).

namespace pf {

struct OpProd {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a * b;
  }
  template <typename T>
  __device__ __forceinline__ static T identity() {
    return T(1);
  }
};

// Lane (lane - delta)'s value; lanes below delta get their own. 4- or 8-byte values.
template <typename T>
__device__ __forceinline__ T shfl_up(T v, int delta) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::shfl_up: 4- or 8-byte types only");
  if constexpr (sizeof(T) == 4) {
    unsigned u = bit_cast<unsigned>(v);
    asm volatile("shfl.sync.up.b32 %0, %0, %1, 0x0, 0xffffffff;" : "+r"(u) : "r"(delta));
    return bit_cast<T>(u);
  } else {
    detail::U32x2 u = bit_cast<detail::U32x2>(v);
    asm volatile("shfl.sync.up.b32 %0, %0, %1, 0x0, 0xffffffff;" : "+r"(u.x) : "r"(delta));
    asm volatile("shfl.sync.up.b32 %0, %0, %1, 0x0, 0xffffffff;" : "+r"(u.y) : "r"(delta));
    return bit_cast<T>(u);
  }
}

// Lane `src`'s value, 4- or 8-byte values.
template <typename T>
__device__ __forceinline__ T shfl_idx(T v, int src) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::shfl_idx: 4- or 8-byte types only");
  if constexpr (sizeof(T) == 4) {
    unsigned u = bit_cast<unsigned>(v);
    asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(u) : "r"(src));
    return bit_cast<T>(u);
  } else {
    detail::U32x2 u = bit_cast<detail::U32x2>(v);
    asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(u.x) : "r"(src));
    asm volatile("shfl.sync.idx.b32 %0, %0, %1, 0x1f, 0xffffffff;" : "+r"(u.y) : "r"(src));
    return bit_cast<T>(u);
  }
}

// Inclusive scan across the 32 lanes of a full warp (Kogge-Stone, 5 shuffles up).
template <typename T, typename Op>
__device__ __forceinline__ T warp_inclusive_scan(T v, Op op) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const T u = shfl_up(v, offset);
    if (lane >= offset) v = op(u, v);
  }
  return v;
}

// Exclusive scan of v across threadIdx.x within each row of the block: returns op of the values
// of the row's threads with a lower threadIdx.x (the identity for x == 0); `total` gets the
// row's op of all of them, in every thread. blockDim.x must be a multiple of 32 (the scan
// scheduler's rows are whole warps), so a warp lies in one row. One warp per row: shuffles only.
// More: each warp's total goes to smem[row][warp], one barrier, every warp scans the row's warp
// totals again (the same operands in the same order in every warp), and a last barrier lets the
// workspace be reused. smem: block_allreduce_x_smem_elems(1, Dx, rows) elements of T.
template <typename T, typename Op>
__device__ __forceinline__ T block_exclusive_scan_x(T v, T* smem, Op op, T& total) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned warp = threadIdx.x / 32;
  const unsigned nw = blockDim.x / 32;
  const T incl = warp_inclusive_scan(v, op);
  T excl = shfl_up(incl, 1);
  if (lane == 0) excl = identity<Op, T>();
  if (nw == 1) {
    total = shfl_idx(incl, 31);
    return excl;
  }
  T* row = smem + linear_row_idx() * nw;
  if (lane == 31) row[warp] = incl;
  __syncthreads();
  const T w = lane < nw ? row[lane] : identity<Op, T>();
  const T wincl = warp_inclusive_scan(w, op);
  T wexcl = shfl_up(wincl, 1);
  if (lane == 0) wexcl = identity<Op, T>();
  const T before = shfl_idx(wexcl, int(warp));
  total = shfl_idx(wincl, 31);
  __syncthreads();  // the warp totals are read by all before the workspace may be reused
  return op(before, excl);
}

// Exclusive scan of one value per row (threadIdx.y) across the C CTAs of a thread-block cluster,
// in rank order: returns op of the totals of the lower-ranked CTAs (the identity for rank 0).
// Every thread of every CTA calls it with the same `phase` counter and slots as
// cluster_allreduce_row (cluster_reduce.cuh, which describes their reuse); thread x == 0 of each
// row stores its CTA's total into slot [row][my rank] of every higher-ranked CTA, the cluster
// barrier publishes the stores, and each thread combines the slots below its rank in order.
template <int C, typename T, typename Op>
__device__ __forceinline__ T cluster_exclusive_scan_row(T total, T* slots, unsigned rows,
                                                        unsigned& phase, Op op) {
  T* set = slots + (phase & 1u) * rows * C;
  const unsigned row = threadIdx.y;
  const unsigned rank = cluster_ctarank();
  if (threadIdx.x == 0) {
    const unsigned local = smem_addr(&set[row * C + rank]);
    for (unsigned r = rank + 1; r < C; ++r) {
      st_shared_cluster<T>(map_shared_rank(local, r), total);
    }
  }
  cluster_sync();
  T acc = identity<Op, T>();
  for (unsigned r = 0; r < rank; ++r) {
    acc = op(acc, set[row * C + r]);
  }
  ++phase;
  return acc;
}

}  // namespace pf
