// pyfuser device library: cluster.cuh
// Thread-block clusters: rank and shape queries, distributed shared memory (DSMEM) addressing,
// asynchronous remote stores that complete on the receiver's mbarrier, and the cluster barrier.
// Depends on types.cuh (bit_cast); receivers of st.async wait with mbarrier.cuh's
// mbarrier_wait_parity_cluster.
//
// DSMEM rule: a CTA's shared memory may be accessed by peers only while that CTA is running.
// Start with cluster_sync() after initializing barriers that peers will signal (so no remote
// st.async/arrive reaches an uninitialized barrier), and end with cluster_sync() (so no CTA exits
// while a peer may still read or write its shared memory).

namespace pf {

__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_nctarank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
// Cluster shape in CTAs, and this CTA's position in it.
__device__ __forceinline__ unsigned cluster_dim_x() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_nctaid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_dim_y() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_nctaid.y;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_dim_z() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_nctaid.z;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_cta_idx_x() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctaid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_cta_idx_y() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctaid.y;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_cta_idx_z() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctaid.z;" : "=r"(r));
  return r;
}
// Index of this cluster in the grid (x), and number of clusters (x).
__device__ __forceinline__ unsigned cluster_idx_x() {
  unsigned r;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned num_clusters_x() {
  unsigned r;
  asm("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}

// The shared::cluster address of the same variable in CTA `rank` of the cluster, from this CTA's
// 32-bit shared address (pf::smem_addr). Works for rank == own rank too.
__device__ __forceinline__ unsigned map_shared_rank(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// st.async: store into a peer's shared memory; the write and its byte count complete_tx on the
// peer's mbarrier `remote_bar` (both addresses from map_shared_rank). The receiver arms its own
// barrier with mbarrier_arrive_expect_tx_cluster(bar, total bytes it will receive) and waits with
// mbarrier_wait_parity_cluster; the data is visible to it once the phase completes.
// Addresses must be aligned to the stored size.
__device__ __forceinline__ void st_async(unsigned remote_addr, unsigned v, unsigned remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                   remote_addr),
               "r"(v), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async(unsigned remote_addr, int v, unsigned remote_bar) {
  st_async(remote_addr, static_cast<unsigned>(v), remote_bar);
}
__device__ __forceinline__ void st_async(unsigned remote_addr, float v, unsigned remote_bar) {
  st_async(remote_addr, __float_as_uint(v), remote_bar);
}
__device__ __forceinline__ void st_async(unsigned remote_addr, unsigned long long v,
                                         unsigned remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(
                   remote_addr),
               "l"(v), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void st_async(unsigned remote_addr, long long v, unsigned remote_bar) {
  st_async(remote_addr, static_cast<unsigned long long>(v), remote_bar);
}
__device__ __forceinline__ void st_async(unsigned remote_addr, double v, unsigned remote_bar) {
  st_async(remote_addr, static_cast<unsigned long long>(__double_as_longlong(v)), remote_bar);
}
// Two 32-bit values in one 8-byte store (v0 at the lower address).
__device__ __forceinline__ void st_async_v2(unsigned remote_addr, unsigned v0, unsigned v1,
                                            unsigned remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(
          remote_addr),
      "r"(v0), "r"(v1), "r"(remote_bar)
      : "memory");
}
__device__ __forceinline__ void st_async_v2(unsigned remote_addr, float v0, float v1,
                                            unsigned remote_bar) {
  st_async_v2(remote_addr, __float_as_uint(v0), __float_as_uint(v1), remote_bar);
}
// Four 32-bit values in one 16-byte store.
__device__ __forceinline__ void st_async_v4(unsigned remote_addr, unsigned v0, unsigned v1,
                                            unsigned v2, unsigned v3, unsigned remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
          remote_addr),
      "r"(v0), "r"(v1), "r"(v2), "r"(v3), "r"(remote_bar)
      : "memory");
}
__device__ __forceinline__ void st_async_v4(unsigned remote_addr, float v0, float v1, float v2,
                                            float v3, unsigned remote_bar) {
  st_async_v4(remote_addr, __float_as_uint(v0), __float_as_uint(v1), __float_as_uint(v2),
              __float_as_uint(v3), remote_bar);
}
// Two 64-bit values in one 16-byte store.
__device__ __forceinline__ void st_async_v2(unsigned remote_addr, double v0, double v1,
                                            unsigned remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [%0], {%1, %2}, [%3];" ::"r"(
          remote_addr),
      "l"(__double_as_longlong(v0)), "l"(__double_as_longlong(v1)), "r"(remote_bar)
      : "memory");
}

// Plain loads/stores of DSMEM (own or peer CTA), 4 or 8 bytes. Ordering with the owner's writes
// comes from a cluster barrier or a cluster-scope mbarrier between them.
template <typename T>
__device__ __forceinline__ T ld_shared_cluster(unsigned addr) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::ld_shared_cluster: 4- or 8-byte types");
  if constexpr (sizeof(T) == 4) {
    unsigned v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return bit_cast<T>(v);
  } else {
    unsigned long long v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(addr) : "memory");
    return bit_cast<T>(v);
  }
}
template <typename T>
__device__ __forceinline__ void st_shared_cluster(unsigned addr, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pf::st_shared_cluster: 4- or 8-byte types");
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(bit_cast<unsigned>(v))
                 : "memory");
  } else {
    asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(addr),
                 "l"(bit_cast<unsigned long long>(v))
                 : "memory");
  }
}

// Cluster barrier, split so independent work can overlap the wait. Every thread of every CTA in
// the cluster must arrive (the .aligned forms require the whole warp to execute them together).
// arrive.release + wait.acquire order all shared/global writes before the barrier with all
// accesses after it, cluster-wide.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
// Relaxed arrive: only synchronizes execution (e.g. "every peer has started"); the initialization
// it must publish is then ordered by fence_mbarrier_init (release.cluster).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

}  // namespace pf
