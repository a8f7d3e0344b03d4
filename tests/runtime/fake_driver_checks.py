"""Checks of pyfuser.runtime against fake_libcuda.c, run in a subprocess by
test_launch_fake_driver.py (the fake must be found as libcuda.so.1 before pyfuser loads the driver).

Each check is a function named check_*; the script prints one JSON object mapping each check's
name to "ok" or the failure, plus the measured per-call costs under "timings_ns".
"""

from __future__ import annotations

import ctypes
import json
import sys
import timeit
import traceback
import types
from pathlib import Path


def _skip_package_inits() -> None:
    """Import pyfuser.runtime's modules without running the package __init__ files: those import
    torch, and a CUDA build of torch could bind libcuda.so.1 (here, the fake) as it loads."""
    root = Path(__file__).resolve().parents[2] / "pyfuser"
    for name, path in (("pyfuser", root), ("pyfuser.runtime", root / "runtime")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package


_skip_package_inits()

from pyfuser.runtime import launch as L  # noqa: E402
from pyfuser.runtime import tensor_map as T  # noqa: E402
from pyfuser.runtime import cuda_driver  # noqa: E402
from pyfuser.runtime.device import _bandwidth_gbps, cu_device  # noqa: E402
from pyfuser.runtime.nvrtc import compile_to_cubin  # noqa: E402

from cubin_params import kernel_params  # noqa: E402

STREAM = 0x1234
MAX_ATTRS = 8


class Record(ctypes.Structure):
    """Mirror of struct fake_record in fake_libcuda.c."""

    _fields_ = [
        ("launches", ctypes.c_long),
        ("via_ex", ctypes.c_int),
        ("via_extra", ctypes.c_int),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_uint64),
        ("function", ctypes.c_uint64),
        ("current_context", ctypes.c_uint64),
        ("num_attrs", ctypes.c_uint),
        ("attr_ids", ctypes.c_int * MAX_ATTRS),
        ("attr_values", (ctypes.c_uint * 3) * MAX_ATTRS),
        ("func_attr_values", ctypes.c_int * 32),
        ("func_attr_sets", ctypes.c_int),
        ("modules_loaded", ctypes.c_int),
        ("function_name", ctypes.c_char * 256),
        ("params", ctypes.c_ubyte * 4096),
        ("tensor_map_args", ctypes.c_uint64 * 16),
        ("occupancy_block", ctypes.c_int),
        ("occupancy_smem", ctypes.c_uint64),
        ("param_info_errors", ctypes.c_int),
    ]


FAKE = ctypes.CDLL("libcuda.so.1")
FAKE.fake_record.restype = ctypes.POINTER(Record)
RECORD = FAKE.fake_record().contents

SOURCE = r"""
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };
extern "C" __global__ void k(float* out, int n, const __grid_constant__ CUtensorMap map, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v + (float)map.opaque[0];
}
"""
LAYOUT = L.ParamLayout(["ptr", "i32", "tmap", "f32"])
TMAP = bytes(range(128))
VALUES = (0xDEAD_BEEF_0000, 1000, TMAP, 2.5)
KERNEL_PARAMS = [(0, 8), (8, 4), (48, 128), (176, 4)]  # what ptxas does for sm_90a
KERNEL_PARAM_BYTES = 180


def _set_fake_params(module) -> list[tuple[int, int]]:
    """Make the fake driver report (and honour) the parameter offsets that ptxas chose."""
    params = kernel_params(module.cubin, module.symbol)
    n = len(params)
    offsets = (ctypes.c_size_t * max(n, 1))(*(o for o, _ in params))
    sizes = (ctypes.c_size_t * max(n, 1))(*(s for _, s in params))
    FAKE.fake_set_params(n, offsets, sizes)
    return params


def _driver_side(values) -> bytes:
    """The parameter bytes as the kernel sees them: at the cubin's offsets, not ours."""
    out = bytearray(KERNEL_PARAM_BYTES)
    for (offset, size), kind, value in zip(KERNEL_PARAMS, LAYOUT.kinds, values):
        one = L.ParamLayout([kind]).pack([value])
        out[offset : offset + size] = one
    return bytes(out)


def _current_context() -> int:
    return cuda_driver.out_handle("cuCtxGetCurrent")


def _params(size: int) -> bytes:
    return bytes(RECORD.params[:size])


_KERNEL = None


def kernel() -> L.LoadedKernel:
    global _KERNEL
    if _KERNEL is None:
        module = compile_to_cubin(SOURCE, "k")
        assert _set_fake_params(module) == KERNEL_PARAMS, kernel_params(module.cubin, "k")
        _KERNEL = L.load(module, 0)
    return _KERNEL


