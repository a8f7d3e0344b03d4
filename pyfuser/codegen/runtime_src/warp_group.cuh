// pyfuser device library: warp_group.cuh
// Warp / warp-group indexing, leader election and register re-distribution for warp-specialized
// kernels. Named barriers (pf::named_barrier_sync / named_barrier_arrive) live in reduce.cuh,
// their first user. Depends on nothing but the compiler.

namespace pf {

__device__ __forceinline__ unsigned linear_thread_idx() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

__device__ __forceinline__ unsigned lane_id() {
  unsigned l;
  asm("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

// Broadcasting lane 0's value tells the compiler the index is warp-uniform, so branches on it
// (producer vs consumer roles) compile to uniform branches and uniform registers.
__device__ __forceinline__ unsigned warp_id() {
  return __shfl_sync(0xffffffffu, linear_thread_idx() / 32, 0);
}
__device__ __forceinline__ unsigned warp_group_id() {
  return __shfl_sync(0xffffffffu, linear_thread_idx() / 128, 0);
}
__device__ __forceinline__ unsigned warp_idx_in_warp_group() { return warp_id() % 4; }
__device__ __forceinline__ unsigned thread_idx_in_warp_group() { return linear_thread_idx() % 128; }

// True in exactly one lane of the (fully converged) warp; lanes outside `member_mask` must not
// call it. Cheaper and branch-uniform compared to `lane_id() == 0` after divergence.
__device__ __forceinline__ bool elect_one_sync(unsigned member_mask = 0xffffffffu) {
  unsigned pred;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "elect.sync _|p, %1;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(pred)
      : "r"(member_mask));
  return pred != 0;
}

// setmaxnreg: every thread of a warp group executes the same one (sync.aligned). The kernel needs
// __launch_bounds__(threads, 1) so ptxas knows the entry register count; dec releases registers
// to the SM pool, inc blocks until the pool has enough. Sum over warp groups of N * 128 must fit
// 64K registers, or inc waits forever. ptxas warns ("setmaxnreg ignored") when it cannot honor it.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N must be in 24..256, multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N must be in 24..256, multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

}  // namespace pf
