// pyfuser device library: mbarrier.cuh
// Shared-memory transaction barriers (mbarrier). Every function takes the 32-bit shared-window
// address (pf::smem_addr) of an 8-byte-aligned unsigned long long in shared memory.
// Depends on nothing but the compiler.
//
// Life cycle: one thread calls mbarrier_init for each barrier, then fence_mbarrier_init, then the
// block synchronizes (__syncthreads or a cluster barrier when peers will signal it); afterwards
// threads and asynchronous copies arrive on it and threads wait on phase parities; after the last
// use (every phase observed by every waiter) one thread calls mbarrier_inval before the memory is
// reused for anything else.
//
// Phases. A barrier starts in phase 0; the phase completes when `count` arrivals have happened
// and the pending transaction bytes (expect_tx minus complete_tx) are zero. Waiting on parity P
// returns once the phase with parity P has completed; a fresh barrier counts as having completed
// the phase "before" phase 0, so a wait on parity 1 returns at once.

namespace pf {

__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes preceding mbarrier.init visible to the async proxy (TMA, st.async complete_tx) and, with
// release at cluster scope, to peer CTAs. Without it a bulk copy may signal a barrier whose
// initialization it does not yet see. Call once after all inits, by the initializing thread.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrive (default .release.cta): this thread's earlier writes are visible to threads that then
// observe the phase completion.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar, unsigned count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// One arrival that also raises the expected transaction bytes, so the phase cannot complete until
// `bytes` more bytes of asynchronous copies have landed. The producer of a TMA copy calls this
// (before or after issuing the copy: the tx-count may go transiently negative).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Same at cluster scope: the receiver of st.async stores from peer CTAs arms its own barrier with
// this (and then waits with mbarrier_wait_parity_cluster), so its arrival and the peers'
// complete_tx meet in one cluster-scope release/acquire pattern.
__device__ __forceinline__ void mbarrier_arrive_expect_tx_cluster(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Raise the expected bytes without arriving (several copies, one arrival elsewhere).
__device__ __forceinline__ void mbarrier_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Arrive on a barrier in a peer CTA of the cluster (`remote_bar` from pf::map_shared_rank). Release
// at cluster scope: the peer sees this thread's earlier writes (incl. st.shared::cluster) once it
// observes the phase with an acquire.cluster wait.
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar)
               : "memory");
}

// Arrive on the barrier at the same shared offset in CTA `rank` of the cluster (this CTA's own
// rank too), with the default release.cta semantics: the release of a circular-buffer slot read
// by wgmma (completed by wgmma.wait_group) that a peer's multicast copy refills. Release at
// cluster scope is not needed there and costs (the 2-CTA reference GEMM halved with it).
__device__ __forceinline__ void mbarrier_arrive_peer(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n\t.reg .b32 remote;\n\t"
      "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}" ::"r"(bar), "r"(rank)
      : "memory");
}

// One probe: true when the phase with `parity` has completed. try_wait (unlike test_wait) may
// suspend the thread in hardware for a while before answering false, so the loop below is not a
// hot spin. Acquire at CTA scope: reads after it see what the arrivals released.
__device__ __forceinline__ bool mbarrier_try_wait_parity(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// With a suspend-time hint in nanoseconds (the longest the hardware may park the thread).
__device__ __forceinline__ bool mbarrier_try_wait_parity(unsigned bar, unsigned parity,
                                                         unsigned suspend_ns) {
  unsigned done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity), "r"(suspend_ns)
      : "memory");
  return done != 0;
}
// Cluster-scope acquire: use when the arrivals/complete_tx came from peer CTAs (st.async,
// mbarrier_arrive_cluster) and this thread then reads what they wrote.
__device__ __forceinline__ bool mbarrier_try_wait_parity_cluster(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbarrier_wait_parity(unsigned bar, unsigned parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}
__device__ __forceinline__ void mbarrier_wait_parity(unsigned bar, unsigned parity,
                                                     unsigned suspend_ns) {
  while (!mbarrier_try_wait_parity(bar, parity, suspend_ns)) {
  }
}
__device__ __forceinline__ void mbarrier_wait_parity_cluster(unsigned bar, unsigned parity) {
  while (!mbarrier_try_wait_parity_cluster(bar, parity)) {
  }
}

// Retire a barrier so its 8 bytes may be reused as ordinary shared memory (or re-initialized).
__device__ __forceinline__ void mbarrier_inval(unsigned bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

}  // namespace pf
