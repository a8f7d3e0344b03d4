"""CPU tests of the device-helper library: it compiles with NVRTC for sm_90a with no CUDA header,
alone and in pieces, every helper instantiates without spills, and the loader behaves.

NVRTC is called directly (not through pyfuser.runtime.nvrtc) so these tests do not depend on the
runtime package.
"""

from __future__ import annotations

import re

import pytest

from pyfuser.codegen import device_library as dl
from pyfuser.codegen.device_library import PARTS, device_library_source

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")

ARCH_OPTS = [b"--gpu-architecture=sm_90a", b"--ptxas-options=-v"]


class CompileResult:
    def __init__(self, ok: bool, log: str, ptx: str):
        self.ok = ok
        self.log = log
        self.ptx = ptx

    def spill_bytes(self) -> int:
        return sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", self.log))

    def warnings(self) -> list[str]:
        # ptxas reports an ignored setmaxnreg as "info ... (C7508) Potential Performance Loss"
        return [
            ln
            for ln in self.log.splitlines()
            if "warning" in ln.lower() or "performance loss" in ln.lower() or "ignored" in ln
        ]


def _check(res):
    err = res[0]
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)


def nvrtc_compile(src: str, std: str = "c++17", name: str = "pf_test.cu") -> CompileResult:
    prog = _check(nvrtc.nvrtcCreateProgram(src.encode(), name.encode(), 0, [], []))
    try:
        opts = ARCH_OPTS + [f"-std={std}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, log))
        ptx = ""
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc.nvrtcGetPTXSize(prog))
            buf = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(prog, buf))
            ptx = buf.rstrip(b"\0").decode()
        return CompileResult(
            err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.rstrip(b"\0").decode(errors="replace"), ptx
        )
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def assert_compiles(src: str, std: str = "c++17") -> CompileResult:
    res = nvrtc_compile(src, std)
    assert res.ok, res.log
    assert res.spill_bytes() == 0, res.log
    assert not res.warnings(), res.log
    return res


EMPTY_KERNEL = 'extern "C" __global__ void pf_empty_kernel() {}\n'


# ------------------------------------------------------------------------------------------------
# Loader
# ------------------------------------------------------------------------------------------------
def test_parts_order_is_the_documented_one():
    assert PARTS == (
        "types",
        "math",
        "memory",
        "reduce",
        "mbarrier",
        "tma",
        "warp_group",
        "mma",
        "cluster",
        "cluster_reduce",
        "scan",
        "topk",
        "grid_sync",
    )
    assert set(dl.DEPENDS) == set(PARTS)
    for part, deps in dl.DEPENDS.items():
        for d in deps:
            assert PARTS.index(d) < PARTS.index(part), (part, d)


def test_full_source_is_all_files_in_order():
    src = device_library_source()
    positions = [src.index(f"// pyfuser device library: {p}.cuh") for p in PARTS]
    assert positions == sorted(positions)
    assert device_library_source(None) is src  # cached


def test_part_selection_adds_dependencies_in_order():
    assert device_library_source([]) == ""
    red = device_library_source(["reduce"])
    assert red == device_library_source(["types", "math", "reduce"])
    assert "memory.cuh" not in red and "mbarrier.cuh" not in red
    # order of the request does not matter
    assert device_library_source(["grid_sync", "types"]) == device_library_source(
        ["types", "grid_sync"]
    )
    with pytest.raises(ValueError, match="unknown"):
        device_library_source(["types", "nope"])


@pytest.mark.parametrize("part", PARTS)
def test_file_hygiene(part):
    text = dl._part_source(part)
    assert "#include" not in text
    assert "#pragma once" not in text
    # every macro defined is undefined again (the text is pasted in front of generated code)
    defined = set(re.findall(r"^\s*#define\s+(\w+)", text, re.M))
    undefined = set(re.findall(r"^\s*#undef\s+(\w+)", text, re.M))
    assert defined == undefined
    # everything outside comments lives in namespace pf
    code = re.sub(r"//[^\n]*", "", text)
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S).strip()
    assert code.startswith("namespace pf {"), part
    assert code.endswith("}"), part
    # one top-level namespace block: braces balance only at the very end
    depth = 0
    for i, ch in enumerate(code):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0 and i > len("namespace pf {"):
            assert i == len(code) - 1, f"{part}: code after namespace pf closes"
    assert text.endswith("\n")


