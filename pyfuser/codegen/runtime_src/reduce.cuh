// pyfuser device library: reduce.cuh
// Warp and block all-reductions: every participating thread returns the reduced value, and all
// of them return bit-identical values (each thread combines the same operands in the same order),
// so a normalization that divides by a block sum never sees two different sums in one row.
// Depends on types.cuh and math.cuh.
//
// Thread layout. tid = x + Dx * (y + Dy * z) (Dx = blockDim.x ...). A "row" is the Dx threads
// sharing (y, z); block_allreduce_x reduces within each row, block_allreduce_y reduces across y
// for each (x, z).
//
// Synchronization groups. Every block function takes a trailing `Sync` argument:
//   pf::CtaBarrier{}            all threads of the block take part; __syncthreads (bar.sync 0).
//   pf::NamedBarrier{id, n}     only the n threads of a group of whole rows take part (compute
//                               warp groups of a warp-specialized kernel); bar.sync id, n. The group
//                               is rows [g*R, (g+1)*R) with R = n / Dx; n must be a multiple of 32
//                               and of Dx; id in 1..15; `smem` is the group's own workspace.
//                               Prefer constant ids: with a runtime id ptxas reserves all 16
//                               hardware barriers of the CTA.
// All threads of the group must call the function (uniform control flow), with the same `smem`.
// On return the workspace may be reused at once (each function ends with a barrier when it used
// shared memory).

namespace pf {

// --- reduction operators -------------------------------------------------------------------
// Operators must be associative up to rounding and exactly commutative (op(a, b) and op(b, a)
// give the same bits, as IEEE +, max and min do): butterfly partners combine the same pair in
// opposite orders, and that is what keeps every lane's result identical.
struct OpSum {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
  template <typename T>
  __device__ __forceinline__ static T identity() {
    return T(0);
  }
};
// maximum/minimum from math.cuh: a NaN anywhere in the reduced set gives NaN (torch.amax).
struct OpMax {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return maximum(a, b);
  }
  template <typename T>
  __device__ __forceinline__ static T identity() {
    return max_identity<T>();
  }
};
struct OpMin {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return minimum(a, b);
  }
  template <typename T>
  __device__ __forceinline__ static T identity() {
    return min_identity<T>();
  }
};
// logsumexp keys (math.cuh lse_key): (m, s) pairs in an int64, identity (-inf, 0).
struct OpLogSumExp {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return lse_combine(a, b);
  }
  template <typename T>
  __device__ __forceinline__ static T identity() {
    return T(lse_identity());
  }
};

template <typename Op, typename T>
__device__ __forceinline__ T identity() {
  return Op::template identity<T>();
}

// --- named barriers (here because reductions need them first; see warp_group.cuh) ---
// bar.sync/bar.arrive count threads in units of warps: n must be a multiple of 32. Barrier 0 is
// the one __syncthreads uses; give each independent group its own id in 1..15.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned num_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// --- synchronization groups ---------------------------------------------------------------
__device__ __forceinline__ unsigned linear_row_idx() {
  return threadIdx.y + blockDim.y * threadIdx.z;
}

struct CtaBarrier {
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ __forceinline__ unsigned num_rows() const { return blockDim.y * blockDim.z; }
  __device__ __forceinline__ unsigned row() const { return linear_row_idx(); }
};

// The whole block is one row of Dx threads, Dx > 32 and not a multiple of 32 (321 threads for a
// row of 5121 elements): the code generator passes it for such static blocks, and the block
// all-reduce then takes its one-row path (below), chosen at compile time. Only these kernels
// carry that path: an unused path costs registers all the same (with it compiled into every
// kernel, layernorm forward [16384, 4096], two blocks per SM at 128 registers, spilled 120 B).
template <unsigned Dx>
struct OneRowBarrier : CtaBarrier {
  static_assert(Dx > 32 && Dx % 32 != 0, "pf::OneRowBarrier: a row of whole warps and a partial one");
  static constexpr unsigned kDx = Dx;
  __device__ __forceinline__ unsigned num_rows() const { return 1; }
  __device__ __forceinline__ unsigned row() const { return 0; }
};

