// pyfuser device library: grid_sync.cuh
// Grid-wide barrier for cooperative launches (every CTA of the grid resident at once: launch with
// cuLaunchCooperativeKernel or CU_LAUNCH_ATTRIBUTE_COOPERATIVE and at most
// occupancy x SM-count CTAs, or the barrier deadlocks).
// Depends on nothing but the compiler.
//
// Counter: one 32-bit word in global memory, zero-initialized by the host ONCE (when the
// workspace is allocated). The scheme is self-resetting: after each completed grid_sync the low 31
// bits are back to 0 and only the top bit has flipped, so the same word serves any number of
// grid_sync calls in a launch and any number of later launches (any grid size), provided every
// launch runs to completion and no two concurrently running kernels share the word.
//
// Scheme. Let n = number of CTAs. CTA 0 adds 0x80000000 - (n - 1), every other CTA adds 1. The
// total is exactly 0x80000000: the top bit flips and the low bits return to 0. Before the last
// arrival the partial sum is either k <= n - 1 (CTA 0 not yet arrived) or
// 0x80000000 - (n - 1) + k with k < n - 1 (CTA 0 arrived), both < 0x80000000, so starting from
// low bits 0 the top bit cannot flip early. Each CTA's leader remembers the value its own atomic
// returned (whose top bit is this sync's "old" phase) and spins until the top bit differs. A fast
// CTA that re-arrives for the next sync only adds to the low bits, so the flip a slow CTA waits
// for cannot be undone before it has arrived itself.
//
// Memory ordering. Writes by any thread of CTA A before grid_sync are visible to every thread of
// CTA B after it, by a chain of PTX "base causality order" edges (program order and
// synchronizes-with compose transitively, whatever the scope of each link):
//   write by thread t of A
//   -> __syncthreads in A: bar.sync makes t's earlier accesses precede the leader's later ones
//   -> A's leader: atom.add.release.gpu
//   -> B's leader: ld.acquire.gpu that reads the flipped value. Every arrival is an RMW, so the
//      value it reads is in the release sequence of every arrival's release: it synchronizes with
//      all of them (A's included) at GPU scope
//   -> __syncthreads in B
//   -> any access by any thread of B.
// So the write happens-before the read, and no thread of B can read a stale value. The same chain
// also orders A's reads before the sync ahead of B's writes after it (no write-after-read race),
// which is why the leading __syncthreads covers all threads' accesses, not only writes.

namespace pf {

// The block's part (barrier, leader's arrival, barrier) is done by the threads `block_sync`
// synchronizes: the whole block, or the named barrier of a warp-specialized kernel's compute warp
// groups (which hold thread 0; the producer warps neither wait here nor touch the exchanged
// data). The ordering argument below holds with either barrier.
struct WholeBlock {
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};

template <typename BlockSync = WholeBlock>
__device__ __forceinline__ void grid_sync(unsigned* counter, BlockSync block_sync = BlockSync()) {
  block_sync.sync();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const unsigned nblocks = gridDim.x * gridDim.y * gridDim.z;
    const bool leader_cta = (blockIdx.x | blockIdx.y | blockIdx.z) == 0;
    const unsigned inc = leader_cta ? 0x80000000u - (nblocks - 1u) : 1u;
    unsigned old;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(counter), "r"(inc)
                 : "memory");
    unsigned now;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(counter) : "memory");
    } while (((now ^ old) & 0x80000000u) == 0);
  }
  block_sync.sync();
}

// A block's arrival at a grid reduction's semaphore (codegen's grid reduction): its leader adds 1
// after a barrier of the block and gets the count before. acq_rel: the release publishes the
// block's partials (written by any of its threads before that barrier, by the chain above), the
// acquire makes every earlier arrival's partials visible to the block that arrives last (its
// threads read them after a second barrier). Cheaper than a fence in every thread
// (__threadfence: fence.sc.gpu and an L1 invalidation, in each warp).
__device__ __forceinline__ unsigned grid_arrive(unsigned* counter) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// A counter read at GPU scope with acquire semantics (waiting for other blocks' arrivals).
__device__ __forceinline__ unsigned load_acquire(const unsigned* counter) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

}  // namespace pf