# ------------------------------------------------------------------------------------------------
# Compilation: whole library, every prefix, every part with its dependencies
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("std", ["c++17", "c++20"])
def test_whole_library_compiles_without_warnings(std):
    assert_compiles(device_library_source() + EMPTY_KERNEL, std)


@pytest.mark.parametrize("n", range(1, len(PARTS) + 1), ids=PARTS)
def test_each_prefix_compiles(n):
    src = "".join(dl._part_source(p) for p in PARTS[:n])
    assert_compiles(src + EMPTY_KERNEL)


@pytest.mark.parametrize("part", PARTS)
def test_each_part_compiles_with_its_dependencies_only(part):
    assert_compiles(device_library_source([part]) + EMPTY_KERNEL)


# ------------------------------------------------------------------------------------------------
# Every helper instantiated, so ptxas assembles every inline-PTX form
# ------------------------------------------------------------------------------------------------
INSTANTIATE_ALL = r"""
template <typename T>
__device__ T pf_all_math(T x, T y) {
  return pf::abs(x) + pf::exp(x) + pf::exp2(x) + pf::expm1(x) + pf::log(x) + pf::log2(x) +
         pf::log10(x) + pf::log1p(x) + pf::pow(x, y) + pf::sqrt(x) + pf::rsqrt(x) +
         pf::reciprocal(x) + pf::sin(x) + pf::cos(x) + pf::tanh(x) + pf::erf(x) + pf::erfc(x) +
         pf::floor(x) + pf::ceil(x) + pf::trunc(x) + pf::round(x) + pf::maximum(x, y) +
         pf::minimum(x, y) + pf::fmax(x, y) + pf::fmin(x, y) + pf::clamp(x, y, T(3)) +
         pf::relu(x) + pf::sigmoid(x) + pf::silu(x) + pf::gelu(x) + pf::gelu_tanh(x) +
         T(pf::isnan(x)) + T(pf::isinf(x)) + T(pf::isfinite(y));
}

extern "C" __global__ void pf_types_math(float* f, double* d, int* i, long long* l,
                                         unsigned short* h) {
  const float x = f[threadIdx.x];
  const double y = d[threadIdx.x];
  pf::bf16 b = pf::float_to_bf16(x);
  pf::half hf = pf::float_to_half(x);
  h[0] = b.bits + hf.bits + pf::cast<pf::bf16>(y).bits + pf::cast<pf::half>(y).bits +
         pf::cast<pf::bf16>(hf).bits + pf::cast<pf::half>(b).bits + pf::cast<pf::bf16>(b).bits +
         pf::cast<pf::half>(i[0]).bits + pf::bf16_from_bits(1).bits + pf::half_from_bits(2).bits;
  pf::fp8e4m3 e4 = pf::float_to_fp8e4m3(x);
  pf::fp8e5m2 e5 = pf::float_to_fp8e5m2(x);
  h[2] = e4.bits + e5.bits + pf::cast<pf::fp8e4m3>(y).bits + pf::cast<pf::fp8e5m2>(b).bits +
         pf::cast<pf::fp8e4m3>(e5).bits + pf::cast<pf::fp8e5m2>(l[0]).bits +
         pf::cast<pf::fp8e4m3>(e4).bits + pf::fp8e4m3_from_bits(3).bits +
         pf::fp8e5m2_from_bits(4).bits + pf::cast<pf::bf16>(e4).bits;
  f[4] = pf::fp8e4m3_to_float(e4) + pf::fp8e5m2_to_float(e5) + pf::cast<float>(e4) +
         float(pf::cast<int>(e5)) + float(pf::cast<double>(e4)) + pf::half_bits_to_float(h[3]);
  f[1] = pf::bf16_to_float(b) + pf::half_to_float(hf) + pf::cast<float>(b) + pf::cast<float>(y) +
         pf::bit_cast<float>(pf::pack_bf16x2(x, 2.f)) + pf::bit_cast<float>(pf::pack_half2(x, 2.f));
  d[1] = pf::cast<double>(hf) + pf_all_math(y, d[2]) + pf::infinity<double>() +
         pf::quiet_nan<double>() + pf::lowest<double>() + pf::highest<double>() +
         pf::max_identity<double>() + pf::min_identity<double>();
  f[2] = pf_all_math(x, f[3]) + pf::fast_exp(x) + pf::fast_tanh(x) + pf::infinity<float>() +
         pf::quiet_nan<float>() + pf::lowest<float>() + pf::highest<float>() +
         pf::max_identity<float>() + pf::min_identity<float>();
  h[1] = pf::infinity<pf::bf16>().bits + pf::quiet_nan<pf::half>().bits + pf::lowest<pf::bf16>().bits +
         pf::highest<pf::half>().bits + pf::max_identity<pf::half>().bits +
         pf::min_identity<pf::bf16>().bits;
  i[1] = pf::abs(i[2]) + pf::maximum(i[2], i[3]) + pf::minimum(i[2], i[3]) + pf::relu(i[4]) +
         pf::clamp(i[5], 0, 9) + int(pf::maximum(1u, unsigned(i[6]))) + pf::lowest<int>() +
         pf::highest<signed char>() + pf::max_identity<unsigned char>() + pf::lowest<short>() +
         pf::highest<unsigned short>() + int(pf::min_identity<bool>()) + pf::ceil_div(i[7], 4) +
         pf::round_up(i[7], 8);
  l[1] = pf::abs(l[2]) + pf::maximum(l[2], l[3]) + pf::minimum(l[2], l[3]) + pf::relu(l[4]) +
         pf::lowest<long long>() + (long long)pf::highest<unsigned long long>() +
         (long long)pf::maximum(1ull, 2ull) + (long long)pf::minimum(1ull, 2ull) +
         pf::ceil_div(l[5], 3) + (long long)pf::highest<unsigned>();
  pf::Array<float, 4> a;
  a[0] = x;
  a[1] = a.size();
  a[2] = 0.f;
  a[3] = 1.f;
  *reinterpret_cast<pf::Array<float, 4>*>(f + 4) = a;
}

template <pf::LoadHint L, pf::StoreHint S, int B>
__device__ void pf_copy(char* out, const char* in, char* sm) {
  pf::Array<char, B> r;
  pf::load_global<B, L>(&r, in + B * threadIdx.x);
  pf::store_shared<B>(sm + B * threadIdx.x, &r);
  __syncthreads();
  pf::Array<char, B> q;
  pf::load_shared<B>(&q, sm + B * (threadIdx.x ^ 1));
  pf::store_global<B, S>(out + B * threadIdx.x, &q);
  __syncthreads();
}
template <pf::LoadHint L, pf::StoreHint S>
__device__ void pf_copy_all(char* out, const char* in, char* sm) {
  pf_copy<L, S, 2>(out, in, sm);
  pf_copy<L, S, 4>(out, in, sm);
  pf_copy<L, S, 8>(out, in, sm);
  pf_copy<L, S, 16>(out, in, sm);
}

extern "C" __global__ void pf_memory(char* out, const char* in, float* f) {
  __shared__ alignas(16) char sm[16 * 1024];
  using L = pf::LoadHint;
  using S = pf::StoreHint;
  pf_copy_all<L::Default, S::Default>(out, in, sm);
  pf_copy_all<L::NoAllocate, S::NoAllocate>(out, in, sm);
  pf_copy_all<L::EvictFirst, S::EvictFirst>(out, in, sm);
  pf_copy_all<L::EvictLast, S::EvictLast>(out, in, sm);
  pf_copy_all<L::ReadOnly, S::Streaming>(out, in, sm);
  pf_copy_all<L::ReadOnlyNoAllocate, S::Default>(out, in, sm);
  pf::Array<float, 4> a;
  pf::load_global_vec<L::ReadOnlyNoAllocate>(a, f);
  a[0] += 1.f;
  pf::store_global_vec<S::Streaming>(f + 4, a);
  pf::Array<pf::bf16, 8> b;
  pf::load_global_vec(b, reinterpret_cast<const pf::bf16*>(in));
  pf::store_shared_vec(reinterpret_cast<pf::bf16*>(sm), b);
  pf::load_shared_vec(b, reinterpret_cast<const pf::bf16*>(sm) + 8);
  pf::store_global_vec(reinterpret_cast<pf::bf16*>(out), b);
  f[8] = float(pf::smem_addr(sm));
}

template <typename T, typename Op>
__device__ void pf_reduce_all(T* out, T* smem, Op op) {
  T v = out[threadIdx.x];
  v = pf::warp_allreduce(v, op);
  v = pf::warp_allreduce<8>(v, op, 0xffffu);
  v = pf::block_allreduce_x(v, smem, op);
  v = pf::block_allreduce_x(v, smem, op, pf::NamedBarrier{1, 128});
  v = pf::block_allreduce_y(v, smem, op);
  v = pf::block_allreduce_y(v, smem, op, pf::NamedBarrier{2, 256});
  T g[3] = {v, v + T(1), v + T(2)};
  pf::block_allreduce_x_group<3>(g, smem, op);
  pf::block_allreduce_x_group<3>(g, smem, op, pf::NamedBarrier{3, 128});
  pf::block_allreduce_y_group<3>(g, smem, op);
  pf::block_allreduce_y_group<3>(g, smem, op, pf::NamedBarrier{4, 64});
  out[threadIdx.x] = g[0] + g[1] + g[2] + pf::identity<Op, T>();
}

extern "C" __global__ void pf_reduce(float* f, double* d, int* i, long long* l) {
  extern __shared__ __align__(16) unsigned char pf_smem[];
  pf_reduce_all(f, reinterpret_cast<float*>(pf_smem), pf::OpSum());
  pf_reduce_all(f, reinterpret_cast<float*>(pf_smem), pf::OpMax());
  pf_reduce_all(f, reinterpret_cast<float*>(pf_smem), pf::OpMin());
  pf_reduce_all(d, reinterpret_cast<double*>(pf_smem), pf::OpSum());
  pf_reduce_all(d, reinterpret_cast<double*>(pf_smem), pf::OpMax());
  pf_reduce_all(d, reinterpret_cast<double*>(pf_smem), pf::OpMin());
  pf_reduce_all(i, reinterpret_cast<int*>(pf_smem), pf::OpSum());
  pf_reduce_all(l, reinterpret_cast<long long*>(pf_smem), pf::OpMax());
  f[0] += pf::warp_allreduce_sum(f[1]) + pf::warp_allreduce_max(f[2]) + pf::warp_allreduce_min(f[3]);
  d[0] += pf::warp_allreduce_sum(d[1]) + pf::shfl_xor(d[2], 1);
  pf::named_barrier_arrive(5, 64);
  f[4] = float(pf::block_allreduce_x_smem_elems(2, blockDim.x, blockDim.y) +
               pf::block_allreduce_y_smem_elems(2, blockDim.x, blockDim.y));
}

extern "C" __global__ void pf_async(const __grid_constant__ pf::CUtensorMap tmap, float* g,
                                    unsigned* counter) {
  __shared__ alignas(128) float buf[2048];
  __shared__ unsigned long long bars[2];
  const unsigned b0 = pf::smem_addr(&bars[0]);
  const unsigned b1 = pf::smem_addr(&bars[1]);
  const unsigned s = pf::smem_addr(buf);
  if (threadIdx.x == 0) {
    pf::prefetch_tensormap(&tmap);
    pf::mbarrier_init(b0, 1);
    pf::mbarrier_init(b1, blockDim.x);
    pf::fence_mbarrier_init();
  }
  __syncthreads();
  if (pf::warp_id() == 0 && pf::elect_one_sync()) {
    pf::mbarrier_arrive_expect_tx(b0, 5 * 1024);
    pf::mbarrier_expect_tx(b0, 0);
    pf::mbarrier_arrive_expect_tx_cluster(b1, 0);
    pf::bulk_prefetch_l2(g, 1024);
    pf::bulk_copy_g2s(s, g, 1024, b0);
    pf::tma_load_1d(s + 1024, &tmap, 0, b0);
    pf::tma_load_2d(s + 2048, &tmap, 0, 1, b0);
    pf::tma_load_3d(s + 3072, &tmap, 0, 1, 2, b0);
    pf::tma_load_4d(s + 4096, &tmap, 0, 1, 2, 3, b0);
    pf::tma_load_5d(s + 5120, &tmap, 0, 1, 2, 3, 4, b0);
  }
  pf::mbarrier_wait_parity(b0, 0);
  pf::mbarrier_wait_parity(b0, 0, 1000u);
  pf::mbarrier_wait_parity_cluster(b0, 0);
  g[threadIdx.x] = buf[threadIdx.x] + float(pf::mbarrier_try_wait_parity(b0, 1)) +
                   float(pf::mbarrier_try_wait_parity(b0, 1, 20u)) +
                   float(pf::mbarrier_try_wait_parity_cluster(b0, 1));
  pf::mbarrier_arrive(b1);
  pf::mbarrier_arrive(b1, 1);
  pf::mbarrier_arrive_cluster(pf::map_shared_rank(b1, 0));
  pf::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    pf::bulk_copy_s2g(g, s, 1024);
    pf::tma_store_1d(&tmap, 0, s);
    pf::tma_store_2d(&tmap, 0, 1, s);
    pf::tma_store_3d(&tmap, 0, 1, 2, s);
    pf::tma_store_4d(&tmap, 0, 1, 2, 3, s);
    pf::tma_store_5d(&tmap, 0, 1, 2, 3, 4, s);
    pf::bulk_commit_group();
    pf::bulk_wait_group_read<0>();
    pf::bulk_wait_group_read<1>();
    pf::bulk_wait_group<0>();
    pf::bulk_wait_group<2>();
    pf::mbarrier_inval(b0);
    pf::mbarrier_inval(b1);
  }
  // warp groups, cluster
  const unsigned peer = pf::map_shared_rank(s, pf::cluster_ctarank() ^ 1);
  pf::cluster_arrive_relaxed();
  pf::cluster_wait();
  pf::st_async(peer, 1u, b0);
  pf::st_async(peer, 1, b0);
  pf::st_async(peer, 1.f, b0);
  pf::st_async(peer + 8, 1ull, b0);
  pf::st_async(peer + 8, 1ll, b0);
  pf::st_async(peer + 8, 1.0, b0);
  pf::st_async_v2(peer + 8, 1u, 2u, b0);
  pf::st_async_v2(peer + 8, 1.f, 2.f, b0);
  pf::st_async_v2(peer + 16, 1.0, 2.0, b0);
  pf::st_async_v4(peer + 16, 1u, 2u, 3u, 4u, b0);
  pf::st_async_v4(peer + 16, 1.f, 2.f, 3.f, 4.f, b0);
  pf::st_shared_cluster(peer, 3.f);
  pf::st_shared_cluster(peer + 8, 3.0);
  pf::cluster_sync();
  g[1] = pf::ld_shared_cluster<float>(peer) + float(pf::ld_shared_cluster<double>(peer + 8)) +
         float(pf::ld_shared_cluster<unsigned>(peer)) +
         float(pf::cluster_nctarank() + pf::cluster_dim_x() + pf::cluster_dim_y() +
               pf::cluster_dim_z() + pf::cluster_cta_idx_x() + pf::cluster_cta_idx_y() +
               pf::cluster_cta_idx_z() + pf::cluster_idx_x() + pf::num_clusters_x());
  g[2] = float(pf::lane_id() + pf::warp_id() + pf::warp_group_id() + pf::warp_idx_in_warp_group() +
               pf::thread_idx_in_warp_group() + pf::linear_thread_idx());
  pf::named_barrier_sync(1, 128);
  pf::grid_sync(counter);
  g[3] = 1.f;
  pf::grid_sync(counter);
}

extern "C" __global__ void __launch_bounds__(384, 1) pf_setmaxnreg(float* out) {
  if (pf::warp_group_id() == 0) {
    pf::setmaxnreg_dec<40>();
    out[threadIdx.x] = 1.f;
  } else {
    pf::setmaxnreg_inc<232>();
    out[threadIdx.x] = 2.f;
  }
}
"""