namespace detail {
template <typename Sync>
struct IsOneRow {
  static constexpr bool value = false;
};
template <unsigned Dx>
struct IsOneRow<OneRowBarrier<Dx>> {
  static constexpr bool value = true;
};
}  // namespace detail

struct NamedBarrier {
  unsigned id;
  unsigned num_threads;
  __device__ __forceinline__ void sync() const { named_barrier_sync(id, num_threads); }
  __device__ __forceinline__ unsigned num_rows() const { return num_threads / blockDim.x; }
  __device__ __forceinline__ unsigned row() const { return linear_row_idx() % num_rows(); }
};

// Shared-memory elements (of T) that block_allreduce_x_group<N> needs for a group of `rows` rows
// of `dx` threads: Dx a multiple of 32 -> N*(Dx/32)*rows (0 when Dx == 32); Dx in {1,2,4,8,16}
// -> 0 (shuffles only); one row of Dx > 32 threads (321) -> N*Dx + N (every value, then the N
// results for the last, partial warp); any other Dx -> Dx*rows (a shared-memory tree, values
// reduced one by one). kir/workspace.py has the same formula for the code generator.
__host__ __device__ __forceinline__ constexpr unsigned block_allreduce_x_smem_elems(
    unsigned n, unsigned dx, unsigned rows) {
  return dx % 32 == 0 ? (dx == 32 ? 0 : n * (dx / 32) * rows)
                      : ((32 % dx == 0) ? 0 : (rows == 1 && dx > 32 ? n * dx + n : dx * rows));
}
// Shared-memory elements for block_allreduce_y_group<N>: N * Dx * rows (rows = Dy*Dz for the
// whole block); left untouched when a column has a single row.
__host__ __device__ __forceinline__ constexpr unsigned block_allreduce_y_smem_elems(
    unsigned n, unsigned dx, unsigned rows) {
  return n * dx * rows;
}

// --- warp level ----------------------------------------------------------------------------
// Butterfly exchange of any 4- or 8-byte value; 8-byte values move as two 32-bit halves.
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask, unsigned member_mask = 0xffffffffu) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::shfl_xor: 4- or 8-byte types only");
  if constexpr (sizeof(T) == 4) {
    unsigned u = bit_cast<unsigned>(v);
    asm volatile("shfl.sync.bfly.b32 %0, %0, %1, 0x1f, %2;" : "+r"(u) : "r"(lane_mask), "r"(member_mask));
    return bit_cast<T>(u);
  } else {
    detail::U32x2 u = bit_cast<detail::U32x2>(v);
    asm volatile("shfl.sync.bfly.b32 %0, %0, %1, 0x1f, %2;" : "+r"(u.x) : "r"(lane_mask), "r"(member_mask));
    asm volatile("shfl.sync.bfly.b32 %0, %0, %1, 0x1f, %2;" : "+r"(u.y) : "r"(lane_mask), "r"(member_mask));
    return bit_cast<T>(u);
  }
}

// All-reduce over aligned segments of Width lanes (Width a power of two <= 32). Lanes outside
// `member_mask` must not call it; lanes inside must all call it. XOR partners of a lane stay
// inside its aligned segment, so no segment clamp is needed.
template <int Width = 32, typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op, unsigned member_mask = 0xffffffffu) {
  static_assert(Width >= 1 && Width <= 32 && (Width & (Width - 1)) == 0,
                "pf::warp_allreduce: Width must be a power of two <= 32");
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2) {
    v = op(v, shfl_xor(v, offset, member_mask));
  }
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_allreduce_sum(T v) {
  return warp_allreduce(v, OpSum());
}
template <typename T>
__device__ __forceinline__ T warp_allreduce_max(T v) {
  return warp_allreduce(v, OpMax());
}
template <typename T>
__device__ __forceinline__ T warp_allreduce_min(T v) {
  return warp_allreduce(v, OpMin());
}

