// pyfuser device library: memory.cuh
// Vector loads and stores of 2, 4, 8 or 16 bytes between registers and global or shared memory,
// with the L1 cache hints that sm_90 accepts, the generic -> shared-window address conversion, and
// per-thread cp.async copies global -> shared with their commit / wait groups.
// Depends on types.cuh.
//
// Every access here is `asm volatile` with a "memory" clobber: the compiler cannot see what inline
// PTX touches, and without the clobber it may move an ordinary C++ store to the same address across
// the asm (e.g. an in-place fusion, or a workspace written before a grid sync and read after).
// ptxas still schedules the resulting instructions freely; only NVVM's reordering is restricted.

namespace pf {

// 32-bit shared-window address of a generic pointer into shared memory: the operand form that
// ld/st.shared, mbarrier, cp.async.bulk and mapa take.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Global-load hints (PTX `ld` qualifiers valid on sm_90 for every vector width used here).
//   Default             ld.global                         cached in L1 and L2
//   NoAllocate          ld.global.L1::no_allocate         streaming: do not keep the line in L1
//   EvictFirst          ld.global.L1::evict_first
//   EvictLast           ld.global.L1::evict_last          data re-read soon (e.g. broadcast operand)
//   ReadOnly            ld.global.nc                      non-coherent texture path
//   ReadOnlyNoAllocate  ld.global.nc.L1::no_allocate      streaming read of a kernel input
// The .nc forms are only correct for memory that no thread writes during the kernel.
// (.L2::evict_first/.L2::evict_last on ld/st need .v8 types, i.e. sm_100; not offered here.)
enum class LoadHint : int { Default, NoAllocate, EvictFirst, EvictLast, ReadOnly, ReadOnlyNoAllocate };

// Global-store hints.
//   Default     st.global
//   NoAllocate  st.global.L1::no_allocate
//   EvictFirst  st.global.L1::evict_first
//   EvictLast   st.global.L1::evict_last
//   Streaming   st.global.cs      (cache-streaming: likely accessed once)
enum class StoreHint : int { Default, NoAllocate, EvictFirst, EvictLast, Streaming };

// One macro per qualifier spelling keeps every PTX string a literal (asm needs literals).
#define PF_LD_GLOBAL_(QUAL)                                                                   \
  if constexpr (Bytes == 16) {                                                                \
    detail::U32x4& d = *reinterpret_cast<detail::U32x4*>(dst);                                \
    asm volatile("ld.global" QUAL ".v4.u32 {%0, %1, %2, %3}, [%4];"                            \
                 : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w)                                 \
                 : "l"(src)                                                                   \
                 : "memory");                                                                 \
  } else if constexpr (Bytes == 8) {                                                          \
    detail::U32x2& d = *reinterpret_cast<detail::U32x2*>(dst);                                \
    asm volatile("ld.global" QUAL ".v2.u32 {%0, %1}, [%2];"                                    \
                 : "=r"(d.x), "=r"(d.y)                                                       \
                 : "l"(src)                                                                   \
                 : "memory");                                                                 \
  } else if constexpr (Bytes == 4) {                                                          \
    asm volatile("ld.global" QUAL ".u32 %0, [%1];"                                             \
                 : "=r"(*reinterpret_cast<unsigned*>(dst))                                    \
                 : "l"(src)                                                                   \
                 : "memory");                                                                 \
  } else {                                                                                    \
    asm volatile("ld.global" QUAL ".u16 %0, [%1];"                                             \
                 : "=h"(*reinterpret_cast<unsigned short*>(dst))                              \
                 : "l"(src)                                                                   \
                 : "memory");                                                                 \
  }

