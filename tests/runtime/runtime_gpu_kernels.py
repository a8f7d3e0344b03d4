"""Device code for the runtime's GPU tests, written with inline PTX and no CUDA headers.

Kept apart from the tests so that a CPU test can compile every kernel here for sm_90a (and
check its ptxas report) before anyone runs them on a GPU.
"""

COMMON = r"""
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
               : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}
"""

# out[i] = i * scale + offset for i < n; elements past n stay untouched.
PATTERN = COMMON + r"""
extern "C" __global__ void pattern(float* out, int n, float scale, float offset) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * scale + offset;
}
"""

# Every parameter kind except tmap, written back so the host can compare each one.
ALL_KINDS = COMMON + r"""
extern "C" __global__ void all_kinds(double* out, long long a, int b, double c, float d,
                                     unsigned long long e) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = (double)a; out[1] = (double)b; out[2] = c; out[3] = (double)d;
    out[4] = (double)e;
  }
}
"""

# Each block reverses its slice of `in` through dynamic shared memory of n floats.
BIG_SMEM = COMMON + r"""
extern "C" __global__ void big_smem(const float* in, float* out, int n) {
  extern __shared__ float buf[];
  const float* src = in + (long long)blockIdx.x * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = src[i];
  __syncthreads();
  float* dst = out + (long long)blockIdx.x * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = buf[n - 1 - i];
}
"""

# Clusters of 2 along x: each CTA records its rank and reads its peer's shared memory (DSMEM).
CLUSTER = COMMON + r"""
extern "C" __global__ void cluster_rank(unsigned* out) {
  __shared__ unsigned mine;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) mine = rank * 10 + 1;
  cluster_sync();
  if (threadIdx.x == 0) {
    unsigned remote, value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"(smem_u32(&mine)), "r"(rank ^ 1));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
    out[2 * blockIdx.x] = rank;
    out[2 * blockIdx.x + 1] = value;
  }
  cluster_sync();  // keep this CTA's shared memory alive until its peer has read it
}
"""

# A grid-wide barrier on a counter: it completes only if every block is resident at once,
# which is what a cooperative launch guarantees. It gives up after ~2 s (%globaltimer is in ns)
# so that a broken launch fails the test instead of hanging the GPU.
COOPERATIVE = COMMON + r"""
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
extern "C" __global__ void grid_barrier(unsigned* counter, unsigned* out) {
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
    const unsigned long long start = now_ns();
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < gridDim.x && now_ns() - start < 2000000000ull);
    out[blockIdx.x] = seen;
  }
}
"""

# TMA 2D: load a BOX_R x BOX_C tile (tensor map `src`) into shared memory on an mbarrier,
# compute y = 2x + 1 in place, and store the tile with TMA (tensor map `dst`). Out-of-bounds
# parts of edge tiles are zero-filled on load and dropped on store.
TMA_BOX_C = 32
TMA_BOX_R = 16
TMA_COPY = COMMON + r"""
#define BOX_C %d
#define BOX_R %d
extern "C" __global__ void __launch_bounds__(128) tma_copy(
    const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst) {
  __shared__ alignas(1024) float tile[BOX_R][BOX_C];
  __shared__ alignas(8) unsigned long long bar;
  const unsigned bar_addr = smem_u32(&bar), tile_addr = smem_u32(tile);
  const int c0 = blockIdx.x * BOX_C, c1 = blockIdx.y * BOX_R;
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%%0];" :: "l"(&src) : "memory");
    mbar_init(bar_addr, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(bar_addr, sizeof(tile));
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%%0], [%%1, {%%2, %%3}], [%%4];"
        :: "r"(tile_addr), "l"(&src), "r"(c0), "r"(c1), "r"(bar_addr) : "memory");
  }
  mbar_wait(bar_addr, 0);
  float* flat = &tile[0][0];
  for (int i = threadIdx.x; i < BOX_R * BOX_C; i += blockDim.x) flat[i] = 2.0f * flat[i] + 1.0f;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes -> TMA store
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%%0, {%%1, %%2}], [%%3];"
        :: "l"(&dst), "r"(c0), "r"(c1), "r"(tile_addr) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("mbarrier.inval.shared::cta.b64 [%%0];" :: "r"(bar_addr) : "memory");
  }
}
""" % (TMA_BOX_C, TMA_BOX_R)

# TMA 2D with the 128-byte swizzle (a kir.TileBoxMap, as a matmul loads its operands): load a
# SW_R x 64 bf16 box (rows of 128 bytes) into a 1024-byte-aligned buffer, copy the shared bytes
# as they lie to `raw` (one box per block, blocks in row-major order) for the host to check the
# swizzle pattern, and store the box back with tensor map `dst` (the same pattern undone).
SW_C = 64
SW_R = 32
TMA_SWIZZLED = COMMON + r"""
#define SW_C %d
#define SW_R %d
extern "C" __global__ void __launch_bounds__(128) tma_swizzled(
    const __grid_constant__ CUtensorMap src, const __grid_constant__ CUtensorMap dst,
    unsigned short* raw) {
  __shared__ alignas(1024) unsigned short tile[SW_R * SW_C];
  __shared__ alignas(8) unsigned long long bar;
  const unsigned bar_addr = smem_u32(&bar), tile_addr = smem_u32(tile);
  const int c0 = blockIdx.x * SW_C, c1 = blockIdx.y * SW_R;
  if (threadIdx.x == 0) mbar_init(bar_addr, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(bar_addr, sizeof(tile));
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%%0], [%%1, {%%2, %%3}], [%%4];"
        :: "r"(tile_addr), "l"(&src), "r"(c0), "r"(c1), "r"(bar_addr) : "memory");
  }
  mbar_wait(bar_addr, 0);
  unsigned short* mine = raw + (blockIdx.y * gridDim.x + blockIdx.x) * (SW_R * SW_C);
  for (int i = threadIdx.x; i < SW_R * SW_C; i += blockDim.x) mine[i] = tile[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%%0, {%%1, %%2}], [%%3];"
        :: "l"(&dst), "r"(c0), "r"(c1), "r"(tile_addr) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("mbarrier.inval.shared::cta.b64 [%%0];" :: "r"(bar_addr) : "memory");
  }
}
""" % (SW_C, SW_R)

ALL = {
    "pattern": PATTERN,
    "all_kinds": ALL_KINDS,
    "big_smem": BIG_SMEM,
    "cluster_rank": CLUSTER,
    "grid_barrier": COOPERATIVE,
    "tma_copy": TMA_COPY,
    "tma_swizzled": TMA_SWIZZLED,
}
