"""Loading and launching real kernels on a GPU (marker ``gpu``), plus a CPU check that every
kernel used here compiles cleanly for sm_90a.

Each GPU test poisons its outputs first and compares with torch. Kernels are inline PTX with no
CUDA headers (runtime_gpu_kernels.py).
"""

import ctypes
import time

import pytest
import torch

import runtime_gpu_kernels as K
from cubin_params import kernel_params
from pyfuser.runtime.device import cuda_available, query_device
from pyfuser.runtime.kernel_cache import clear_memory_cache, get_or_compile
from pyfuser.runtime.launch import (
    LaunchError,
    ParamLayout,
    current_stream_handle,
    load,
    occupancy,
)
from pyfuser.runtime.nvrtc import compile_to_cubin
from pyfuser.runtime.tensor_map import encode_tiled


def _hopper_or_newer() -> bool:
    return cuda_available() and torch.cuda.get_device_capability(0)[0] >= 9


needs_gpu = pytest.mark.skipif(not _hopper_or_newer(), reason="needs a Hopper (sm_90+) GPU")


def _load(name: str):
    module = compile_to_cubin(K.ALL[name], name, arch=query_device(0).arch)
    return load(module, 0)


def _sync():
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# CPU: the device code of these tests compiles
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(K.ALL))
def test_kernels_of_these_tests_compile_cleanly_for_sm90a(name):
    pytest.importorskip("cuda.bindings.nvrtc")
    report = compile_to_cubin(K.ALL[name], name).ptxas
    assert not report.has_spills and report.warnings == (), report.summary()


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_pattern_written_into_a_torch_tensor():
    kernel = _load("pattern")
    layout = ParamLayout(["ptr", "i32", "f32", "f32"])
    kernel.check_layout(layout)
    n = 1000
    out = torch.full((n + 24,), -7.0, device="cuda")
    kernel.launch(((n + 127) // 128, 1, 1), (128, 1, 1), layout.pack([out.data_ptr(), n, 0.5, 3.0]))
    _sync()
    expected = torch.arange(n, device="cuda", dtype=torch.float32) * 0.5 + 3.0
    torch.testing.assert_close(out[:n], expected, rtol=0, atol=0)
    assert torch.all(out[n:] == -7.0), "no write past n"


@pytest.mark.gpu
@needs_gpu
def test_launch_goes_to_torchs_current_stream():
    kernel = _load("pattern")
    layout = ParamLayout(["ptr", "i32", "f32", "f32"])
    stream = torch.cuda.Stream()
    out = torch.zeros(4096, device="cuda")
    _sync()
    with torch.cuda.stream(stream):
        assert current_stream_handle(0) == stream.cuda_stream
        kernel.launch(32, 128, layout.pack([out.data_ptr(), 4096, 1.0, 0.0]))
    stream.synchronize()
    assert torch.equal(out, torch.arange(4096, device="cuda", dtype=torch.float32))


@pytest.mark.gpu
@needs_gpu
def test_every_scalar_kind_reaches_the_kernel():
    kernel = _load("all_kinds")
    layout = ParamLayout(["ptr", "i64", "i32", "f64", "f32", "i64"])
    kernel.check_layout(layout)
    out = torch.full((5,), float("nan"), dtype=torch.float64, device="cuda")
    kernel.launch(1, 32, layout.pack([out.data_ptr(), -(2**40), -7, 0.1, 2.5, 2**52]))
    _sync()
    assert out.tolist() == [float(-(2**40)), -7.0, 0.1, 2.5, float(2**52)]


@pytest.mark.gpu
@needs_gpu
def test_dynamic_shared_memory_above_48_kb():
    kernel = _load("big_smem")
    layout = ParamLayout(["ptr", "ptr", "i32"])
    n = 51200  # 200 KiB of floats per block
    blocks = 4
    x = torch.randn(blocks, n, device="cuda")
    y = torch.full_like(x, float("nan"))
    kernel.launch(blocks, 256, layout.pack([x.data_ptr(), y.data_ptr(), n]), shared_mem=n * 4)
    _sync()
    assert torch.equal(y, x.flip(1))
    assert kernel.dynamic_smem_limit >= n * 4
    assert occupancy(kernel, 256, n * 4) == 1
    too_much = query_device(0).max_shared_memory_per_block_optin + 1024
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        kernel.launch(1, 256, layout.pack([x.data_ptr(), y.data_ptr(), n]), shared_mem=too_much)


@pytest.mark.gpu
@needs_gpu
def test_cluster_launch_ranks_and_peer_shared_memory():
    kernel = _load("cluster_rank")
    layout = ParamLayout(["ptr"])
    grid = 8
    out = torch.full((2 * grid,), 999, dtype=torch.int32, device="cuda")
    kernel.launch(grid, 64, layout.pack([out.data_ptr()]), cluster=(2, 1, 1))
    _sync()
    ranks, peers = out[0::2].tolist(), out[1::2].tolist()
    assert ranks == [b % 2 for b in range(grid)]
    assert peers == [(r ^ 1) * 10 + 1 for r in ranks], "each CTA read its peer's shared memory"


@pytest.mark.gpu
@needs_gpu
def test_cooperative_launch_with_a_grid_barrier():
    kernel = _load("grid_barrier")
    layout = ParamLayout(["ptr", "ptr"])
    per_sm = occupancy(kernel, 128, 0)
    grid = per_sm * query_device(0).sm_count
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(grid, dtype=torch.int32, device="cuda")
    kernel.launch(grid, 128, layout.pack([counter.data_ptr(), out.data_ptr()]), cooperative=True)
    _sync()
    assert counter.item() == grid
    assert torch.all(out == grid), "every block saw every other block arrive"
    counter.zero_()
    with pytest.raises(LaunchError, match="COOPERATIVE_LAUNCH_TOO_LARGE"):
        kernel.launch(grid + 1, 128, layout.pack([counter.data_ptr(), out.data_ptr()]),
                      cooperative=True)
    _sync()


@pytest.mark.gpu
@needs_gpu
def test_tma_2d_tile_copy_through_shared_memory():
    """Load tiles with a tensor map, compute 2x+1 in shared memory, store with a tensor map.
    The matrix is not a multiple of the box, and the output is a view into a padded buffer:
    out-of-bounds parts of edge boxes must read as zero and must not be written."""
    rows, cols = 100, 200
    box_c, box_r = K.TMA_BOX_C, K.TMA_BOX_R
    x = torch.randn(rows, cols, device="cuda")
    padded = torch.full((rows + 16, cols + 32), float("nan"), device="cuda")
    y = padded[:rows, :cols]
    src = encode_tiled(x.data_ptr(), torch.float32, (cols, rows), (4, x.stride(0) * 4),
                       (box_c, box_r))
    dst = encode_tiled(y.data_ptr(), torch.float32, (cols, rows), (4, y.stride(0) * 4),
                       (box_c, box_r))
    kernel = _load("tma_copy")
    layout = ParamLayout(["tmap", "tmap"])
    kernel.check_layout(layout)
    grid = ((cols + box_c - 1) // box_c, (rows + box_r - 1) // box_r, 1)
    kernel.launch(grid, 128, layout.pack([src, dst]))
    _sync()
    torch.testing.assert_close(y, 2 * x + 1, rtol=0, atol=0)
    assert torch.all(padded[rows:].isnan()) and torch.all(padded[:, cols:].isnan())


@pytest.mark.gpu
@needs_gpu
def test_tile_box_maps_load_and_store_128_byte_swizzled_boxes():
    """encode_tile_box's maps (kir.TileBoxMap) on the hardware: a bf16 [300, 192] operand in
    boxes of 32 rows of 64 (128 bytes): the shared box holds each element where
    kir.nodes.swizzled_byte says (rows past the 300th zero-filled), and a store through the
    same pattern writes the matrix back exactly, nothing past its 300 rows."""
    from pyfuser.kir.nodes import TileBoxMap, swizzled_byte
    from pyfuser.runtime.tensor_map import encode_tile_box
    rows, cols, box_c, box_r = 300, 192, K.SW_C, K.SW_R
    x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
    padded = torch.full((rows + 8, cols), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = padded[:rows]
    grid = (cols // box_c, -(-rows // box_r), 1)
    raw = torch.zeros(grid[0] * grid[1] * box_r * box_c, dtype=torch.int16, device="cuda")
    src = encode_tile_box(x, TileBoxMap("input", 0, 1, 0, box_c, box_r))
    dst = encode_tile_box(y, TileBoxMap("output", 0, 1, 0, box_c, box_r))
    kernel = _load("tma_swizzled")
    layout = ParamLayout(["tmap", "tmap", "ptr"])
    kernel.check_layout(layout)
    kernel.launch(grid, 128, layout.pack([src, dst, raw.data_ptr()]))
    _sync()
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))
    assert torch.all(padded[rows:].isnan())
    # Where each element of each box lies in shared memory: row r, column c at byte
    # swizzled_byte(128 r + 2 c); rows past the matrix read as zero.
    r = torch.arange(box_r).view(-1, 1)
    c = torch.arange(box_c).view(1, -1)
    at = torch.tensor([[swizzled_byte(int(128 * i + 2 * j)) // 2 for j in range(box_c)]
                       for i in range(box_r)])
    boxes = raw.cpu().view(grid[1], grid[0], box_r * box_c)
    bits = torch.cat([x.view(torch.int16).cpu(),
                      torch.zeros(grid[1] * box_r - rows, cols, dtype=torch.int16)])
    for by in range(grid[1]):
        for bx in range(grid[0]):
            expected = bits[by * box_r + r, bx * box_c + c]
            assert torch.equal(boxes[by, bx][at], expected), (by, bx)
    assert not torch.equal(at, r * box_c + c)          # the pattern moved something


@pytest.mark.gpu
@needs_gpu
def test_driver_reports_the_cubins_parameter_offsets():
    """On sm_90 the cubin places a CUtensorMap at offset 48 (see test_param_layout); the
    driver must agree, and launches must still deliver it intact (the TMA test above)."""
    module = compile_to_cubin(K.ALL["tma_copy"], "tma_copy", arch=query_device(0).arch)
    kernel = load(module, 0)
    expected = kernel_params(module.cubin, module.symbol)
    assert list(zip(kernel.param_offsets, kernel.param_sizes)) == expected
    assert kernel.pack_offsets == (0, 128)


@pytest.mark.gpu
@needs_gpu
def test_bad_launch_names_the_error_and_the_kernel():
    kernel = _load("pattern")
    layout = ParamLayout(["ptr", "i32", "f32", "f32"])
    out = torch.zeros(16, device="cuda")
    with pytest.raises(LaunchError, match=r"pattern: cuLaunchKernel failed with CUDA_ERROR_"):
        kernel.launch(1, 2048, layout.pack([out.data_ptr(), 16, 1.0, 0.0]))
    with pytest.raises(LaunchError, match="pack into"):
        kernel.launch(1, 32, b"\0" * 8)


@pytest.mark.gpu
@needs_gpu
def test_cached_kernel_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    module, kind = get_or_compile(K.PATTERN, "pattern", arch=query_device(0).arch)
    assert kind == "compiled"
    clear_memory_cache()
    restored, kind = get_or_compile(K.PATTERN, "pattern", arch=query_device(0).arch)
    assert kind == "disk"
    out = torch.zeros(256, device="cuda")
    load(restored, 0).launch(2, 128, ParamLayout(["ptr", "i32", "f32", "f32"]).pack(
        [out.data_ptr(), 256, 2.0, 0.0]))
    _sync()
    assert torch.equal(out, 2 * torch.arange(256, device="cuda", dtype=torch.float32))


@pytest.mark.gpu
@needs_gpu
def test_per_launch_host_cost_is_printed():
    """Not a benchmark gate: prints what pyfuser adds on top of the bare driver call."""
    kernel = _load("pattern")
    layout = ParamLayout(["ptr", "i32", "f32", "f32"])
    out = torch.zeros(128, device="cuda")
    values = [out.data_ptr(), 128, 1.0, 0.0]
    packed = layout.pack(values)
    stream = current_stream_handle(0)
    kernel.launch(1, 128, packed)
    staging = kernel._tls.staging
    stream_pointer = ctypes.c_void_p(stream or None)

    def per_call(fn, batches=40, batch=256):
        """Host time per launch, timing batches small enough that the launch queue never
        fills (a full queue would make this measure the GPU, not the host)."""
        elapsed = 0.0
        for _ in range(batches):
            _sync()
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            elapsed += time.perf_counter() - start
        _sync()
        return elapsed / (batches * batch) * 1e6

    bare = per_call(lambda: kernel._launch_kernel(kernel._function_pointer, 1, 1, 1, 128, 1, 1,
                                                  0, stream_pointer, staging.kernel_params, None))
    ours = per_call(lambda: kernel.launch((1, 1, 1), (128, 1, 1), layout.pack(values)))
    print(f"\nbare cuLaunchKernel via ctypes: {bare:.2f} us/launch; "
          f"pyfuser pack + launch (current stream): {ours:.2f} us/launch")
    assert ours < bare + 10.0