#define PF_ST_GLOBAL_(QUAL)                                                                   \
  if constexpr (Bytes == 16) {                                                                \
    const detail::U32x4& s = *reinterpret_cast<const detail::U32x4*>(src);                    \
    asm volatile("st.global" QUAL ".v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(s.x),      \
                 "r"(s.y), "r"(s.z), "r"(s.w)                                                 \
                 : "memory");                                                                 \
  } else if constexpr (Bytes == 8) {                                                          \
    const detail::U32x2& s = *reinterpret_cast<const detail::U32x2*>(src);                    \
    asm volatile("st.global" QUAL ".v2.u32 [%0], {%1, %2};" ::"l"(dst), "r"(s.x), "r"(s.y)     \
                 : "memory");                                                                 \
  } else if constexpr (Bytes == 4) {                                                          \
    asm volatile("st.global" QUAL ".u32 [%0], %1;" ::"l"(dst),                                 \
                 "r"(*reinterpret_cast<const unsigned*>(src))                                 \
                 : "memory");                                                                 \
  } else {                                                                                    \
    asm volatile("st.global" QUAL ".u16 [%0], %1;" ::"l"(dst),                                 \
                 "h"(*reinterpret_cast<const unsigned short*>(src))                           \
                 : "memory");                                                                 \
  }

// load_global<Bytes, Hint>(dst, src): copy Bytes bytes from global `src` (aligned to Bytes) into
// the register object at `dst` (e.g. a pf::Array of that size).
template <int Bytes, LoadHint Hint = LoadHint::Default>
__device__ __forceinline__ void load_global(void* dst, const void* src) {
  static_assert(Bytes == 2 || Bytes == 4 || Bytes == 8 || Bytes == 16,
                "pf::load_global: Bytes must be 2, 4, 8 or 16");
  if constexpr (Hint == LoadHint::Default) {
    PF_LD_GLOBAL_("")
  } else if constexpr (Hint == LoadHint::NoAllocate) {
    PF_LD_GLOBAL_(".L1::no_allocate")
  } else if constexpr (Hint == LoadHint::EvictFirst) {
    PF_LD_GLOBAL_(".L1::evict_first")
  } else if constexpr (Hint == LoadHint::EvictLast) {
    PF_LD_GLOBAL_(".L1::evict_last")
  } else if constexpr (Hint == LoadHint::ReadOnly) {
    PF_LD_GLOBAL_(".nc")
  } else {
    PF_LD_GLOBAL_(".nc.L1::no_allocate")
  }
}

// store_global<Bytes, Hint>(dst, src): copy Bytes bytes from the register object at `src` to
// global `dst` (aligned to Bytes).
template <int Bytes, StoreHint Hint = StoreHint::Default>
__device__ __forceinline__ void store_global(void* dst, const void* src) {
  static_assert(Bytes == 2 || Bytes == 4 || Bytes == 8 || Bytes == 16,
                "pf::store_global: Bytes must be 2, 4, 8 or 16");
  if constexpr (Hint == StoreHint::Default) {
    PF_ST_GLOBAL_("")
  } else if constexpr (Hint == StoreHint::NoAllocate) {
    PF_ST_GLOBAL_(".L1::no_allocate")
  } else if constexpr (Hint == StoreHint::EvictFirst) {
    PF_ST_GLOBAL_(".L1::evict_first")
  } else if constexpr (Hint == StoreHint::EvictLast) {
    PF_ST_GLOBAL_(".L1::evict_last")
  } else {
    PF_ST_GLOBAL_(".cs")
  }
}

#undef PF_LD_GLOBAL_
#undef PF_ST_GLOBAL_

// load_shared<Bytes>(dst, src): Bytes bytes from shared memory at generic pointer `src` (aligned
// to Bytes) into registers at `dst`. Uses the 32-bit shared address, so the instruction is an LDS
// even where the compiler cannot prove `src` points into shared memory.
template <int Bytes>
__device__ __forceinline__ void load_shared(void* dst, const void* src) {
  static_assert(Bytes == 2 || Bytes == 4 || Bytes == 8 || Bytes == 16,
                "pf::load_shared: Bytes must be 2, 4, 8 or 16");
  const unsigned a = smem_addr(src);
  if constexpr (Bytes == 16) {
    detail::U32x4& d = *reinterpret_cast<detail::U32x4*>(dst);
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w)
                 : "r"(a)
                 : "memory");
  } else if constexpr (Bytes == 8) {
    detail::U32x2& d = *reinterpret_cast<detail::U32x2*>(dst);
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(d.x), "=r"(d.y) : "r"(a) : "memory");
  } else if constexpr (Bytes == 4) {
    asm volatile("ld.shared.u32 %0, [%1];"
                 : "=r"(*reinterpret_cast<unsigned*>(dst))
                 : "r"(a)
                 : "memory");
  } else {
    asm volatile("ld.shared.u16 %0, [%1];"
                 : "=h"(*reinterpret_cast<unsigned short*>(dst))
                 : "r"(a)
                 : "memory");
  }
}

// store_shared<Bytes>(dst, src): Bytes bytes from registers at `src` to shared memory at generic
// pointer `dst` (aligned to Bytes).
template <int Bytes>
__device__ __forceinline__ void store_shared(void* dst, const void* src) {
  static_assert(Bytes == 2 || Bytes == 4 || Bytes == 8 || Bytes == 16,
                "pf::store_shared: Bytes must be 2, 4, 8 or 16");
  const unsigned a = smem_addr(dst);
  if constexpr (Bytes == 16) {
    const detail::U32x4& s = *reinterpret_cast<const detail::U32x4*>(src);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(s.x), "r"(s.y), "r"(s.z),
                 "r"(s.w)
                 : "memory");
  } else if constexpr (Bytes == 8) {
    const detail::U32x2& s = *reinterpret_cast<const detail::U32x2*>(src);
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(a), "r"(s.x), "r"(s.y) : "memory");
  } else if constexpr (Bytes == 4) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(*reinterpret_cast<const unsigned*>(src))
                 : "memory");
  } else {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(a),
                 "h"(*reinterpret_cast<const unsigned short*>(src))
                 : "memory");
  }
}