def _raises(error_type, fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except error_type as error:
        return str(error)
    raise AssertionError(f"{fn.__name__} did not raise {error_type.__name__}")


# ---------------------------------------------------------------------------------------------


def check_load_once_and_restore_context():
    module = compile_to_cubin(SOURCE.replace("k(", "load_once("), "load_once")
    FAKE.fake_reset()
    FAKE.fake_clear_current()
    k = L.load(module, 0)
    assert RECORD.function_name == b"load_once", RECORD.function_name
    assert RECORD.modules_loaded == 1
    assert L.load(module, 0) is k and RECORD.modules_loaded == 1
    assert _current_context() == 0, "load must not leave its context current"


def check_param_info_matches_layout():
    FAKE.fake_reset()
    k = L._load(kernel().module, 0)
    # Counted with cuFuncGetParamCount: no query past the last parameter, which would be a
    # driver error in every compute-sanitizer report.
    assert RECORD.param_info_errors == 0, RECORD.param_info_errors
    assert k.param_offsets == (0, 8, 48, 176), k.param_offsets  # the cubin's (sm_90a) offsets
    assert k.pack_offsets == LAYOUT.offsets == (0, 8, 64, 192)  # ours
    assert k.param_size == 196 == LAYOUT.size
    k.check_layout(LAYOUT)
    message = _raises(L.LaunchError, k.check_layout, L.ParamLayout(["ptr", "i32", "f32"]))
    assert "sizes" in message
    _raises(L.LaunchError, k.check_layout, L.ParamLayout(["ptr", "i64", "tmap", "f32"]))


def check_plain_launch():
    k = kernel()
    FAKE.fake_reset()
    packed = LAYOUT.pack(VALUES)
    k.launch((3, 2, 1), (128, 1, 1), packed, stream_handle=STREAM)
    assert RECORD.launches == 1 and RECORD.via_ex == 0 and RECORD.via_extra == 0
    assert tuple(RECORD.grid) == (3, 2, 1) and tuple(RECORD.block) == (128, 1, 1)
    assert RECORD.stream == STREAM and RECORD.shared_mem == 0
    seen = _params(KERNEL_PARAM_BYTES)
    assert seen == _driver_side(VALUES), "the kernel would see different parameter bytes"
    assert seen[48:176] == TMAP


PLAIN_SOURCE = r"""
extern "C" __global__ void plain(float* out, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v;
}
"""
PLAIN_LAYOUT = L.ParamLayout(["ptr", "i32", "f32"])


def check_launcher_packs_into_the_staging_buffer():
    module = compile_to_cubin(PLAIN_SOURCE, "plain")
    assert _set_fake_params(module) == [(0, 8), (8, 4), (12, 4)]
    k = L.load(module, 0)
    streams = iter([STREAM, STREAM, STREAM + 16])
    saved, L._stream_getter = L._stream_getter, lambda index: next(streams)
    try:
        FAKE.fake_reset()
        launch_values = k.launcher((3, 2, 1), 128, PLAIN_LAYOUT, shared_mem=100_000)
        assert RECORD.func_attr_values[8] == 100_000 and RECORD.func_attr_sets == 1
        for n, stream in ((1000, STREAM), (7, STREAM), (5, STREAM + 16)):
            launch_values([0xBEEF_0000 + n, n, 0.5 * n])
            assert tuple(RECORD.grid) == (3, 2, 1) and tuple(RECORD.block) == (128, 1, 1)
            assert RECORD.stream == stream and RECORD.shared_mem == 100_000
            assert _params(16) == PLAIN_LAYOUT.pack([0xBEEF_0000 + n, n, 0.5 * n])
        assert RECORD.launches == 3 and RECORD.via_ex == 0 and RECORD.func_attr_sets == 1
    finally:
        L._stream_getter = saved
        _set_fake_params(kernel().module)      # the other checks' kernel again
    assert "tensor maps" in _raises(L.LaunchError, kernel().launcher, 1, 32, LAYOUT)
    assert "sizes" in _raises(L.LaunchError, k.launcher, 1, 32, LAYOUT)


def check_int_dims_and_bytearray():
    k = kernel()
    FAKE.fake_reset()
    k.launch(7, 256, bytearray(LAYOUT.pack(VALUES)), stream_handle=STREAM)
    assert tuple(RECORD.grid) == (7, 1, 1) and tuple(RECORD.block) == (256, 1, 1)
    assert _params(KERNEL_PARAM_BYTES) == _driver_side(VALUES)


def check_wrong_buffer_size():
    k = kernel()
    message = _raises(L.LaunchError, k.launch, 1, 32, b"\0" * 8, stream_handle=STREAM)
    assert "196" in message and "8 bytes" in message


def check_dynamic_smem_attribute_set_once():
    module = compile_to_cubin(SOURCE.replace("k(", "smem("), "smem")
    _set_fake_params(module)
    FAKE.fake_reset()
    k = L.load(module, 0)
    packed = LAYOUT.pack(VALUES)
    k.launch(1, 128, packed, shared_mem=40_000, stream_handle=STREAM)
    assert RECORD.func_attr_sets == 0, "no opt-in needed below 48 KB"
    k.launch(1, 128, packed, shared_mem=100_000, stream_handle=STREAM)
    k.launch(1, 128, packed, shared_mem=100_000, stream_handle=STREAM)
    k.launch(1, 128, packed, shared_mem=64_000, stream_handle=STREAM)
    assert RECORD.func_attr_values[8] == 100_000 and RECORD.func_attr_sets == 1
    assert RECORD.shared_mem == 64_000


def check_cluster_launch():
    k = kernel()
    FAKE.fake_reset()
    k.launch((4, 1, 1), (128, 1, 1), LAYOUT.pack(VALUES), cluster=(2, 1, 1),
             stream_handle=STREAM)
    assert RECORD.via_ex == 1 and RECORD.num_attrs == 1
    assert RECORD.attr_ids[0] == 4 and tuple(RECORD.attr_values[0]) == (2, 1, 1)
    assert tuple(RECORD.grid) == (4, 1, 1) and RECORD.stream == STREAM
    assert _params(KERNEL_PARAM_BYTES) == _driver_side(VALUES)
    assert RECORD.func_attr_sets == 0, "a portable cluster needs no attribute"


def check_non_portable_cluster():
    k = kernel()
    FAKE.fake_reset()
    k.launch((32, 1, 1), (128, 1, 1), LAYOUT.pack(VALUES), cluster=(16, 1, 1),
             stream_handle=STREAM)
    assert RECORD.func_attr_values[14] == 1 and tuple(RECORD.attr_values[0]) == (16, 1, 1)
    message = _raises(L.LaunchError, k.launch, (3, 1, 1), 128, LAYOUT.pack(VALUES),
                      cluster=(2, 1, 1), stream_handle=STREAM)
    assert "does not divide" in message


def check_cooperative_launch():
    k = kernel()
    FAKE.fake_reset()
    k.launch(132, 256, LAYOUT.pack(VALUES), cooperative=True, stream_handle=STREAM)
    assert RECORD.via_ex == 1 and RECORD.num_attrs == 1
    assert RECORD.attr_ids[0] == 2 and RECORD.attr_values[0][0] == 1
    FAKE.fake_reset()
    k.launch((8, 1, 1), 256, LAYOUT.pack(VALUES), cooperative=True, cluster=(2, 1, 1),
             stream_handle=STREAM + 16)
    assert RECORD.num_attrs == 2 and sorted(RECORD.attr_ids[:2]) == [2, 4]
    assert RECORD.stream == STREAM + 16, "configs are cached per stream"


def check_launch_error_names_result():
    k = kernel()
    FAKE.fake_fail_next_launch(701)
    message = _raises(L.LaunchError, k.launch, 1, 1024, LAYOUT.pack(VALUES),
                      stream_handle=STREAM)
    assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in message and "'k'" not in message
    assert message.startswith("k: cuLaunchKernel failed"), message


def check_context_retry():
    k = kernel()
    FAKE.fake_reset()
    FAKE.fake_clear_current()
    FAKE.fake_fail_next_launch(201)
    k.launch(1, 32, LAYOUT.pack(VALUES), stream_handle=STREAM)
    assert RECORD.launches == 2, "the launch is retried once"
    assert RECORD.current_context == int(k.context), "the retry runs in the kernel's context"
    assert _current_context() == 0, "the caller's context is restored"


def check_occupancy():
    k = kernel()
    assert L.occupancy(k, 256, 1024) == 8
    assert RECORD.occupancy_block == 256 and RECORD.occupancy_smem == 1024


def check_cluster_occupancy():
    # A cooperative grid of clusters is sized by the clusters that fit at once (the driver's
    # cuOccupancyMaxActiveClusters), asked with the kernel's block, shared memory and cluster.
    k = kernel()
    FAKE.fake_reset()
    FAKE.fake_set_max_clusters(61)
    assert L.cluster_occupancy(k, (512, 1, 1), 1024, (1, 2, 1)) == 61
    assert RECORD.launches == 0 and tuple(RECORD.block) == (512, 1, 1)
    assert RECORD.shared_mem == 1024 and tuple(RECORD.grid) == (1, 2, 1)
    assert RECORD.num_attrs == 1 and RECORD.attr_ids[0] == 4
    assert tuple(RECORD.attr_values[0]) == (1, 2, 1)
    FAKE.fake_set_max_clusters(5)


def check_tensor_map_encoding():
    data = T.encode_tiled(0x10000, "float32", (64, 32), (4, 256), (32, 8), swizzle=128,
                          l2_promotion=256, oob_fill="nan")
    words = list(memoryview(data).cast("Q"))
    assert len(data) == 128
    assert words[0] == 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
    assert words[1] == 2 and words[2] == 0x10000
    assert words[3:5] == [64, 32] and words[8] == 256
    assert list(data[104:108]) == [32, 0, 8, 0] and list(data[112:114]) == [1, 1]
    # CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    # CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA (cuda.h)
    expected = 3 << 8 | 3 << 16 | 1 << 24
    assert words[15] == expected, hex(words[15])
    message = _raises(T.TensorMapError, T.encode_tiled, 0x10008, "float32", (64,), (4,), (32,))
    assert "16-byte aligned" in message


def check_tile_map_l2_promotion():
    # A tile map's L2 promotion follows where its rows start: 256 bytes on 32-byte sectors, 128
    # mid-sector (a bf16 row of 1032 elements is 2064 bytes, 16 mod 32). A stand-in for a torch
    # tensor (this process runs without torch).
    from pyfuser.kir.nodes import TileBoxMap

    class Rows:
        dtype = "bfloat16"

        def __init__(self, rows, cols, pointer=0x10000):
            self.shape, self._strides, self._pointer = (rows, cols), (cols, 1), pointer

        def stride(self):
            return self._strides

        def data_ptr(self):
            return self._pointer

        def element_size(self):
            return 2
    tile = TileBoxMap("input", 0, 1, 0, 64, 64)
    for x, promotion in ((Rows(300, 1040), 3), (Rows(300, 1032), 2),    # L2_256B, L2_128B
                         (Rows(300, 1040, 0x10010), 2)):                # the pointer mid-sector
        words = list(memoryview(T.encode_tile_box(x, tile)).cast("Q"))
        assert words[15] >> 16 & 0xFF == promotion, (x.shape, hex(words[15]))


def check_device_bandwidth():
    gbps = _bandwidth_gbps(cu_device(0))
    assert gbps is not None and abs(gbps - 3352.3) < 1, gbps


# ---------------------------------------------------------------------------------------------


def timings() -> dict[str, float]:
    k = kernel()
    FAKE.fake_reset()
    packed = LAYOUT.pack(VALUES)
    staging = k._tls.staging
    env = dict(k=k, LAYOUT=LAYOUT, VALUES=VALUES, packed=packed, STREAM=STREAM,
               params=staging.kernel_params, stream=ctypes.c_void_p(STREAM))
    statements = {
        "pack": "LAYOUT.pack(VALUES)",
        "launch": "k.launch((3, 1, 1), (128, 1, 1), packed, stream_handle=STREAM)",
        "pack_and_launch": "k.launch((3, 1, 1), (128, 1, 1), LAYOUT.pack(VALUES), "
        "stream_handle=STREAM)",
        "cluster_launch": "k.launch((4, 1, 1), (128, 1, 1), packed, cluster=(2, 1, 1), "
        "stream_handle=STREAM)",
        "driver_call_only": "k._launch_kernel(k._function_pointer, 3, 1, 1, 128, 1, 1, 0, stream, "
        "params, None)",
    }
    timed = compile_to_cubin(PLAIN_SOURCE.replace("plain(", "timed("), "timed")
    _set_fake_params(timed)
    plain = L.load(timed, 0)
    saved, L._stream_getter = L._stream_getter, lambda index: STREAM
    env["launch_values"] = plain.launcher((3, 1, 1), (128, 1, 1), PLAIN_LAYOUT)
    env["PLAIN_VALUES"] = [0xDEAD_BEEF_0000, 1000, 2.5]
    statements["launcher"] = "launch_values(PLAIN_VALUES)"
    number = 20000
    result = {}
    for name, statement in statements.items():
        best = min(timeit.repeat(statement, globals=env, number=number, repeat=5))
        result[name] = round(best / number * 1e9)
    L._stream_getter = saved
    return result


def main() -> int:
    results = {}
    for name, fn in sorted(globals().items()):
        if name.startswith("check_") and callable(fn):
            try:
                fn()
                results[name] = "ok"
            except Exception:
                results[name] = traceback.format_exc()
    results["timings_ns"] = timings()
    results["torch_imported"] = "torch" in sys.modules
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
