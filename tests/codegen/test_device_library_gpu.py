"""GPU tests of the device-helper library (marker ``gpu``; skipped without a Hopper GPU).

Each test compiles a small kernel with NVRTC (cuda.bindings.nvrtc, sm_90a cubin), loads it with the
driver API (cuda.bindings.driver) and launches it on torch tensors on torch's current stream; every
return code is checked. The launch helper is deliberately local to this file so the test does not
depend on pyfuser.runtime.

``test_gpu_kernels_compile`` (no marker) compiles every kernel of this file on the CPU, so a
kernel that does not build is caught before a GPU is available.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
import time

import pytest
import torch

from pyfuser.codegen.device_library import (
    block_allreduce_x_smem_elems,
    block_allreduce_y_smem_elems,
    device_library_source,
)

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
driver = pytest.importorskip("cuda.bindings.driver")


def _has_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


requires_hopper = pytest.mark.skipif(
    not _has_hopper(), reason="needs a CUDA GPU of compute capability 9.0 (sm_90a cubins)"
)

KERNEL_TIMEOUT_S = 60.0


# ------------------------------------------------------------------------------------------------
# NVRTC and driver helpers
# ------------------------------------------------------------------------------------------------
def _nv(result):
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC error {err}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest or None)


def _drv(result):
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"CUDA driver error {err}: {msg}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest or None)


def compile_cubin(src: str) -> tuple[bytes, str]:
    """Compile library + `src` for sm_90a; return (cubin, ptxas log). Raises with the log on error."""
    full = device_library_source() + src
    prog = _nv(nvrtc.nvrtcCreateProgram(full.encode(), b"pf_gpu_test.cu", 0, [], []))
    try:
        opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"--ptxas-options=-v"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _nv(nvrtc.nvrtcGetProgramLogSize(prog))
        log_buf = bytearray(size)
        _nv(nvrtc.nvrtcGetProgramLog(prog, log_buf))
        log = log_buf.rstrip(b"\0").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC compile failed ({err}):\n{log}")
        size = _nv(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = bytearray(size)
        _nv(nvrtc.nvrtcGetCUBIN(prog, cubin))
        return bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _ensure_context():
    torch.cuda.init()
    torch.empty(1, device="cuda")  # makes torch create (and bind) the primary context
    _drv(driver.cuInit(0))
    ctx = _drv(driver.cuCtxGetCurrent())
    if int(ctx) == 0:
        dev = _drv(driver.cuDeviceGet(torch.cuda.current_device()))
        ctx = _drv(driver.cuDevicePrimaryCtxRetain(dev))
        _drv(driver.cuCtxSetCurrent(ctx))


@functools.cache
def _module(src: str):
    cubin, _ = compile_cubin(src)
    _ensure_context()
    return _drv(driver.cuModuleLoadData(cubin))


def get_kernel(src: str, name: str):
    return _drv(driver.cuModuleGetFunction(_module(src), name.encode()))


def ptr(t: torch.Tensor) -> ctypes.c_uint64:
    assert t.is_cuda and t.is_contiguous()
    return ctypes.c_uint64(t.data_ptr())


def i32(v: int) -> ctypes.c_int32:
    return ctypes.c_int32(v)


def launch(fn, grid, block, args, smem=0, cluster=None, cooperative=False, use_ex=None):
    """Launch `fn` on torch's current stream. `args` are ctypes objects (ptr(), i32(), ...)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
    if smem > 48 * 1024:
        _drv(
            driver.cuFuncSetAttribute(
                fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
            )
        )
    params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
    kernel_params = ctypes.addressof(params) if args else None
    if use_ex is None:
        use_ex = cluster is not None or cooperative
    if not use_ex:
        if cooperative:
            _drv(driver.cuLaunchCooperativeKernel(fn, *grid, *block, smem, stream, kernel_params))
        else:
            _drv(driver.cuLaunchKernel(fn, *grid, *block, smem, stream, kernel_params, 0))
        return
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem
    config.hStream = stream
    attrs = []
    if cluster is not None:
        cl = tuple(cluster) + (1,) * (3 - len(cluster))
        a = driver.CUlaunchAttribute()
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cl
        attrs.append(a)
    if cooperative:
        a = driver.CUlaunchAttribute()
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        a.value.cooperative = 1
        attrs.append(a)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    _drv(driver.cuLaunchKernelEx(config, fn, kernel_params, 0))


def finish(what: str = "kernel"):
    """Wait for the stream; a deadlocked kernel stops the session instead of hanging it."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.monotonic()
    while not ev.query():
        if time.monotonic() - t0 > KERNEL_TIMEOUT_S:
            pytest.exit(f"{what} did not finish in {KERNEL_TIMEOUT_S}s (deadlock?)", returncode=3)
        time.sleep(0.001)
    torch.cuda.synchronize()


def sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
CONVERT_SRC = r"""
extern "C" __global__ void pf_convert(const float* x, const double* xd, short* bf, short* hf,
                                      float* bf_back, float* hf_back, short* bfd, short* hfd,
                                      unsigned* packed, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const pf::bf16 b = pf::float_to_bf16(x[i]);
  const pf::half h = pf::float_to_half(x[i]);
  bf[i] = short(b.bits);
  hf[i] = short(h.bits);
  bf_back[i] = pf::bf16_to_float(b);
  hf_back[i] = pf::cast<float>(h);
  bfd[i] = short(pf::cast<pf::bf16>(xd[i]).bits);
  hfd[i] = short(pf::cast<pf::half>(xd[i]).bits);
  packed[i] = pf::pack_bf16x2(x[i], -x[i]);
}
"""

# float -> e4m3fn / e5m2 (and through pf::cast from double), and each of the 256 bit patterns
# of both back to float.
FLOAT8_SRC = r"""
extern "C" __global__ void pf_float8(const float* x, const double* xd, unsigned char* e4,
                                     unsigned char* e5, unsigned char* e4d, unsigned char* e5d,
                                     float* e4_back, float* e5_back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 256) {
    e4_back[i] = pf::fp8e4m3_to_float(pf::fp8e4m3_from_bits(i));
    e5_back[i] = pf::cast<float>(pf::fp8e5m2_from_bits(i));
  }
  if (i >= n) return;
  e4[i] = pf::float_to_fp8e4m3(x[i]).bits;
  e5[i] = pf::cast<pf::fp8e5m2>(x[i]).bits;
  e4d[i] = pf::cast<pf::fp8e4m3>(xd[i]).bits;
  e5d[i] = pf::float_to_fp8e5m2(static_cast<float>(xd[i])).bits;
}
"""

# (expression in the kernel over v = x[i], w = y[i]; torch reference taking (x, y))
MATH_FUNCS = [
    ("pf::exp(v)", lambda x, y: torch.exp(x)),
    ("pf::exp2(v)", lambda x, y: torch.exp2(x)),
    ("pf::log(pf::abs(v))", lambda x, y: torch.log(x.abs())),
    ("pf::sqrt(pf::abs(v))", lambda x, y: torch.sqrt(x.abs())),
    ("pf::rsqrt(pf::abs(v))", lambda x, y: torch.rsqrt(x.abs())),
    ("pf::reciprocal(v)", lambda x, y: torch.reciprocal(x)),
    ("pf::tanh(v)", lambda x, y: torch.tanh(x)),
    ("pf::sigmoid(v)", lambda x, y: torch.sigmoid(x)),
    ("pf::erf(v)", lambda x, y: torch.erf(x)),
    ("pf::gelu(v)", lambda x, y: torch.nn.functional.gelu(x)),
    ("pf::gelu_tanh(v)", lambda x, y: torch.nn.functional.gelu(x, approximate="tanh")),
    ("pf::silu(v)", lambda x, y: torch.nn.functional.silu(x)),
    ("pf::relu(v)", lambda x, y: torch.relu(x)),
    ("pf::pow(pf::abs(v), w)", lambda x, y: torch.pow(x.abs(), y)),
    ("pf::maximum(v, w)", lambda x, y: torch.maximum(x, y)),
    ("pf::minimum(v, w)", lambda x, y: torch.minimum(x, y)),
    ("pf::round(v * T(4))", lambda x, y: torch.round(x * 4)),
    ("pf::log1p(pf::abs(v))", lambda x, y: torch.log1p(x.abs())),
    ("pf::expm1(v)", lambda x, y: torch.expm1(x)),
    ("pf::abs(v)", lambda x, y: x.abs()),
]


def _math_src() -> str:
    cases = "\n".join(
        f"    case {k}: r = {expr}; break;" for k, (expr, _) in enumerate(MATH_FUNCS)
    )
    src = (
        r"""