def test_every_helper_instantiates_without_spills():
    res = assert_compiles(device_library_source() + INSTANTIATE_ALL)
    for kernel in ("pf_types_math", "pf_memory", "pf_reduce", "pf_async", "pf_setmaxnreg"):
        assert f"Compiling entry function '{kernel}'" in res.log


def test_ignored_setmaxnreg_would_be_caught():
    # the check in assert_compiles must see ptxas's diagnostic: without __launch_bounds__ ptxas
    # cannot know the entry register count and ignores setmaxnreg
    body = 'extern "C" __global__ void k(float* o) { pf::setmaxnreg_dec<40>(); o[0] = 1.f; }'
    res = nvrtc_compile(device_library_source(["warp_group"]) + body)
    assert res.ok and res.warnings(), res.log


def test_every_helper_instantiates_in_cxx20():
    assert_compiles(device_library_source() + INSTANTIATE_ALL, std="c++20")


def _ptx_of(body: str, parts: list[str] | None = None) -> str:
    return assert_compiles(device_library_source(parts) + body).ptx


def test_conversions_use_the_hardware_rounding():
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* f, unsigned short* h) {'
        " h[0] = pf::float_to_bf16(f[0]).bits; h[1] = pf::float_to_half(f[1]).bits;"
        " f[2] = pf::half_to_float(pf::half_from_bits(h[2]));"
        " f[3] = pf::bf16_to_float(pf::bf16_from_bits(h[3])); }",
        ["types"],
    )
    assert "cvt.rn.bf16.f32" in ptx
    assert "cvt.rn.f16.f32" in ptx
    assert "cvt.f32.f16" in ptx


