// pyfuser device library: tma.cuh
// Bulk (1D) and tensor-map (1D..5D) asynchronous copies between global and shared memory.
// Depends on nothing but the compiler; loads complete on an mbarrier (see mbarrier.cuh).
//
// Loads (global -> shared): issued by ONE thread; they complete_tx on `bar` (a shared address),
// so the issuing thread first arms the barrier with mbarrier_arrive_expect_tx(bar, bytes), and
// consumers mbarrier_wait_parity(bar, phase). Consumers that then overwrite the slot must be
// ordered before the next copy into it by a barrier (block barrier, or an "empty" mbarrier).
// Stores (shared -> global): the writing threads fence_proxy_async_shared(), then a barrier, then
// one thread issues the store(s), bulk_commit_group(), and bulk_wait_group_read<0>() before the
// shared source is overwritten (or bulk_wait_group<0>() before the kernel relies on the global
// data being written, e.g. before a grid sync).
// Alignment: bulk sizes and both addresses multiples of 16 bytes; tensor-map smem boxes 128-byte
// aligned (1024 for 128B swizzle). Coordinates are element indices, innermost first, and may be
// negative or out of bounds (TMA fills out-of-bounds elements of a load with zeros / skips them on a
// store).

namespace pf {

// The driver's 128-byte opaque tensor map (CUtensorMap in cuda.h). Kernels take it by value as
// `const __grid_constant__ pf::CUtensorMap tmap` and pass &tmap here: a __grid_constant__
// parameter keeps one copy in param space whose generic address TMA can read.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};

// Generic-proxy writes to shared memory are not ordered with later async-proxy reads of the same
// bytes (TMA store, wgmma) unless each writing thread fences; likewise before a TMA load
// overwrites a slot the generic proxy has read/written. Fence, then synchronize, then issue.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Warm the descriptor cache before the first copy (one thread, kernel start).
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(tmap))
               : "memory");
}

// 1D bulk copy global -> shared, completing `bytes` transaction bytes on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(unsigned dst, const void* src, unsigned bytes,
                                              unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// 1D bulk copy shared -> global, tracked by the thread's bulk async-group.
__device__ __forceinline__ void bulk_copy_s2g(void* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

// Hint: start pulling [src, src + bytes) into L2 (16-byte multiple and alignment). No completion.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Close the current bulk async-group of this thread (all bulk/tensor stores issued since the last
// commit).
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Wait until at most N committed groups still READ their shared source: the source may be reused.
template <int N = 0>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Wait until at most N committed groups are still pending entirely (writes performed).
template <int N = 0>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Tensor-map loads: the box described by the map at the given coordinates -> shared `dst`,
// completing on `bar` with the box's byte count.
__device__ __forceinline__ void tma_load_1d(unsigned dst, const CUtensorMap* tmap, int c0,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2}], [%3];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap* tmap, int c0, int c1,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const CUtensorMap* tmap, int c0, int c1,
                                            int c2, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Multicast forms: the box lands at `dst` in every CTA of the cluster whose bit is set in
// `cta_mask` (rank r: bit r), completing on the barrier at `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const CUtensorMap* tmap, int c0,
                                                      int c1, unsigned bar, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_multicast(unsigned dst, const CUtensorMap* tmap, int c0,
                                                      int c1, int c2, unsigned bar,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar),
      "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d_multicast(unsigned dst, const CUtensorMap* tmap, int c0,
                                                      int c1, int c2, int c3, unsigned bar,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(bar), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d_multicast(unsigned dst, const CUtensorMap* tmap, int c0,
                                                      int c1, int c2, int c3, int c4, unsigned bar,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4), "r"(bar), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const CUtensorMap* tmap, int c0, int c1,
                                            int c2, int c3, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(unsigned dst, const CUtensorMap* tmap, int c0, int c1,
                                            int c2, int c3, int c4, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
      "r"(bar)
      : "memory");
}

// Tensor-map stores: shared `src` -> the box at the given coordinates, in the bulk async-group.
__device__ __forceinline__ void tma_store_1d(const CUtensorMap* tmap, int c0, unsigned src) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%1}], [%2];" ::"l"(
                   reinterpret_cast<unsigned long long>(tmap)),
               "r"(c0), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* tmap, int c0, int c1,
                                             unsigned src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<unsigned long long>(tmap)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* tmap, int c0, int c1, int c2,
                                             unsigned src) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
          reinterpret_cast<unsigned long long>(tmap)),
      "r"(c0), "r"(c1), "r"(c2), "r"(src)
      : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* tmap, int c0, int c1, int c2,
                                             int c3, unsigned src) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(
          reinterpret_cast<unsigned long long>(tmap)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* tmap, int c0, int c1, int c2,
                                             int c3, int c4, unsigned src) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];" ::"l"(
          reinterpret_cast<unsigned long long>(tmap)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src)
      : "memory");
}

}  // namespace pf
