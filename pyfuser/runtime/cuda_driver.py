"""The CUDA driver API through ctypes: the calls pyfuser makes, each resolved once.

Why not ``cuda.bindings.driver``: measured on the H100 machine (tools/host_parts_gpu.py),
importing it costs about 23 ms in a new process (it builds Python enum classes for the whole
API), and a launch through it about 4.8 us of host time, of which the driver's own work is the
smaller part. This module loads libcuda.so.1 (already loaded by PyTorch once CUDA is
initialised), resolves each entry point with ``cuGetProcAddress`` for one API version (so a
versioned symbol such as ``cuCtxPushCurrent_v2`` is picked as a CUDA 12.4 build would), and
calls it with ctypes. NVRTC still comes from ``cuda.bindings.nvrtc``: compiling is never on the
path of a cached kernel.

Handles (contexts, modules, functions, streams) are plain ints here. Every call but the launch
has a typed prototype; the launch (``launch_kernel``) has none, so that ctypes converts nothing
per call: its callers pass ``ctypes.c_void_p`` objects made once for the pointers and ints for
the dimensions (measured here, an untyped call of 11 arguments costs a third of a typed one).

Constants are the values of the CUDA 12/13 headers; tests/runtime/test_cuda_driver.py checks
them against cuda.bindings where it is installed, and the layouts of the launch structures
against cuda.h.
"""

from __future__ import annotations

import ctypes
import threading

__all__ = [
    "DriverError",
    "check",
    "result_name",
    "function",
    "optional_function",
    "launch_kernel",
    "LaunchAttribute",
    "LaunchConfig",
    "DEVICE_ATTRIBUTE",
    "FUNCTION_ATTRIBUTE",
    "LAUNCH_ATTRIBUTE_COOPERATIVE",
    "LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION",
]

LIBRARY = "libcuda.so.1"
# The API version entry points are resolved for: 12.4 is the first with cuFuncGetParamInfo.
API_VERSION = 12040

CUDA_SUCCESS = 0

DEVICE_ATTRIBUTE = {
    "MAX_THREADS_PER_BLOCK": 1,
    "WARP_SIZE": 10,
    "MAX_REGISTERS_PER_BLOCK": 12,
    "MULTIPROCESSOR_COUNT": 16,
    "MEMORY_CLOCK_RATE": 36,
    "GLOBAL_MEMORY_BUS_WIDTH": 37,
    "L2_CACHE_SIZE": 38,
    "MAX_THREADS_PER_MULTIPROCESSOR": 39,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 81,
    "MAX_REGISTERS_PER_MULTIPROCESSOR": 82,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 97,
}
FUNCTION_ATTRIBUTE = {
    "MAX_THREADS_PER_BLOCK": 0,
    "NUM_REGS": 4,
    "MAX_DYNAMIC_SHARED_SIZE_BYTES": 8,
    "NON_PORTABLE_CLUSTER_SIZE_ALLOWED": 14,
}
LAUNCH_ATTRIBUTE_COOPERATIVE = 2
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

# cuTensorMapEncodeTiled's enums, by the suffix of their names in cuda.h.
TENSOR_MAP_DATA_TYPE = {
    "UINT8": 0, "UINT16": 1, "UINT32": 2, "INT32": 3, "UINT64": 4, "INT64": 5, "FLOAT16": 6,
    "FLOAT32": 7, "FLOAT64": 8, "BFLOAT16": 9, "FLOAT32_FTZ": 10, "TFLOAT32": 11,
    "TFLOAT32_FTZ": 12,
}
TENSOR_MAP_INTERLEAVE_NONE = 0
TENSOR_MAP_SWIZZLE = {"NONE": 0, "32B": 1, "64B": 2, "128B": 3}
TENSOR_MAP_L2_PROMOTION = {"NONE": 0, "L2_64B": 1, "L2_128B": 2, "L2_256B": 3}
TENSOR_MAP_FLOAT_OOB_FILL = {"NONE": 0, "NAN_REQUEST_ZERO_FMA": 1}


class DriverError(RuntimeError):
    """A CUDA driver call failed (or the driver library is missing)."""


# ---------------------------------------------------------------------------------------------
# Launch structures (cuda.h, CUDA 12/13)
# ---------------------------------------------------------------------------------------------


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("clusterDim", _Dim3), ("cooperative", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id padded to 8 bytes, then a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", _LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig. `attrs` points into an array the owner keeps alive beside it."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def launch_config(grid, block, shared_mem: int, stream: int, attributes) -> LaunchConfig:
    """A CUlaunchConfig for dim3 `grid` and `block`; it keeps its attribute array alive."""
    config = LaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_mem
    config.hStream = stream or None
    array = (LaunchAttribute * max(len(attributes), 1))(*attributes)
    config.attrs = ctypes.cast(array, ctypes.POINTER(LaunchAttribute))
    config.numAttrs = len(attributes)
    config._attribute_array = array          # not a field: keeps the array alive
    return config


def cluster_attribute(cluster) -> LaunchAttribute:
    attribute = LaunchAttribute()
    attribute.id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dims = attribute.value.clusterDim
    dims.x, dims.y, dims.z = cluster
    return attribute


def cooperative_attribute() -> LaunchAttribute:
    attribute = LaunchAttribute()
    attribute.id = LAUNCH_ATTRIBUTE_COOPERATIVE
    attribute.value.cooperative = 1
    return attribute


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

_P, _I, _U, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_PP, _PI, _PS = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_S)
_PU32, _PU64 = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)