def test_float8_conversions_use_the_hardware_rounding():
    # cvt (sm_89+) rounds; the checks around it (NaN's sign, e5m2's inf from 61440) are plain
    # integer selects.
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* f, unsigned char* b) {'
        " b[0] = pf::float_to_fp8e4m3(f[0]).bits; b[1] = pf::float_to_fp8e5m2(f[1]).bits;"
        " f[2] = pf::fp8e4m3_to_float(pf::fp8e4m3_from_bits(b[2]));"
        " f[3] = pf::fp8e5m2_to_float(pf::fp8e5m2_from_bits(b[3])); }",
        ["types"],
    )
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "cvt.rn.satfinite.e5m2x2.f32" in ptx
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert "cvt.f32.f16" in ptx


def test_maximum_propagates_nan_in_one_instruction():
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* f) { f[0] = pf::maximum(f[1], f[2]);'
        " f[3] = pf::minimum(f[4], f[5]); f[6] = pf::relu(f[7]); }",
        ["math"],
    )
    assert ptx.count("max.NaN.f32") == 2
    assert "min.NaN.f32" in ptx


def test_accurate_math_is_the_default():
    # expf compiles to a range-reduced sequence, __expf to a bare ex2.approx after one multiply;
    # the accurate form needs more than one ex2 helper instruction sequence, so check by contrast.
    acc = _ptx_of('extern "C" __global__ void k(float* f) { f[0] = pf::exp(f[1]); }', ["math"])
    fast = _ptx_of('extern "C" __global__ void k(float* f) { f[0] = pf::fast_exp(f[1]); }', ["math"])
    assert "ex2.approx" in fast
    assert len(acc.splitlines()) > len(fast.splitlines())