namespace detail {
// Segmented butterfly with a runtime segment width (a power of two < 32).
template <typename T, typename Op>
__device__ __forceinline__ T segment_allreduce(T v, Op op, unsigned width, unsigned member_mask) {
  for (unsigned offset = width / 2; offset > 0; offset /= 2) {
    v = op(v, shfl_xor(v, int(offset), member_mask));
  }
  return v;
}

// Lanes of the calling warp that exist (the last warp of a block may be partial).
__device__ __forceinline__ unsigned active_lane_mask() {
  const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned tid = threadIdx.x + blockDim.x * linear_row_idx();
  const unsigned left = nthreads - (tid & ~31u);
  return left >= 32 ? 0xffffffffu : ((1u << left) - 1u);
}

// Any Dx: classic shared-memory tree within each row. The first step folds the tail beyond the
// largest power of two so the remaining steps halve cleanly. Every thread then reads the root.
template <typename T, typename Op, typename Sync>
__device__ __forceinline__ T row_tree_allreduce(T v, T* smem, Op op, const Sync& sync) {
  const unsigned dx = blockDim.x;
  const unsigned x = threadIdx.x;
  T* r = smem + sync.row() * dx;
  r[x] = v;
  sync.sync();
  const unsigned p = 1u << (31 - __clz(dx));
  if (p != dx) {
    if (x < dx - p) r[x] = op(r[x], r[x + p]);
    sync.sync();
  }
  for (unsigned s = p / 2; s > 0; s /= 2) {
    if (x < s) r[x] = op(r[x], r[x + s]);
    sync.sync();
  }
  const T out = r[0];
  sync.sync();  // the root is read by all before anyone may overwrite the row
  return out;
}
}  // namespace detail

// --- block level, across threadIdx.x --------------------------------------------------------
// Reduces N independent values with one round of synchronization (two barriers) when Dx is a
// multiple of 32: warp butterflies, one partial per warp to smem, then EVERY warp of a row loads
// the row's partials into its lanes and butterflies them again (same data, same order -> the same
// bits in every thread). Dx == 32 and Dx in {1,2,4,8,16} use shuffles only (no barrier at all).
// A block of one row of Dx > 32 threads also takes two barriers, given as a OneRowBarrier.
// Other Dx (and a OneRowBarrier's Dx given as a plain CtaBarrier) fall back to a shared-memory
// tree per value (about log2(Dx) + 3 barriers each). smem: block_allreduce_x_smem_elems(N, Dx, rows) elements of T.
template <int N, typename T, typename Op, typename Sync = CtaBarrier>
__device__ __forceinline__ void block_allreduce_x_group(T (&v)[N], T* smem, Op op,
                                                        Sync sync = Sync()) {
  if constexpr (detail::IsOneRow<Sync>::value) {
    // One row of whole warps and a partial one (a row of 5121 elements in 321 threads): every
    // value to shared memory, then each full warp folds them (lane l: l, l + 32, ... in that
    // order) and butterflies the 32 folds, the same bits in every full warp; thread 0 leaves
    // the results for the partial warp, which cannot shuffle with lanes that do not exist. Two
    // barriers, as a multiple of 32 takes. The shared-memory tree below took about log2(Dx) + 3
    // a value: layernorm backward at N = 5121 spent most of its time in them (two per row, and
    // a group of two per column tile of its second phase; 178 -> 159 us on the H200).
    constexpr unsigned dx = Sync::kDx;
    constexpr unsigned full = dx / 32 * 32;
    const unsigned x = threadIdx.x;
#pragma unroll
    for (int i = 0; i < N; ++i) smem[i * dx + x] = v[i];
    sync.sync();
    if (x < full) {
      const unsigned lane = x % 32;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        T acc = smem[i * dx + lane];
        for (unsigned k = lane + 32; k < dx; k += 32) acc = op(acc, smem[i * dx + k]);
        v[i] = warp_allreduce<32>(acc, op);
      }
      if (x == 0) {
#pragma unroll
        for (int i = 0; i < N; ++i) smem[N * dx + i] = v[i];
      }
    }
    sync.sync();  // the values are read, the results written, before either is reused
    if (x >= full) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = smem[N * dx + i];
    }
    return;
  }
  const unsigned dx = blockDim.x;
  if (dx % 32 == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_allreduce<32>(v[i], op);
    if (dx == 32) return;
    const unsigned nw = dx / 32;
    const unsigned rows = sync.num_rows();
    const unsigned row = sync.row();
    const unsigned lane = threadIdx.x % 32;
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < N; ++i) smem[(i * rows + row) * nw + threadIdx.x / 32] = v[i];
    }
    sync.sync();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const T p = lane < nw ? smem[(i * rows + row) * nw + lane] : identity<Op, T>();
      v[i] = warp_allreduce<32>(p, op);
    }
    sync.sync();  // partials are read by all before the workspace may be reused
  } else if (32 % dx == 0) {
    // Rows are aligned segments of dx lanes inside one warp.
    const unsigned mask = detail::active_lane_mask();
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = detail::segment_allreduce(v[i], op, dx, mask);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = detail::row_tree_allreduce(v[i], smem, op, sync);
  }
}