// Typed conveniences over pf::Array: the byte width is sizeof(T) * N.
template <LoadHint Hint = LoadHint::Default, typename T, int N, int A>
__device__ __forceinline__ void load_global_vec(Array<T, N, A>& dst, const T* src) {
  load_global<int(sizeof(T)) * N, Hint>(&dst, src);
}
template <StoreHint Hint = StoreHint::Default, typename T, int N, int A>
__device__ __forceinline__ void store_global_vec(T* dst, const Array<T, N, A>& src) {
  store_global<int(sizeof(T)) * N, Hint>(dst, &src);
}
template <typename T, int N, int A>
__device__ __forceinline__ void load_shared_vec(Array<T, N, A>& dst, const T* src) {
  load_shared<int(sizeof(T)) * N>(&dst, src);
}
template <typename T, int N, int A>
__device__ __forceinline__ void store_shared_vec(T* dst, const Array<T, N, A>& src) {
  store_shared<int(sizeof(T)) * N>(dst, &src);
}

// cp.async (non-bulk): each thread copies 4, 8 or 16 bytes global -> shared without passing
// through registers. Both addresses aligned to Bytes. A copy joins the thread's open cp.async
// group; cp_async_commit_group() closes the group (an empty group is legal and completes at
// once); cp_async_wait_group<N>() waits until at most the N most recently committed groups of the
// thread are incomplete, after which the copies of the older groups are visible to THIS thread.
// Other threads may read them only after a barrier that follows the wait. 16-byte copies bypass
// L1 (.cg); 4 and 8 bytes can only be .ca.
template <int Bytes>
__device__ __forceinline__ void cp_async(unsigned dst_smem, const void* src) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "pf::cp_async: Bytes must be 4, 8 or 16");
  const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(src));
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst_smem), "l"(g) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst_smem), "l"(g), "n"(Bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit_group() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  static_assert(N >= 0, "pf::cp_async_wait_group: N must be >= 0");
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// An index check that failed (take_along_axis, gather, index_select, embedding): the first
// thread to fail claims the record [check + 1, value] (0 while none failed, in GPU memory) with
// one 64-bit compare-and-swap, stores the index it saw, and copies both into `report` (pinned
// host memory, reached through unified addressing): the value first, then the check number
// with a release at system scope, so the host, reading the number without waiting for the
// kernel, sees the value with it (runtime/index_check.py). Any thread, any number of times.
__device__ __forceinline__ void report_index_error(long long* record, long long* report, int check,
                                                   long long value) {
  unsigned long long old;
  const unsigned long long mine = static_cast<unsigned long long>(check) + 1ull;
  asm volatile("atom.global.cas.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(record), "l"(0ull), "l"(mine)
               : "memory");
  if (old == 0ull) {
    record[1] = value;
    asm volatile("st.global.b64 [%0], %1;" ::"l"(report + 1), "l"(value) : "memory");
    asm volatile("st.release.sys.global.b64 [%0], %1;" ::"l"(report), "l"(mine) : "memory");
  }
}

// *p += v in global memory, atomically, for a scatter's add (scatter_add, index_add: lower/index
// _scatter_write): one red.global.add (relaxed, GPU scope; nothing returned), so any number of
// threads may add into one element. The adds to an element land in no fixed order: float sums
// may differ in their last bits from run to run; integer sums wrap as C's adds do (int64 through
// the u64 add: the same bits as a signed one).
__device__ __forceinline__ void atomic_add(float* p, float v) {
  const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(p));
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(g), "f"(v) : "memory");
}
__device__ __forceinline__ void atomic_add(double* p, double v) {
  const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(p));
  asm volatile("red.global.add.f64 [%0], %1;" ::"l"(g), "d"(v) : "memory");
}
__device__ __forceinline__ void atomic_add(int* p, int v) {
  const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(p));
  asm volatile("red.global.add.s32 [%0], %1;" ::"l"(g), "r"(v) : "memory");
}
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
  const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(p));
  asm volatile("red.global.add.u64 [%0], %1;" ::"l"(g), "l"(v) : "memory");
}

// Split-K partial sums (kir SplitKReduce): two fp32 accumulators as one 8-byte access. The
// read bypasses L1 (.cg): another CTA wrote the partial, made visible in L2 by its fence.
// The "memory" clobbers keep the accesses on their side of the fences and barriers around them
// (the reads are issued in groups ahead of the adds that use them: codegen's _SplitKReduce).
__device__ __forceinline__ void store_f32x2(float* p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void load_cg_f32x2(const float* p, float& a, float& b) {
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(a), "=f"(b) : "l"(p) : "memory");
}
// Stream-K's partials: four accumulators (two rows' pairs) as one 16-byte access.
__device__ __forceinline__ void store_f32x4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d) : "memory");
}
__device__ __forceinline__ void load_cg_f32x4(const float* p, float& a, float& b, float& c,
                                              float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(p) : "memory");
}

}  // namespace pf