def test_streaming_load_form():
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* o, const float* i) { pf::Array<float, 4> a;'
        " pf::load_global_vec<pf::LoadHint::ReadOnlyNoAllocate>(a, i + 4 * threadIdx.x);"
        " pf::store_global_vec<pf::StoreHint::NoAllocate>(o + 4 * threadIdx.x, a); }",
        ["memory"],
    )
    assert "ld.global.nc.L1::no_allocate.v4.u32" in ptx
    assert "st.global.L1::no_allocate.v4.u32" in ptx


@pytest.mark.parametrize("n", [1, 3])
def test_smem_formulas_agree_between_python_and_device(n):
    checks = []
    for dx in (1, 2, 4, 8, 16, 17, 24, 32, 48, 64, 96, 100, 128, 384, 1024):
        for rows in (1, 2, 3, 8):
            x = dl.block_allreduce_x_smem_elems(n, dx, rows)
            y = dl.block_allreduce_y_smem_elems(n, dx, rows)
            checks.append(
                f"static_assert(pf::block_allreduce_x_smem_elems({n}, {dx}, {rows}) == {x}u, \"x\");"
                f"static_assert(pf::block_allreduce_y_smem_elems({n}, {dx}, {rows}) == {y}u, \"y\");"
            )
    assert_compiles(device_library_source(["reduce"]) + "\n".join(checks) + "\n" + EMPTY_KERNEL)


