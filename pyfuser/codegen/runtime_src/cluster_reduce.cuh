// pyfuser device library: cluster_reduce.cuh
// All-reduce of one value per row (threadIdx.y) across the CTAs of a thread-block cluster,
// through distributed shared memory. Depends on memory.cuh (smem_addr), reduce.cuh (operators)
// and cluster.cuh (ranks, mapa, st.shared::cluster, the cluster barrier).
//
// Every thread of every CTA of the cluster calls it, with the same `phase` counter (a register
// the kernel starts at 0); threads whose row value is the CTA's partial (after the block
// all-reduce over x) pass it in `v`. Thread x == 0 of each row stores the partial into slot
// [row][my rank] of every CTA's `slots` (2 x rows x C elements, static shared memory), the cluster
// barrier (release/acquire) publishes the stores, and each thread reads the C partials of its row
// in rank order: every CTA computes the same bits, deterministically.
// Reuse: the slots alternate between two sets by `phase`. A CTA can write set (p + 2) % 2 only
// after passing barrier p + 1, which every peer reaches only after reading set p: one barrier per
// reduction suffices. The kernel calls cluster_sync() once before the first reduction (every peer
// running before any remote store); no remote store follows a CTA's last barrier, so CTAs may exit.

namespace pf {

template <int C, typename T, typename Op>
__device__ __forceinline__ T cluster_allreduce_row(T v, T* slots, unsigned rows, unsigned& phase,
                                                   Op op) {
  T* set = slots + (phase & 1u) * rows * C;
  const unsigned row = threadIdx.y;
  const unsigned rank = cluster_ctarank();
  if (threadIdx.x == 0) {
    const unsigned local = smem_addr(&set[row * C + rank]);
#pragma unroll
    for (unsigned r = 0; r < C; ++r) {
      st_shared_cluster<T>(map_shared_rank(local, r), v);
    }
  }
  cluster_sync();
  T acc = set[row * C];
#pragma unroll
  for (unsigned r = 1; r < C; ++r) {
    acc = op(acc, set[row * C + r]);
  }
  ++phase;
  return acc;
}

}  // namespace pf
