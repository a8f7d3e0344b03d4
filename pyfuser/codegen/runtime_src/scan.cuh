// pyfuser device library: scan.cuh
// Block and cluster scans: the exclusive prefix of one value per thread (a thread's chunk total)
// in threadIdx.x order within each row (threadIdx.y) of the block, and across the CTAs of a
// thread-block cluster in rank order or the blocks along blockIdx.y (chained through global
// memory). Depends on types.cuh (bit_cast), memory.cuh (smem_addr),
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

namespace detail {

template <typename T>
__device__ __forceinline__ T ld_relaxed_gpu(const T* p) {
  if constexpr (sizeof(T) == 4) {
    unsigned u;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(u) : "l"(p) : "memory");
    return bit_cast<T>(u);
  } else {
    unsigned long long u;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(u) : "l"(p) : "memory");
    return bit_cast<T>(u);
  }
}

template <typename T>
__device__ __forceinline__ void st_relaxed_gpu(T* p, T v) {
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(bit_cast<unsigned>(v))
                 : "memory");
  } else {
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p),
                 "l"(bit_cast<unsigned long long>(v)) : "memory");
  }
}

__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long* p) {
  unsigned long long u;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(u) : "l"(p) : "memory");
  return u;
}

__device__ __forceinline__ void st_release_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

}  // namespace detail

// Exclusive scan of one value per row of threads (threadIdx.y, z) across the blocks along
// blockIdx.y, in blockIdx.y order, through global memory (a single-pass scan with decoupled
// look-back, as Merrill and Garland's): returns op of the totals of the row's blocks with a
// lower blockIdx.y (the identity for y 0). Every thread of the block calls it; the row's first
// warp does the work, the other warps get the prefix through `smem` (the block scan's workspace:
// one element per warp of each row) or, with one warp per row, a shuffle.
//
// Each block publishes its inclusive prefix (status 2) as soon as it has it. When the block
// before it has published its own, that gives the prefix at once (the usual case with many rows:
// the block before started a wave earlier). Otherwise the block publishes its total (status 1,
// an aggregate) and its first warp looks back over the 32 blocks before it, a lane each: once
// every lane sees a status, the blocks up to the nearest inclusive prefix are combined in order;
// with none among the 32, their aggregates are combined and the next 32 are read. A block waits
// only for blocks to publish a status, which each does before it waits itself.
//
// Progress: the blocks before along y have lower linear indices, so the GPU, which starts blocks
// in linear order, has started them before this one (CUB's single-pass scan relies on the same
// order).
// Memory: `values` holds two slots per row of threads of every block (aggregates, then inclusive
// prefixes; grid order, then the row), `flags` one 64-bit word per row of every block: a
// launch's generation times 4 plus the status. Every launch writes every block's word, so at
// the start of a launch all words hold the last launch's generation (0: the host's zeros), and
// this launch's is one more; each block reads it from its own word, which only it writes. A word
// of the last launch is no status of this one, so nothing is reset between launches, replays of
// a captured CUDA graph included. A value is stored before the st.release of its flag and read
// after the ld.acquire that sees the flag: the release/acquire pair at GPU scope orders them.
template <typename T, typename Op>
__device__ __forceinline__ T chained_exclusive_scan_row(T total, T* values,
                                                        unsigned long long* flags, T* smem,
                                                        Op op) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::chained_exclusive_scan_row: 4 or 8 bytes");
  const unsigned rows = blockDim.y * blockDim.z;
  const unsigned row = linear_row_idx();
  const unsigned long long n = static_cast<unsigned long long>(gridDim.x) * gridDim.y *
                               gridDim.z * rows;              // slots of each array
  const unsigned long long step = static_cast<unsigned long long>(gridDim.x) * rows;
  const unsigned long long first =                           // this row's slot at y 0
      (static_cast<unsigned long long>(blockIdx.z) * gridDim.y * gridDim.x + blockIdx.x) * rows +
      row;
  const unsigned y = blockIdx.y;
  T* aggregates = values;
  T* inclusive = values + n;
  T prefix = identity<Op, T>();
  if (threadIdx.x < 32) {
    const unsigned lane = threadIdx.x;
    const unsigned long long mine = first + y * step;
    unsigned long long gen = 0, before = 0;
    T v = identity<Op, T>();
    if (lane == 0) {
      gen = (detail::ld_relaxed_gpu(flags + mine) >> 2) + 1;
      if (y > 0) before = detail::ld_acquire_gpu(flags + mine - step);
      if (y > 0 && before == gen * 4 + 2) v = detail::ld_relaxed_gpu(inclusive + mine - step);
    }
    gen = shfl_idx(gen, 0);
    const unsigned long long aggregate_ready = gen * 4 + 1, inclusive_ready = gen * 4 + 2;
    if (y > 0 && shfl_idx(before, 0) == inclusive_ready) {
      prefix = shfl_idx(v, 0);
    } else if (y > 0) {
      if (lane == 0) {
        detail::st_relaxed_gpu(aggregates + mine, total);
        detail::st_release_gpu(flags + mine, aggregate_ready);
      }
      long long j = static_cast<long long>(y) - 1 - lane;    // the block this lane reads
      while (true) {
        // Lanes past block 0 read nothing: an identity marked inclusive (block 0 is nearer).
        bool incl = true;
        v = identity<Op, T>();
        if (j >= 0) {
          const unsigned long long at = first + static_cast<unsigned long long>(j) * step;
          unsigned long long f;
          do {
            f = detail::ld_acquire_gpu(flags + at);
          } while (f != aggregate_ready && f != inclusive_ready);
          incl = f == inclusive_ready;
          v = detail::ld_relaxed_gpu((incl ? inclusive : aggregates) + at);
        }
        const unsigned found = __ballot_sync(0xffffffffu, incl);
        const unsigned stop = found ? unsigned(__ffs(found) - 1) : 31u;   // nearest inclusive
        if (lane > stop) v = identity<Op, T>();
        // Lanes 0..stop in order, the farthest (earliest) first: op(v[stop], .., v[0]).
#pragma unroll
        for (unsigned offset = 1; offset < 32; offset *= 2) {
          const T earlier = shfl_idx(v, int(lane + offset < 32 ? lane + offset : lane));
          if (lane % (2 * offset) == 0 && lane + offset < 32) v = op(earlier, v);
        }
        prefix = op(shfl_idx(v, 0), prefix);
        if (found != 0) break;
        j -= 32;
      }
    }
    if (lane == 0) {
      detail::st_relaxed_gpu(inclusive + mine, op(prefix, total));
      detail::st_release_gpu(flags + mine, inclusive_ready);
    }
  }
  const unsigned nw = blockDim.x / 32;
  if (nw == 1) return shfl_idx(prefix, 0);
  T* mine_row = smem + row * nw;
  if (threadIdx.x == 0) mine_row[0] = prefix;
  __syncthreads();
  prefix = mine_row[0];
  __syncthreads();  // read by all before the workspace may be reused
  return prefix;
}
}  // namespace pf