def test_static_asserts_reject_bad_arguments():
    lib = device_library_source()
    bad = [
        'extern "C" __global__ void k() { pf::setmaxnreg_inc<20>(); }',
        'extern "C" __global__ void k() { pf::setmaxnreg_dec<100>(); }',
        'extern "C" __global__ void k(char* p) { pf::Array<char, 3> a; pf::load_global<3>(&a, p); }',
        'extern "C" __global__ void k(char* p) { pf::Array<char, 32> a; pf::store_global<32>(p, &a); }',
    ]
    for body in bad:
        res = nvrtc_compile(lib + body)
        assert not res.ok, body
        assert "static assertion failed" in res.log or "static_assert" in res.log, res.log


def test_cp_async_forms():
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* o, const float* i) {'
        " __shared__ alignas(16) float s[4 * 128];"
        " pf::cp_async<4>(pf::smem_addr(&s[threadIdx.x]), i + threadIdx.x);"
        " pf::cp_async<8>(pf::smem_addr(&s[128 + 2 * threadIdx.x]), i + 2 * threadIdx.x);"
        " pf::cp_async_commit_group();"
        " pf::cp_async<16>(pf::smem_addr(&s[256 + 4 * threadIdx.x]), i + 4 * threadIdx.x);"
        " pf::cp_async_commit_group(); pf::cp_async_commit_group();"
        " pf::cp_async_wait_group<2>(); o[threadIdx.x] = s[threadIdx.x];"
        " pf::cp_async_wait_group<0>(); o[128 + threadIdx.x] = s[256 + threadIdx.x]; }",
        ["memory"],
    )
    assert "cp.async.ca.shared.global [%r" in ptx and ", 4;" in ptx and ", 8;" in ptx
    assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx
    assert ptx.count("cp.async.commit_group;") == 3
    assert "cp.async.wait_group 2;" in ptx and "cp.async.wait_group 0;" in ptx
    for body in ('extern "C" __global__ void k(const char* p) { __shared__ char s[16];'
                 " pf::cp_async<2>(pf::smem_addr(s), p); }",
                 'extern "C" __global__ void k() { pf::cp_async_wait_group<-1>(); }'):
        res = nvrtc_compile(device_library_source(["memory"]) + body)
        assert not res.ok and "static assert" in res.log, res.log