template <typename T>
__device__ void pf_math_body(const T* x, const T* y, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const T v = x[i];
  const T w = y[i];
  for (int k = 0; k < NUM_FUNCS; ++k) {
    T r = T(0);
    switch (k) {
"""
        + cases
        + r"""
    }
    out[k * n + i] = r;
  }
}
extern "C" __global__ void pf_math_f32(const float* x, const float* y, float* out, int n) {
  pf_math_body(x, y, out, n);
}
extern "C" __global__ void pf_math_f64(const double* x, const double* y, double* out, int n) {
  pf_math_body(x, y, out, n);
}
"""
    )
    return src.replace("NUM_FUNCS", str(len(MATH_FUNCS)))


MATH_SRC = _math_src()

# which: 0 block_allreduce_x, 1 block_allreduce_y, 2 x_group<3>, 3 y_group<3>, 4 warp_allreduce
# op: 0 sum, 1 max, 2 min. Block b handles in[b*nthreads + tid]. Outputs: out[j][b*nthreads+tid]
# for j in 0..2; the single-value forms run twice back to back (second on -v into out[1]) to check
# that the workspace is reusable on return.
REDUCE_SRC = r"""
template <typename T, typename Op>
__device__ void pf_reduce_body(const T* in, T* out, int which, Op op) {
  extern __shared__ __align__(16) unsigned char pf_smem[];
  T* smem = reinterpret_cast<T*>(pf_smem);
  const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const size_t total = size_t(gridDim.x) * nthreads;
  const size_t idx = size_t(blockIdx.x) * nthreads + tid;
  const T v = in[idx];
  if (which == 0) {
    out[idx] = pf::block_allreduce_x(v, smem, op);
    out[total + idx] = pf::block_allreduce_x(T(-v), smem, op);
  } else if (which == 1) {
    out[idx] = pf::block_allreduce_y(v, smem, op);
    out[total + idx] = pf::block_allreduce_y(T(-v), smem, op);
  } else if (which == 2) {
    T g[3] = {v, T(-v), T(v * T(2))};
    pf::block_allreduce_x_group<3>(g, smem, op);
    out[idx] = g[0];
    out[total + idx] = g[1];
    out[2 * total + idx] = g[2];
  } else if (which == 3) {
    T g[3] = {v, T(-v), T(v * T(2))};
    pf::block_allreduce_y_group<3>(g, smem, op);
    out[idx] = g[0];
    out[total + idx] = g[1];
    out[2 * total + idx] = g[2];
  } else {
    out[idx] = pf::warp_allreduce(v, op);
    out[total + idx] = pf::warp_allreduce<8>(T(-v), op);
  }
}
template <typename T>
__device__ void pf_reduce_dispatch(const T* in, T* out, int which, int op) {
  if (op == 0) pf_reduce_body(in, out, which, pf::OpSum());
  else if (op == 1) pf_reduce_body(in, out, which, pf::OpMax());
  else pf_reduce_body(in, out, which, pf::OpMin());
}
extern "C" __global__ void pf_reduce_f32(const float* in, float* out, int which, int op) {
  pf_reduce_dispatch(in, out, which, op);
}
extern "C" __global__ void pf_reduce_f64(const double* in, double* out, int which, int op) {
  pf_reduce_dispatch(in, out, which, op);
}
"""

# Warp-specialized layout: rows y < C = groups * R compute, in `groups` named-barrier groups of R
# rows (barrier id 1 + g, R * Dx threads). Rows y >= C are a "producer" that never takes part in
# the compute barriers: it runs its own named barrier (id 15) the same number of times. Data row
# of compute row y in iteration it: it * C + y (Dx values). mode 0 reduces across x, mode 1 across
# the group's rows (y). Outputs: out[it*C*Dx + y*Dx + x] = sum, out2 = (sum, sum of squares) group.
NAMED_SRC = r"""
extern "C" __global__ void pf_named(const float* in, float* out, float* out2, float* marker,
                                    int iters, int rows_per_group, int groups, int mode) {
  extern __shared__ __align__(16) unsigned char pf_smem[];
  const unsigned dx = blockDim.x;
  const unsigned y = threadIdx.y;
  const unsigned C = unsigned(rows_per_group * groups);
  if (y >= C) {
    const unsigned producer_threads = dx * (blockDim.y - C);
    const unsigned t = threadIdx.x + dx * (y - C);
    for (int it = 0; it < iters; ++it) {
      pf::named_barrier_sync(15, producer_threads);
      marker[it * producer_threads + t] = float(it + 1);
    }
    return;
  }
  const unsigned g = y / unsigned(rows_per_group);
  const pf::NamedBarrier bar{1u + g, unsigned(rows_per_group) * dx};
  const unsigned per_group = mode == 0
      ? pf::block_allreduce_x_smem_elems(2, dx, unsigned(rows_per_group))
      : pf::block_allreduce_y_smem_elems(2, dx, unsigned(rows_per_group));
  float* smem = reinterpret_cast<float*>(pf_smem) + g * per_group;
  for (int it = 0; it < iters; ++it) {
    const size_t i = (size_t(it) * C + y) * dx + threadIdx.x;
    const float v = in[i];
    float pair[2] = {v, v * v};
    if (mode == 0) {
      out[i] = pf::block_allreduce_x(v, smem, pf::OpSum(), bar);
      pf::block_allreduce_x_group<2>(pair, smem, pf::OpSum(), bar);
    } else {
      out[i] = pf::block_allreduce_y(v, smem, pf::OpSum(), bar);
      pf::block_allreduce_y_group<2>(pair, smem, pf::OpSum(), bar);
    }
    out2[2 * i] = pair[0];
    out2[2 * i + 1] = pair[1];
  }
}
"""

# One CTA streams `rows` rows of L floats through a 2-stage ring of 1D bulk copies guarded by
# mbarriers; each row's sum goes to sums[r] and 2*row goes back out through a 1D bulk store.
PIPELINE_L = 1024
PIPELINE_SRC = r"""
constexpr int L = PIPE_L;
extern "C" __global__ void pf_pipeline(const float* in, float* sums, float* out, int rows) {
  __shared__ alignas(128) float buf[2][L];
  __shared__ alignas(128) float obuf[L];
  __shared__ alignas(16) float red[32];
  __shared__ unsigned long long full[2];
  const unsigned tid = threadIdx.x;
  const unsigned bytes = L * sizeof(float);
  if (tid == 0) {
    pf::mbarrier_init(pf::smem_addr(&full[0]), 1);
    pf::mbarrier_init(pf::smem_addr(&full[1]), 1);
    pf::fence_mbarrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    for (int p = 0; p < 2 && p < rows; ++p) {
      pf::mbarrier_arrive_expect_tx(pf::smem_addr(&full[p]), bytes);
      pf::bulk_copy_g2s(pf::smem_addr(buf[p]), in + size_t(p) * L, bytes, pf::smem_addr(&full[p]));
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int s = r % 2;
    pf::mbarrier_wait_parity(pf::smem_addr(&full[s]), unsigned(r / 2) & 1u);
    float partial = 0.f;
    for (int j = tid; j < L; j += blockDim.x) {
      const float v = buf[s][j];
      partial += v;
      obuf[j] = 2.f * v;
    }
    // obuf is read next by the bulk store (async proxy)
    pf::fence_proxy_async_shared();
    const float total = pf::block_allreduce_x(partial, red, pf::OpSum());
    __syncthreads();  // every thread is done with buf[s] and obuf
    if (tid == 0) {
      sums[r] = total;
      pf::bulk_copy_s2g(out + size_t(r) * L, pf::smem_addr(obuf), bytes);
      pf::bulk_commit_group();
      if (r + 2 < rows) {
        pf::mbarrier_arrive_expect_tx(pf::smem_addr(&full[s]), bytes);
        pf::bulk_copy_g2s(pf::smem_addr(buf[s]), in + size_t(r + 2) * L, bytes,
                          pf::smem_addr(&full[s]));
      }
      pf::bulk_wait_group_read<0>();  // obuf may be overwritten
    }
    __syncthreads();
  }
  if (tid == 0) {
    pf::bulk_wait_group<0>();
    pf::mbarrier_inval(pf::smem_addr(&full[0]));
    pf::mbarrier_inval(pf::smem_addr(&full[1]));
  }
}
""".replace("PIPE_L", str(PIPELINE_L))

# 2D tensor-map load of a BH x BW box, x3 in shared memory, tensor-map store. Edges are partial
# boxes (zero-filled loads, clipped stores).
TMA_BH, TMA_BW = 16, 32
TMA_SRC = r"""
constexpr int BH = TMA_BH_, BW = TMA_BW_;
extern "C" __global__ void pf_tma2d(const __grid_constant__ pf::CUtensorMap tin,
                                    const __grid_constant__ pf::CUtensorMap tout) {
  __shared__ alignas(128) float tile[BH * BW];
  __shared__ unsigned long long bar;
  const unsigned b = pf::smem_addr(&bar);
  if (threadIdx.x == 0) {
    pf::prefetch_tensormap(&tin);
    pf::prefetch_tensormap(&tout);
    pf::mbarrier_init(b, 1);
    pf::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    pf::mbarrier_arrive_expect_tx(b, BH * BW * sizeof(float));
    pf::tma_load_2d(pf::smem_addr(tile), &tin, int(blockIdx.x) * BW, int(blockIdx.y) * BH, b);
  }
  pf::mbarrier_wait_parity(b, 0);
  for (int j = threadIdx.x; j < BH * BW; j += blockDim.x) tile[j] *= 3.f;
  pf::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    pf::tma_store_2d(&tout, int(blockIdx.x) * BW, int(blockIdx.y) * BH, pf::smem_addr(tile));
    pf::bulk_commit_group();
    pf::bulk_wait_group<0>();
    pf::mbarrier_inval(b);
  }
}
""".replace("TMA_BH_", str(TMA_BH)).replace("TMA_BW_", str(TMA_BW))

# Warp group 0 gives registers away and produces into shared memory; warp groups 1 and 2 take
# registers and consume after a named barrier that all 384 threads reach.
SETMAXNREG_SRC = r"""
extern "C" __global__ void __launch_bounds__(384, 1) pf_setmaxnreg(const float* in, float* out) {
  __shared__ float buf[128];
  const unsigned wg = pf::warp_group_id();
  const unsigned t = pf::thread_idx_in_warp_group();
  if (wg == 0) {
    pf::setmaxnreg_dec<40>();
    buf[t] = in[blockIdx.x * 128 + t];
    pf::named_barrier_arrive(1, 384);
  } else {
    pf::setmaxnreg_inc<232>();
    pf::named_barrier_sync(1, 384);
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < 128; ++k) acc += buf[(t + k) % 128] * float(k % 3);
    out[(blockIdx.x * 2 + (wg - 1)) * 128 + t] = acc + float(wg);
  }
}
"""

# Each 2-CTA cluster sums one row of 2 * 256 * 4 floats: each CTA reduces its half, sends its
# partial to the peer with st.async (complete_tx on the peer's mbarrier), and also reads the
# peer's partial directly with ld.shared::cluster. Both totals are written by every thread.
CLUSTER_SRC = r"""
extern "C" __global__ void pf_cluster(const float* in, float* out_async, float* out_ld) {
  __shared__ alignas(16) float red[8];
  __shared__ alignas(8) float recv[2];
  __shared__ alignas(8) float mine[2];
  __shared__ unsigned long long bar;
  const unsigned rank = pf::cluster_ctarank();
  const unsigned peer = rank ^ 1u;
  const unsigned cluster = blockIdx.x / 2;
  const unsigned tid = threadIdx.x;
  const float* row = in + size_t(cluster) * 2048 + rank * 1024;
  float partial = 0.f;
  for (int j = 0; j < 4; ++j) partial += row[tid + 256 * j];
  partial = pf::block_allreduce_x(partial, red, pf::OpSum());
  const unsigned b = pf::smem_addr(&bar);
  if (tid == 0) {
    pf::mbarrier_init(b, 1);
    pf::fence_mbarrier_init();
    mine[0] = partial;
  }
  // peers' barriers are initialized (and `mine` written) before anyone signals or reads them
  pf::cluster_sync();
  if (tid == 0) {
    pf::mbarrier_arrive_expect_tx_cluster(b, 4);
    pf::st_async(pf::map_shared_rank(pf::smem_addr(&recv[0]), peer), partial,
                 pf::map_shared_rank(b, peer));
  }
  pf::mbarrier_wait_parity_cluster(b, 0);
  const float other = recv[0];
  const float other_ld = pf::ld_shared_cluster<float>(pf::map_shared_rank(pf::smem_addr(&mine[0]), peer));
  // same operand order in both CTAs -> identical bits
  const float total = rank == 0 ? partial + other : other + partial;
  const float total_ld = rank == 0 ? partial + other_ld : other_ld + partial;
  out_async[blockIdx.x * 256 + tid] = total;
  out_ld[blockIdx.x * 256 + tid] = total_ld;
  // no CTA exits while its peer may still read its shared memory
  pf::cluster_sync();
  if (tid == 0) pf::mbarrier_inval(b);
}
"""

# Each round: every CTA publishes (b+1)*(r+1), grid-syncs, sums all CTAs' values, grid-syncs again
# before the next round overwrites them.
GRID_SYNC_SRC = r"""
extern "C" __global__ void pf_grid_sync(unsigned* counter, float* vals, float* out, int rounds) {
  __shared__ alignas(16) float red[32];
  const unsigned nb = gridDim.x * gridDim.y * gridDim.z;
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  for (int r = 0; r < rounds; ++r) {
    if (threadIdx.x == 0) vals[b] = float(b + 1) * float(r + 1);
    pf::grid_sync(counter);
    float s = 0.f;
    for (unsigned j = threadIdx.x; j < nb; j += blockDim.x) s += vals[j];
    s = pf::block_allreduce_x(s, red, pf::OpSum());
    if (threadIdx.x == 0) out[r * nb + b] = s;
    pf::grid_sync(counter);
  }
}
"""

# logsumexp keys (math.cuh lse_*): per element a key, the combine of two keys, max and sum of a
# key; per block of 96 (three warps, the last partial in use) the block all-reduce of its keys.
LSE_SRC = r"""
extern "C" __global__ void pf_lse(const float* x, const long long* a, const long long* b,
                                  long long* key, long long* combined, float* mx, float* sm,
                                  long long* block, int n) {
  __shared__ long long ws[32];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool in = i < n;
  if (in) {
    key[i] = pf::lse_key(x[i]);
    combined[i] = pf::lse_combine(a[i], b[i]);
    mx[i] = pf::lse_max(a[i]);
    sm[i] = pf::lse_sum(a[i]);
  }
  const long long r = pf::block_allreduce_x(in ? pf::lse_key(x[i]) : pf::lse_identity(), ws,
                                            pf::OpLogSumExp());
  if (in) block[i] = r;
}
"""

ALL_SOURCES = {
    "convert": CONVERT_SRC,
    "lse": LSE_SRC,
    "float8": FLOAT8_SRC,
    "math": MATH_SRC,
    "reduce": REDUCE_SRC,
    "named": NAMED_SRC,
    "pipeline": PIPELINE_SRC,
    "tma2d": TMA_SRC,
    "setmaxnreg": SETMAXNREG_SRC,
    "cluster": CLUSTER_SRC,
    "grid_sync": GRID_SYNC_SRC,
}


# ------------------------------------------------------------------------------------------------
# CPU: every kernel above builds, without spills or ignored setmaxnreg
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ALL_SOURCES))
def test_gpu_kernels_compile(name):
    _, log = compile_cubin(ALL_SOURCES[name])
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    assert spills == 0, log
    assert "ignored" not in log and "warning" not in log.lower(), log


# ------------------------------------------------------------------------------------------------
# GPU tests
# ------------------------------------------------------------------------------------------------
def _special_floats() -> torch.Tensor:
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40,
            65504.0, 65520.0, 65519.99, 3.4e38, -3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8,
            1.0 + 2**-11, 1.0 + 3 * 2**-11, 2**-24, 2**-25, 2**-26, 6e-8, 1e-45]
    return torch.tensor(vals, dtype=torch.float32)


@pytest.mark.gpu
@requires_hopper
def test_bf16_half_round_trip_matches_torch():
    torch.manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int64).to(torch.int32)
    x = torch.cat([_special_floats(), bits.view(torch.float32), torch.randn(4096) * 100]).cuda()
    xd = torch.cat([torch.randn(x.numel() - 8, dtype=torch.float64) * 1e3,
                    torch.tensor([0.0, -0.0, 1e300, -1e300, float("nan"), 1e-320, 65519.9, 1 + 2**-9],
                                 dtype=torch.float64)]).cuda()
    n = x.numel()
    bf = torch.empty(n, dtype=torch.int16, device="cuda")
    hf = torch.empty_like(bf)
    bfd = torch.empty_like(bf)
    hfd = torch.empty_like(bf)
    bf_back = torch.empty(n, dtype=torch.float32, device="cuda")
    hf_back = torch.empty_like(bf_back)
    packed = torch.empty(n, dtype=torch.int32, device="cuda")
    fn = get_kernel(CONVERT_SRC, "pf_convert")
    launch(fn, (math.ceil(n / 256),), (256,),
           [ptr(x), ptr(xd), ptr(bf), ptr(hf), ptr(bf_back), ptr(hf_back), ptr(bfd), ptr(hfd),
            ptr(packed), i32(n)])
    finish()

    def check_bits(ours, ref, what):
        ref_bits = ref.view(torch.int16)
        nan = torch.isnan(ref.float())
        assert torch.equal(ours[~nan], ref_bits[~nan]), what
        assert torch.isnan(ours.view(ref.dtype)[nan].float()).all(), what

    ref_bf = x.to(torch.bfloat16)
    ref_hf = x.to(torch.float16)
    check_bits(bf, ref_bf, "float -> bf16")
    check_bits(hf, ref_hf, "float -> half")
    torch.testing.assert_close(bf_back, ref_bf.float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(hf_back, ref_hf.float(), rtol=0, atol=0, equal_nan=True)
    # documented contract: double -> 16-bit goes through float, like torch's c10 constructors
    check_bits(bfd, xd.float().to(torch.bfloat16), "double -> bf16")
    check_bits(hfd, xd.float().to(torch.float16), "double -> half")
    halves = packed.view(torch.int16)  # little-endian: element 2i is the low half of word i
    lo, hi = halves[0::2], halves[1::2]
    check_bits(lo, ref_bf, "pack lo")
    check_bits(hi, (-x).to(torch.bfloat16), "pack hi")


@pytest.mark.gpu
@requires_hopper
def test_float8_conversions_match_torch_bit_for_bit():
    """pf's float8 conversions against torch's (the CPU's c10 code, which the reference
    evaluator and the interpreter follow: pyfuser/runtime/float8.py), every bit, NaN signs
    included: cvt's .satfinite and NaN differ from torch, the library's checks restore it."""
    torch.manual_seed(2)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int64).to(torch.int32)
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 448.0, 464.0, 464.01,
                479.99, 480.0, 57344.0, 61439.99, 61440.0, -61440.0, 65536.0, 2.0 ** -10,
                3 * 2.0 ** -10, 2.0 ** -17, 3 * 2.0 ** -17, 1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4,
                1e-40, -1e-40]
    x = torch.cat([torch.tensor(specials), bits.view(torch.float32), torch.randn(4096) * 300])
    xd = torch.cat([torch.randn(x.numel() - 4, dtype=torch.float64) * 300,
                    torch.tensor([448.00001, 61439.999999, 1e300, -math.nan], dtype=torch.float64)])
    n = x.numel()
    out = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(4)]
    back = [torch.empty(256, dtype=torch.float32, device="cuda") for _ in range(2)]
    fn = get_kernel(FLOAT8_SRC, "pf_float8")
    xc, xdc = x.cuda(), xd.cuda()
    launch(fn, (math.ceil(n / 256),), (256,),
           [ptr(xc), ptr(xdc), *(ptr(t) for t in out), *(ptr(t) for t in back), i32(n)])
    finish()
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    wants = [x.to(e4), x.to(e5), xd.float().to(e4), xd.float().to(e5)]
    for what, got, want in zip(("e4m3", "e5m2", "double e4m3", "double e5m2"), out, wants):
        assert torch.equal(got.cpu(), want.view(torch.uint8)), what
    patterns = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for got, dt in zip(back, (e4, e5)):
        want = patterns.view(dt).float()
        nan = want.isnan()
        got = got.cpu()
        assert torch.equal(got[~nan], want[~nan]) and got[nan].isnan().all()
        assert torch.equal(got[nan].signbit(), want[nan].signbit())     # a NaN's sign kept


@pytest.mark.gpu
@requires_hopper
def test_logsumexp_keys_match_the_host_rule():
    """pf::lse_key / lse_combine / lse_max / lse_sum and a block all-reduce with OpLogSumExp
    against runtime/lse_key.py (the interpreter's and the reference's rule): keys, maxima and
    the special values' NaNs exactly; sums within __expf's error."""
    from pyfuser.runtime import lse_key as L
    torch.manual_seed(3)
    n = 96 * 40
    x = torch.randn(n) * 6
    x[:6] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 88.0])
    x[96:192] = -math.inf                          # a block of -inf: NaN, as two passes give
    fold = L.lse_key(x)
    a = L.lse_combine(fold, L.lse_key(torch.randn(n) * 3))
    a[:3] = torch.tensor([L.IDENTITY, L.IDENTITY, int(L.lse_key(torch.tensor(-math.inf)))])
    b = L.lse_key(torch.randn(n) * 6)
    b[1] = L.IDENTITY
    out = {k: torch.empty(n, dtype=torch.int64, device="cuda") for k in ("key", "comb", "blk")}
    mx = torch.empty(n, device="cuda")
    sm = torch.empty(n, device="cuda")
    xc, ac, bc = x.cuda(), a.cuda(), b.cuda()
    launch(get_kernel(LSE_SRC, "pf_lse"), (n // 96,), (96,),
           [ptr(xc), ptr(ac), ptr(bc), ptr(out["key"]), ptr(out["comb"]), ptr(mx), ptr(sm),
            ptr(out["blk"]), i32(n)])
    finish()
    assert torch.equal(out["key"].cpu(), L.lse_key(x))
    torch.testing.assert_close(mx.cpu(), L.lse_max(a), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(sm.cpu(), L.lse_sum(a), rtol=0, atol=0, equal_nan=True)
    got_m, got_s = L.unpack(out["comb"].cpu())
    want_m, want_s = L.unpack(L.lse_combine(a, b))
    torch.testing.assert_close(got_m, want_m, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got_s, want_s, rtol=2e-6, atol=0, equal_nan=True)
    blocks = out["blk"].cpu().view(-1, 96)
    assert (blocks == blocks[:, :1]).all()         # every thread holds its block's result
    got = L.lse_max(blocks[:, 0]) + torch.log(L.lse_sum(blocks[:, 0]))
    xb = x.view(-1, 96).double()
    top = xb.amax(1, keepdim=True)
    want = (top + torch.log(torch.exp(xb - top).sum(1, keepdim=True))).squeeze(1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isnan(got[:2]).all()              # +inf in block 0, all -inf in block 1


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_math_matches_torch(dtype):
    torch.manual_seed(1)
    n = 8192
    x = torch.randn(n, dtype=dtype, device="cuda") * 4
    y = torch.randn(n, dtype=dtype, device="cuda")
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], dtype=dtype)
    y[4:8] = torch.tensor([float("nan"), float("nan"), 1.0, -0.0], dtype=dtype)
    out = torch.empty(len(MATH_FUNCS), n, dtype=dtype, device="cuda")
    name = "pf_math_f32" if dtype == torch.float32 else "pf_math_f64"
    launch(get_kernel(MATH_SRC, name), (n // 256,), (256,), [ptr(x), ptr(y), ptr(out), i32(n)])
    finish()
    tol = dict(rtol=2e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-13, atol=1e-13)
    for k, (expr, ref_fn) in enumerate(MATH_FUNCS):
        ref = ref_fn(x, y)
        torch.testing.assert_close(out[k], ref, equal_nan=True, msg=lambda m: f"{expr}: {m}", **tol)


def _math_f32_over(lo: float, hi: float, expr: str):
    """(float64 of x, float64 of MATH_FUNCS' `expr` computed by the float32 kernel at x): x
    over [lo, hi] at 2^20 points, its first four NaN, inf, -inf and -0."""
    n = 1 << 20
    x = torch.linspace(lo, hi, n, dtype=torch.float32, device="cuda")
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], device="cuda")
    out = torch.empty(len(MATH_FUNCS), n, dtype=torch.float32, device="cuda")
    launch(get_kernel(MATH_SRC, "pf_math_f32"), (n // 256,), (256,),
           [ptr(x), ptr(x), ptr(out), i32(n)])
    finish()
    k = next(i for i, (e, _) in enumerate(MATH_FUNCS) if e == expr)
    return x.double(), out[k].double()


@pytest.mark.gpu
@requires_hopper
def test_gelu_tanh_close_to_the_function_everywhere():
    """pf::gelu_tanh (x / (1 + exp(-2u)), ex2 and rcp approximations) against the float64
    function over [-10, 10]: within 2e-5 relative down to results of 1e-36 (below, the
    reciprocal of 1 + exp(-2u) > 2^126 flushes to zero, as ATen's 0.5 x (1 + tanh u) is zero
    below x = -5.3; that form also cancels above it: up to 100% off), 1.5e-6 relative for
    |x| < 3 (ATen's form: 1.3e-5; 7.8e-7 measured on the H200), and the signs and limits of
    the edge values."""
    xd, got = _math_f32_over(-10, 10, "pf::gelu_tanh(v)")
    want = xd / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
    normal = (want.abs() > 1e-36) & xd.isfinite()
    rel = ((got - want).abs() / want.abs())[normal]
    assert rel.max().item() < 2e-5, rel.max().item()
    assert ((got - want).abs() / want.abs())[normal & (xd.abs() < 3)].max().item() < 1.5e-6
    assert got[0].isnan() and got[1].item() == float("inf") and got[2].isnan()
    assert got[3].item() == 0 and got[3].signbit()


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("name", ["silu", "sigmoid"])
def test_silu_and_sigmoid_close_to_the_function_everywhere(name):
    """pf::silu and pf::sigmoid (rcp(1 + ex2(-x log2 e)), the approximations) against the
    float64 functions over [-100, 100]: within 1e-5 relative where sigmoid(x) > 2^-126 (x above
    -87.3; below, the reciprocal of 1 + exp(-x) flushes to zero), 1e-6 for |x| < 8, and ATen's
    edge values (silu(-inf) NaN, silu(-0) -0, sigmoid(-inf) 0)."""
    xd, got = _math_f32_over(-100, 100, f"pf::{name}(v)")
    sigmoid = 1 / (1 + torch.exp(-xd))
    want = xd * sigmoid if name == "silu" else sigmoid
    normal = (sigmoid > 2.0 ** -126) & (want != 0) & xd.isfinite()
    rel = (got - want).abs() / want.abs()
    assert rel[normal].max().item() < 1e-5, rel[normal].max().item()
    assert rel[normal & (xd.abs() < 8)].max().item() < 1e-6, rel[normal & (xd.abs() < 8)].max()
    assert got[0].isnan() and got[1].item() == (float("inf") if name == "silu" else 1.0)
    if name == "silu":
        assert got[2].isnan() and got[3].item() == 0 and got[3].signbit()
    else:
        assert got[2].item() == 0 and got[3].item() == 0.5


X_SHAPES = [
    (96, 1, 1), (128, 1, 1), (384, 1, 1), (1024, 1, 1), (32, 4, 1), (64, 2, 3), (128, 8, 1),
    (96, 3, 2),
    # fallbacks: segmented shuffles (Dx | 32) and the shared-memory tree (anything else)
    (8, 4, 1), (16, 8, 2), (1, 32, 1), (4, 3, 1), (100, 2, 1), (17, 3, 2), (48, 2, 1), (24, 5, 1),
    # one row of whole warps and a partial one, as a plain CtaBarrier: the tree too
    (321, 1, 1), (33, 1, 1),
]
Y_SHAPES = [(32, 8, 1), (16, 16, 2), (128, 4, 1), (7, 5, 3), (1, 64, 1), (256, 4, 1), (96, 1, 2),
            # columns over 8 rows (kSerialFoldRows) fold as a tree: powers of two and not
            (2, 256, 1), (4, 12, 3), (3, 100, 1), (1, 1024, 1), (16, 9, 1)]
OPS = {0: "sum", 1: "max", 2: "min"}


def _torch_reduce(t, dim, op):
    if op == 0:
        return t.sum(dim, keepdim=True)
    return t.amax(dim, keepdim=True) if op == 1 else t.amin(dim, keepdim=True)


def _run_reduce(dtype, shape, which, op, with_nan=False, blocks=7):
    dx, dy, dz = shape
    nthreads = dx * dy * dz
    torch.manual_seed(hash((shape, which, op)) % 1000)
    x = torch.randn(blocks, dz, dy, dx, dtype=dtype, device="cuda")
    if with_nan:
        x[1, 0, 0, dx // 2] = float("nan")
        x[3, dz - 1, dy - 1, 0] = float("nan")
    out = torch.full((3, blocks, dz, dy, dx), 12345.0, dtype=dtype, device="cuda")
    if which in (0, 2):
        smem = block_allreduce_x_smem_elems(3, dx, dy * dz)
    elif which in (1, 3):
        smem = block_allreduce_y_smem_elems(3, dx, dy * dz)
    else:
        smem = 0
    smem_bytes = max(16, smem * x.element_size())
    name = "pf_reduce_f32" if dtype == torch.float32 else "pf_reduce_f64"
    launch(get_kernel(REDUCE_SRC, name), (blocks,), (dx, dy, dz),
           [ptr(x), ptr(out), i32(which), i32(op)], smem=smem_bytes)
    finish()
    return x, out


def _assert_reduced(got, ref, op, dtype):
    ref = ref.expand_as(got)
    if op == 0:
        tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, ref, equal_nan=True, **tol)
    else:
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(OPS), ids=list(OPS.values()))
@pytest.mark.parametrize("shape", X_SHAPES, ids=[f"{a}x{b}x{c}" for a, b, c in X_SHAPES])
def test_block_allreduce_x(shape, op, dtype):
    x, out = _run_reduce(dtype, shape, which=0, op=op)
    _assert_reduced(out[0], _torch_reduce(x, -1, op), op, dtype)
    _assert_reduced(out[1], _torch_reduce(-x, -1, op), op, dtype)
    # all-reduce contract: every thread of a row holds the same bits
    assert torch.equal(out[0], out[0][..., :1].expand_as(out[0]))


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("op", list(OPS), ids=list(OPS.values()))
@pytest.mark.parametrize("shape", X_SHAPES, ids=[f"{a}x{b}x{c}" for a, b, c in X_SHAPES])
def test_block_allreduce_x_group(shape, op):
    x, out = _run_reduce(torch.float32, shape, which=2, op=op)
    for j, t in enumerate([x, -x, 2 * x]):
        _assert_reduced(out[j], _torch_reduce(t, -1, op), op, torch.float32)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("op", [1, 2], ids=["max", "min"])
@pytest.mark.parametrize("which", [0, 2], ids=["single", "group"])
def test_block_allreduce_x_propagates_nan(which, op):
    for shape in [(128, 2, 1), (96, 1, 1), (8, 4, 1), (100, 2, 1)]:
        x, out = _run_reduce(torch.float32, shape, which=which, op=op, with_nan=True)
        _assert_reduced(out[0], _torch_reduce(x, -1, op), op, torch.float32)
        assert torch.isnan(out[0][1, 0, 0]).all() and torch.isnan(out[0][3, -1, -1]).all()


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(OPS), ids=list(OPS.values()))
@pytest.mark.parametrize("shape", Y_SHAPES, ids=[f"{a}x{b}x{c}" for a, b, c in Y_SHAPES])
def test_block_allreduce_y(shape, op, dtype):
    x, out = _run_reduce(dtype, shape, which=1, op=op)
    _assert_reduced(out[0], _torch_reduce(x, 2, op), op, dtype)
    _assert_reduced(out[1], _torch_reduce(-x, 2, op), op, dtype)
    assert torch.equal(out[0], out[0][:, :, :1, :].expand_as(out[0]))
    x, out = _run_reduce(dtype, shape, which=3, op=op)
    for j, t in enumerate([x, -x, 2 * x]):
        _assert_reduced(out[j], _torch_reduce(t, 2, op), op, dtype)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", list(OPS), ids=list(OPS.values()))
def test_warp_allreduce(op, dtype):
    x, out = _run_reduce(dtype, (32, 3, 1), which=4, op=op)
    _assert_reduced(out[0], _torch_reduce(x, -1, op), op, dtype)
    seg = (-x).reshape(7, 1, 3, 4, 8)
    _assert_reduced(out[1].reshape(7, 1, 3, 4, 8), _torch_reduce(seg, -1, op), op, dtype)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize(
    "dx,rows_per_group,groups,producer_rows,mode",
    [
        (128, 1, 2, 1, 0),  # two compute warp groups on TIDy + one producer warp group
        (64, 2, 2, 1, 0),  # a group spans two rows
        (256, 1, 1, 1, 0),
        (32, 4, 1, 4, 1),  # column (y) reduction inside the group: 4 rows of 32
        (64, 2, 3, 2, 1),
    ],
)
def test_named_barrier_reduction_with_nonparticipating_producer(
    dx, rows_per_group, groups, producer_rows, mode
):
    torch.manual_seed(2)
    C = rows_per_group * groups
    dy = C + producer_rows
    iters = 5
    x = torch.randn(iters, groups, rows_per_group, dx, device="cuda")
    out = torch.full_like(x, 777.0)
    out2 = torch.full((iters, groups, rows_per_group, dx, 2), 777.0, device="cuda")
    producer_threads = dx * producer_rows
    marker = torch.zeros(iters, producer_threads, device="cuda")
    per_group = (
        block_allreduce_x_smem_elems(2, dx, rows_per_group)
        if mode == 0
        else block_allreduce_y_smem_elems(2, dx, rows_per_group)
    )
    smem = max(16, per_group * groups * 4)
    launch(get_kernel(NAMED_SRC, "pf_named"), (1,), (dx, dy),
           [ptr(x), ptr(out), ptr(out2), ptr(marker), i32(iters), i32(rows_per_group), i32(groups),
            i32(mode)], smem=smem)
    finish()
    dim = -1 if mode == 0 else 2
    ref = x.sum(dim, keepdim=True).expand_as(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out2[..., 0], ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out2[..., 1], (x * x).sum(dim, keepdim=True).expand_as(x),
                               rtol=1e-5, atol=1e-4)
    expected_marker = torch.arange(1, iters + 1, device="cuda", dtype=torch.float32)[:, None]
    assert torch.equal(marker, expected_marker.expand_as(marker))


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("rows", [1, 2, 3, 37])
def test_mbarrier_bulk_copy_pipeline(rows):
    torch.manual_seed(3)
    x = torch.randn(rows, PIPELINE_L, device="cuda")
    sums = torch.full((rows,), 777.0, device="cuda")
    out = torch.full_like(x, 777.0)
    launch(get_kernel(PIPELINE_SRC, "pf_pipeline"), (1,), (256,), [ptr(x), ptr(sums), ptr(out), i32(rows)])
    finish()
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)


def _tensor_map_2d(t: torch.Tensor, box_h: int, box_w: int):
    h, w = t.shape
    tm = _drv(
        driver.cuTensorMapEncodeTiled(
            driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            2,
            t.data_ptr(),
            [driver.cuuint64_t(w), driver.cuuint64_t(h)],
            [driver.cuuint64_t(t.stride(0) * t.element_size())],
            [driver.cuuint32_t(box_w), driver.cuuint32_t(box_h)],
            [driver.cuuint32_t(1), driver.cuuint32_t(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    )
    return (ctypes.c_uint64 * 16).from_buffer_copy(ctypes.string_at(tm.getPtr(), 128))


@pytest.mark.gpu
@requires_hopper
def test_tma_2d_load_store():
    torch.manual_seed(4)
    h, w = 50, 100  # partial boxes on both edges; row pitch 400 B (a multiple of 16)
    x = torch.randn(h, w, device="cuda")
    out = torch.full_like(x, 777.0)
    _ensure_context()
    tin = _tensor_map_2d(x, TMA_BH, TMA_BW)
    tout = _tensor_map_2d(out, TMA_BH, TMA_BW)
    grid = (math.ceil(w / TMA_BW), math.ceil(h / TMA_BH))
    launch(get_kernel(TMA_SRC, "pf_tma2d"), grid, (128,), [tin, tout])
    finish()
    torch.testing.assert_close(out, 3 * x, rtol=0, atol=0)


@pytest.mark.gpu
@requires_hopper
def test_setmaxnreg_warp_specialized_kernel():
    torch.manual_seed(5)
    blocks = 3
    x = torch.randn(blocks, 128, device="cuda")
    out = torch.full((blocks, 2, 128), 777.0, device="cuda")
    launch(get_kernel(SETMAXNREG_SRC, "pf_setmaxnreg"), (blocks,), (384,), [ptr(x), ptr(out)])
    finish()
    k = torch.arange(128, device="cuda")
    t = torch.arange(128, device="cuda")
    idx = (t[:, None] + k[None, :]) % 128  # [t, k]
    weights = (k % 3).float()
    ref = (x[:, idx] * weights).sum(-1)  # [blocks, t]
    for wg in (1, 2):
        torch.testing.assert_close(out[:, wg - 1], ref + wg, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@requires_hopper
def test_cluster_st_async_and_dsmem_reduce():
    torch.manual_seed(6)
    clusters = 5
    x = torch.randn(clusters, 2048, device="cuda")
    out_async = torch.full((clusters * 2, 256), 777.0, device="cuda")
    out_ld = torch.full_like(out_async, 777.0)
    launch(get_kernel(CLUSTER_SRC, "pf_cluster"), (clusters * 2,), (256,),
           [ptr(x), ptr(out_async), ptr(out_ld)], cluster=(2, 1, 1))
    finish("cluster kernel")
    ref = x.sum(1).repeat_interleave(2)[:, None].expand_as(out_async)
    torch.testing.assert_close(out_async, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out_ld, ref, rtol=1e-5, atol=1e-4)
    # both CTAs of a cluster, and all their threads, hold the same bits
    assert torch.equal(out_async, out_async[::2].repeat_interleave(2, 0))
    assert torch.equal(out_async, out_ld)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("use_ex", [True, False], ids=["attr_cooperative", "cuLaunchCooperativeKernel"])
def test_grid_sync_cooperative(use_ex):
    fn = get_kernel(GRID_SYNC_SRC, "pf_grid_sync")
    per_sm = _drv(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 256, 0))
    assert per_sm >= 1
    max_blocks = per_sm * sm_count()
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")  # zeroed once, reused below
    rounds = 3
    for grid in [(min(max_blocks, 2 * sm_count()),), (sm_count() // 2, 2), (5,), (max_blocks,)]:
        nb = math.prod(grid)
        vals = torch.zeros(nb, device="cuda")
        out = torch.full((rounds, nb), 777.0, device="cuda")
        launch(fn, grid, (256,), [ptr(counter), ptr(vals), ptr(out), i32(rounds)],
               cooperative=True, use_ex=use_ex)
        finish("grid sync kernel")
        total = nb * (nb + 1) / 2
        ref = torch.tensor([total * (r + 1) for r in range(rounds)], device="cuda")
        torch.testing.assert_close(out, ref[:, None].expand_as(out), rtol=0, atol=0)
        # self-resetting: 2 * rounds flips of the top bit, low bits back to zero
        assert counter.item() == 0


# A block of one row of whole warps and a partial one, given as pf::OneRowBarrier<Dx> (as the
# code generator does for such static blocks): shared memory, the full warps fold, thread 0
# leaves the result for the partial warp. Sum of a group of two and a max, every thread.
ONE_ROW_DX = (33, 100, 321, 1000)
ONE_ROW_SRC = r"""
template <unsigned Dx>
__device__ void pf_one_row(const float* in, float* out) {
  extern __shared__ __align__(16) float pf_smem_f[];
  const unsigned i = blockIdx.x * Dx + threadIdx.x;
  const float v = in[i];
  float g[2] = {v, -2.0f * v};
  pf::block_allreduce_x_group<2>(g, pf_smem_f, pf::OpSum(), pf::OneRowBarrier<Dx>());
  const float m = pf::block_allreduce_x(v, pf_smem_f, pf::OpMax(), pf::OneRowBarrier<Dx>());
  out[3 * i] = g[0];
  out[3 * i + 1] = g[1];
  out[3 * i + 2] = m;
}
""" + "".join(
    f'extern "C" __global__ void pf_one_row_{dx}(const float* in, float* out) '
    f"{{ pf_one_row<{dx}>(in, out); }}\n" for dx in ONE_ROW_DX)


@pytest.mark.gpu
@requires_hopper
@pytest.mark.parametrize("dx", ONE_ROW_DX)
def test_block_allreduce_x_one_row_of_a_partial_warp(dx):
    blocks = 5
    torch.manual_seed(dx)
    x = torch.randn(blocks, dx, device="cuda")
    out = torch.full((blocks, dx, 3), 12345.0, device="cuda")
    smem = max(block_allreduce_x_smem_elems(2, dx, 1), block_allreduce_x_smem_elems(1, dx, 1))
    assert smem == 2 * dx + 2
    launch(get_kernel(ONE_ROW_SRC, f"pf_one_row_{dx}"), (blocks,), (dx, 1, 1),
           [ptr(x), ptr(out)], smem=smem * 4)
    finish()
    s = x.double().sum(1, keepdim=True)
    torch.testing.assert_close(out[..., 0].double(), s.expand(blocks, dx), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out[..., 1].double(), (-2 * s).expand(blocks, dx), rtol=1e-5,
                               atol=1e-4)
    assert torch.equal(out[..., 2], x.amax(1, keepdim=True).expand(blocks, dx))
    # The same bits in every thread of a block (full warps and the partial one).
    assert (out[..., 0] == out[:, :1, 0]).all() and (out[..., 1] == out[:, :1, 1]).all()


def test_one_row_kernels_compile():
    _, log = compile_cubin(ONE_ROW_SRC)
    assert "spill" not in log or not re.findall(r"[1-9]\d* bytes spill", log), log
    assert "warning" not in log.lower(), log