template <typename T, typename Op, typename Sync = CtaBarrier>
__device__ __forceinline__ T block_allreduce_x(T v, T* smem, Op op, Sync sync = Sync()) {
  T vals[1] = {v};
  block_allreduce_x_group<1>(vals, smem, op, sync);
  return vals[0];
}

// --- block level, across threadIdx.y (column reductions) ------------------------------------
// Each thread stores its values and a barrier follows. Columns of at most
// 8 rows (kSerialFoldRows): each thread folds its column's values in increasing y. Taller columns:
// a fixed tree in shared memory (at step s, row y < s folds in row y + s; one barrier a step),
// then every thread reads the column's result. Why the tree: a serial fold reads all Dy values
// in every thread, Dy x Dy reads a column; an outer persistent softmax over 2048 rows with
// Dy = 256 ran at 294 GB/s on the H100, 10% of copy (bench/results/2026-11-24-h100-outer-y-
// reduce.txt). Either way the order is fixed: identical results on every run. A last barrier
// lets smem be reused. With a NamedBarrier the column is the group's R = n/Dx rows (R <= Dy,
// R dividing Dy). smem: block_allreduce_y_smem_elems(N, Dx, rows) elements of T.

template <int N, typename T, typename Op, typename Sync = CtaBarrier>
__device__ __forceinline__ void block_allreduce_y_group(T (&v)[N], T* smem, Op op,
                                                        Sync sync = Sync()) {
  const unsigned dx = blockDim.x;
  const unsigned rows = sync.num_rows();
  const unsigned ny = rows < blockDim.y ? rows : blockDim.y;
  if (ny == 1) return;
  const unsigned row = sync.row();
  const unsigned col_base = row - row % ny;  // first row of this thread's column set
#pragma unroll
  for (int i = 0; i < N; ++i) smem[(i * rows + row) * dx + threadIdx.x] = v[i];
  sync.sync();
  constexpr unsigned kSerialFoldRows = 8;
  if (ny <= kSerialFoldRows) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const T* c = smem + (i * rows + col_base) * dx + threadIdx.x;
      T acc = c[0];
      for (unsigned j = 1; j < ny; ++j) acc = op(acc, c[j * dx]);
      v[i] = acc;
    }
  } else {
    const unsigned y = row - col_base;
    unsigned step = 1;
    while (step * 2 < ny) step *= 2;        // the largest power of two below ny
    for (; step > 0; step /= 2) {
      if (y < step && y + step < ny) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          T* c = smem + (i * rows + row) * dx + threadIdx.x;
          c[0] = op(c[0], c[step * dx]);
        }
      }
      sync.sync();
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = smem[(i * rows + col_base) * dx + threadIdx.x];
  }
  sync.sync();
}

template <typename T, typename Op, typename Sync = CtaBarrier>
__device__ __forceinline__ T block_allreduce_y(T v, T* smem, Op op, Sync sync = Sync()) {
  T vals[1] = {v};
  block_allreduce_y_group<1>(vals, smem, op, sync);
  return vals[0];
}

}  // namespace pf