SCAN_KERNEL = r"""
template <typename T, typename Op>
__device__ void pf_scan_one(T* out, Op op, unsigned& phase, T* ws, T* slots) {
  T total;
  T v = pf::block_exclusive_scan_x(out[threadIdx.x], ws, op, total);
  v = op(pf::cluster_exclusive_scan_row<4>(total, slots, 1, phase, op), v);
  out[threadIdx.x] = pf::warp_inclusive_scan(v, op) + pf::shfl_idx(v, 3) + pf::shfl_up(v, 1);
}

extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256)
pf_scan(float* f, double* d, int* i, long long* l) {
  __shared__ float wf[8];
  __shared__ double wd[8];
  __shared__ int wi[8];
  __shared__ long long wl[8];
  __shared__ float sf[8];
  __shared__ double sd[8];
  __shared__ int si[8];
  __shared__ long long sl[8];
  unsigned phase = 0;
  pf::cluster_sync();
  pf_scan_one(f, pf::OpSum(), phase, wf, sf);
  pf_scan_one(d, pf::OpProd(), phase, wd, sd);
  pf_scan_one(i, pf::OpSum(), phase, wi, si);
  pf_scan_one(l, pf::OpProd(), phase, wl, sl);
}
"""


def test_scan_helpers_compile_for_every_scan_type():
    """scan.cuh's block and cluster scans (4- and 8-byte, sum and product) assemble without
    spills (the kernels' scans instantiate only some of these)."""
    res = assert_compiles(device_library_source(["scan"]) + SCAN_KERNEL)
    assert "Compiling entry function 'pf_scan'" in res.log