# Argument types of every typed entry point (all return CUresult).
_SIGNATURES = {
    "cuInit": (_U,),
    "cuGetErrorName": (_I, ctypes.POINTER(ctypes.c_char_p)),
    "cuDeviceGet": (_PI, _I),
    "cuDeviceGetAttribute": (_PI, _I, _I),
    "cuDevicePrimaryCtxRetain": (_PP, _I),
    "cuCtxGetCurrent": (_PP,),
    "cuCtxPushCurrent": (_P,),
    "cuCtxPopCurrent": (_PP,),
    "cuModuleLoadData": (_PP, ctypes.c_char_p),
    "cuModuleGetFunction": (_PP, _P, ctypes.c_char_p),
    "cuFuncGetAttribute": (_PI, _I, _P),
    "cuFuncSetAttribute": (_P, _I, _I),
    "cuFuncGetParamInfo": (_P, _S, _PS, _PS),
    "cuFuncGetParamCount": (_P, _PS),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": (_PI, _P, _I, _S),
    "cuOccupancyMaxActiveClusters": (_PI, _P, ctypes.POINTER(LaunchConfig)),
    "cuLaunchKernelEx": (ctypes.POINTER(LaunchConfig), _P, _P, _P),
    "cuTensorMapEncodeTiled": (_P, _I, ctypes.c_uint32, _P, _PU64, _PU64, _PU32, _PU32,
                               _I, _I, _I, _I),
}

_library = None
_functions: dict = {}
_lock = threading.Lock()


def _load_library():
    global _library
    if _library is None:
        try:
            library = ctypes.CDLL(LIBRARY)
        except OSError as error:
            raise DriverError(
                f"the CUDA driver library ({LIBRARY}) cannot be loaded: {error}. Running "
                "kernels needs an NVIDIA GPU and its driver; without one, the kernel-IR "
                "interpreter runs them on CPU tensors (options={'enable': ['interpret']})"
            ) from error
        get = library.cuGetProcAddress_v2
        get.restype = ctypes.c_int
        get.argtypes = (ctypes.c_char_p, _PP, ctypes.c_int, ctypes.c_uint64, _PI)
        _library = library
    return _library


def entry_point(name: str, version: int = API_VERSION, required: bool = True) -> int | None:
    """The address of driver function `name` for API `version`; None if the driver has none
    and not `required`."""
    library = _load_library()
    address, status = ctypes.c_void_p(), ctypes.c_int()
    code = library.cuGetProcAddress_v2(name.encode(), ctypes.byref(address), version, 0,
                                       ctypes.byref(status))
    if code != CUDA_SUCCESS or not address.value:
        if not required:
            return None
        raise DriverError(f"the CUDA driver has no {name} for API version {version} "
                          f"(cuGetProcAddress returned {code}, status {status.value}); "
                          "pyfuser needs a driver of CUDA 12.4 or later")
    return address.value


# Entry points newer than API_VERSION, used where the driver has them: name -> API version.
_OPTIONAL = {"cuFuncGetParamCount": 13000}
_MISSING = object()


def _resolved(name: str):
    """Driver function `name` typed by _SIGNATURES (of the API version in _OPTIONAL, else
    API_VERSION), or _MISSING for an optional one the driver lacks; resolved once."""
    fn = _functions.get(name)
    if fn is None:
        with _lock:
            fn = _functions.get(name)
            if fn is None:
                address = entry_point(name, _OPTIONAL.get(name, API_VERSION),
                                      required=name not in _OPTIONAL)
                fn = _functions[name] = _MISSING if address is None else ctypes.CFUNCTYPE(
                    ctypes.c_int, *_SIGNATURES[name])(address)
    return fn


def function(name: str):
    """Driver function `name`, typed by _SIGNATURES, resolved once."""
    return _resolved(name)


def optional_function(name: str):
    """Driver function `name` of _OPTIONAL, or None when the driver is older."""
    fn = _resolved(name)
    return None if fn is _MISSING else fn


_launch_kernel = None


def launch_kernel():
    """cuLaunchKernel, untyped: call it as f(function, gx, gy, gz, bx, by, bz, shared_mem,
    stream, kernel_params, None) with `function`, `stream` and `kernel_params` as
    ctypes.c_void_p and the rest as ints below 2**31. It returns the CUresult."""
    global _launch_kernel
    if _launch_kernel is None:
        _launch_kernel = ctypes.CFUNCTYPE(ctypes.c_int)(entry_point("cuLaunchKernel"))
    return _launch_kernel


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def result_name(code: int) -> str:
    """The CUresult's name ("CUDA_ERROR_INVALID_VALUE"), or "CUresult(n)"."""
    code = int(code)
    try:
        name = ctypes.c_char_p()
        if function("cuGetErrorName")(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode()
    except DriverError:
        pass
    return f"CUresult({code})"


def check(code: int, what: str, error: type[Exception] = DriverError) -> None:
    """Raise `error` naming `what` unless `code` is CUDA_SUCCESS."""
    if code != CUDA_SUCCESS:
        raise error(f"{what} failed with {result_name(code)}")


def call(name: str, *args, what: str | None = None, error: type[Exception] = DriverError):
    """Call typed driver function `name`, raising `error` on failure."""
    check(function(name)(*args), what or name, error)


def out_int(name: str, *args, what: str | None = None,
            error: type[Exception] = DriverError) -> int:
    """Call `name` whose first argument is an int it writes; return that int."""
    value = ctypes.c_int()
    call(name, ctypes.byref(value), *args, what=what, error=error)
    return value.value


def out_handle(name: str, *args, what: str | None = None,
               error: type[Exception] = DriverError) -> int:
    """Call `name` whose first argument is a handle (pointer) it writes; return it as an int
    (0 for a null handle)."""
    value = ctypes.c_void_p()
    call(name, ctypes.byref(value), *args, what=what, error=error)
    return value.value or 0