def test_atomic_add_forms():
    """pf::atomic_add (a scatter's add) is one red.global.add per type, float32 and float64
    in their own forms, int64 through the u64 add (two's complement: the same bits)."""
    ptx = _ptx_of(
        'extern "C" __global__ void k(float* f, double* d, int* i, long long* l) {'
        " pf::atomic_add(f + threadIdx.x % 7, f[64]); pf::atomic_add(d + threadIdx.x % 5, d[64]);"
        " pf::atomic_add(i + threadIdx.x % 3, i[64]); pf::atomic_add(l + threadIdx.x % 2, l[64]);"
        " }",
        ["memory"],
    )
    for form in ("red.global.add.f32", "red.global.add.f64", "red.global.add.s32",
                 "red.global.add.u64"):
        assert ptx.count(form) == 1, (form, ptx)


# ------------------------------------------------------------------------------------------------
# mma.cuh: the wgmma shared-memory descriptors' bits
# ------------------------------------------------------------------------------------------------
def _descriptor(start: int, lbo: int, sbo: int, layout: int) -> int:
    """The Hopper wgmma matrix descriptor (../shared/MATMUL.md section 2): start address >> 4
    in bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, base
    offset 0 in 49-51, layout type in 62-63 (1: 128-byte swizzle)."""
    return ((start & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (layout << 62)


@pytest.mark.parametrize("helper, start, lbo, want", [
    ("pf::wgmma_desc_sw128({a})", 0x1A420, 16, _descriptor(0x1A420, 16, 1024, 1)),
    ("pf::wgmma_desc_sw128_mn({a}, 8192)", 0x24000, 8192, _descriptor(0x24000, 8192, 1024, 1)),
    ("pf::wgmma_desc_sw128_mn({a}, 16384)", 0x3C800, 16384, _descriptor(0x3C800, 16384, 1024, 1)),
])
def test_wgmma_descriptor_bits(helper, start, lbo, want):
    """The descriptors the generated matmul prints, folded by the compiler for a constant shared
    address: the 64-bit constant stored is the layout's bits."""
    src = device_library_source(["mma"]) + (
        'extern "C" __global__ void pf_desc(unsigned long long* out) {\n'
        f"  out[0] = {helper.format(a=hex(start) + 'u')};\n"
        "}\n")
    res = assert_compiles(src)
    consts = {int(v, 16) for v in re.findall(r"0x([0-9A-Fa-f]{9,16})", res.ptx)} | \
        {int(v) for v in re.findall(r"\b(\d{10,20})\b", res.ptx)}
    assert want in consts, (hex(want), res.ptx[-600:])
