"""Load cubins and launch kernels on PyTorch's current stream, with little Python per call.

Why this shape:

* Parameters travel as one packed buffer (``ParamLayout.pack``: one precompiled
  ``struct.Struct``, each value at its natural alignment, a tensor map at a multiple of 64).
  At launch the buffer is copied (one memcpy) into a per-thread staging buffer whose array of
  per-parameter pointers was built once; the driver gets that array as ``kernelParams`` and
  copies each parameter to wherever the cubin wants it.
* Why ``kernelParams`` and not one buffer through ``extra``/``CU_LAUNCH_PARAM_BUFFER_POINTER``:
  (1) the cubin's parameter offsets are not the natural ones on every architecture. On sm_90
  the parameter bank starts at 0x210, and ptxas aligns a 64-byte-aligned parameter (a
  CUtensorMap) in the bank, so ``k(float*, int, CUtensorMap)`` has the map at offset 48, not
  64 (on sm_100 and sm_120 the bank starts at 0x380 and the offset is 64). A buffer in
  ``extra`` would have to follow those offsets exactly; pointers need only the sizes.
  (2) Cooperative launches accept only ``kernelParams``. One path serves every launch.
* The staging buffer is per thread because cuda.bindings releases the GIL during the driver
  call, and per kernel so its pointer array never changes.
* Plain launches use ``cuLaunchKernel``. Cluster and cooperative launches need
  ``cuLaunchKernelEx``; its ``CUlaunchConfig`` costs microseconds to build, so configs are
  cached per (grid, block, shared memory, cluster, cooperative, stream) and never mutated.
* Function attributes (dynamic shared memory above the default 48 KB, non-portable cluster
  sizes) are set once, when a launch first needs them.
* The primary context (the one PyTorch uses) is retained per device. Modules are loaded with
  it pushed, so loading never changes the caller's current context. A launch that fails
  because another context is current is retried once with ours pushed.

``cuda.bindings`` and ``torch`` are imported lazily.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading

from .device import DriverError, check, cu_device, driver, result_name
from .nvrtc import CompiledModule

__all__ = [
    "LaunchError",
    "ParamLayout",
    "LoadedKernel",
    "load",
    "occupancy",
    "cluster_occupancy",
    "current_stream_handle",
    "primary_context",
]

DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024
PORTABLE_CLUSTER_SIZE = 8


class LaunchError(DriverError):
    """Loading or launching a kernel failed; the message names the CUresult and the launch."""


# ---------------------------------------------------------------------------------------------
# Parameter packing
# ---------------------------------------------------------------------------------------------

# kind -> (struct code, size, alignment), as the kernel's C parameter list lays them out.
_PARAM_KINDS = {
    "ptr": ("Q", 8, 8),
    "i64": ("q", 8, 8),
    "i32": ("i", 4, 4),
    "f32": ("f", 4, 4),
    "f64": ("d", 8, 8),
    "tmap": ("128s", 128, 64),  # const __grid_constant__ CUtensorMap, alignas(64)
}
TENSOR_MAP_BYTES = 128


def natural_alignment(size: int) -> int:
    """Host-side alignment of a parameter of ``size`` bytes in a packed buffer: the
    CUtensorMap's 64 for 128-byte values, else the largest power of two dividing the size (up
    to 16). It agrees with ``_PARAM_KINDS`` for every kind pyfuser generates."""
    if size == TENSOR_MAP_BYTES:
        return 64
    return min(size & -size, 16) if size > 0 else 1


def packing_offsets(sizes) -> tuple[tuple[int, ...], int]:
    """(offset of each parameter, total bytes) when packed at natural alignment."""
    offsets, cursor = [], 0
    for size in sizes:
        cursor += -cursor % natural_alignment(size)
        offsets.append(cursor)
        cursor += size
    return tuple(offsets), cursor


class ParamLayout:
    """Offsets of a kernel's parameters and a precompiled packer for their values.

    A 'tmap' value must be the 128 bytes of a CUtensorMap: ``struct`` would silently pad or
    cut a wrong-sized value, which the kernel would read as a corrupt descriptor.
    """

    __slots__ = ("kinds", "offsets", "sizes", "size", "_struct", "_tmap_indices")

    def __init__(self, kinds):
        self.kinds = tuple(kinds)
        unknown = [kind for kind in self.kinds if kind not in _PARAM_KINDS]
        if unknown:
            raise ValueError(f"unknown parameter kinds {unknown}; known: {sorted(_PARAM_KINDS)}")
        fmt, offsets, sizes, cursor = ["<"], [], [], 0
        for kind in self.kinds:
            code, size, align = _PARAM_KINDS[kind]
            padding = -cursor % align
            if padding:
                fmt.append(f"{padding}x")
            cursor += padding
            offsets.append(cursor)
            sizes.append(size)
            fmt.append(code)
            cursor += size
        self.offsets, self.sizes, self.size = tuple(offsets), tuple(sizes), cursor
        self._struct = struct.Struct("".join(fmt))
        self._tmap_indices = tuple(i for i, kind in enumerate(self.kinds) if kind == "tmap")

    def pack(self, values) -> bytes:
        for index in self._tmap_indices:
            if len(values[index]) != TENSOR_MAP_BYTES:
                self._check_tensor_maps(values)
        return self._struct.pack(*values)

    def pack_into(self, buffer, values) -> None:
        if self._tmap_indices:
            self._check_tensor_maps(values)
        self._struct.pack_into(buffer, 0, *values)

    def _check_tensor_maps(self, values) -> None:
        for index in self._tmap_indices:
            if len(values[index]) != TENSOR_MAP_BYTES:
                raise ValueError(
                    f"parameter {index} is a tensor map and needs {TENSOR_MAP_BYTES} bytes, "
                    f"got {len(values[index])}"
                )

    def __repr__(self) -> str:
        return f"ParamLayout({list(self.kinds)}, offsets={list(self.offsets)}, size={self.size})"


# ---------------------------------------------------------------------------------------------
# Contexts and streams
# ---------------------------------------------------------------------------------------------

_contexts: dict[int, object] = {}
_contexts_lock = threading.Lock()


def primary_context(device_index: int):
    """The device's primary context, retained once: the same context PyTorch uses."""
    with _contexts_lock:
        context = _contexts.get(device_index)
        if context is None:
            cu = driver()
            device = cu_device(device_index)
            context = check(
                cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain", LaunchError
            )
            _contexts[device_index] = context
        return context


@contextlib.contextmanager
def context_pushed(context):
    """Make ``context`` current for the block and restore the caller's afterwards."""
    cu = driver()
    current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent", LaunchError)
    if int(current) == int(context):
        yield
        return
    check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent", LaunchError)
    try:
        yield
    finally:
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent", LaunchError)


def _first_stream_getter(device_index: int) -> int:
    """Find the fastest way to read torch's current stream, install it, and use it.

    ``torch._C._cuda_getCurrentRawStream`` returns the raw handle without building a
    torch.cuda.Stream object (which costs microseconds); the public API is the fallback if the
    private one disappears."""
    global _stream_getter
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _stream_getter = raw or (lambda index: torch.cuda.current_stream(index).cuda_stream)
    return _stream_getter(device_index)


_stream_getter = _first_stream_getter


def current_stream_handle(device_index: int) -> int:
    """The raw cudaStream_t of PyTorch's current stream on ``device_index``."""
    return _stream_getter(device_index)


def _default_device_index() -> int:
    import torch

    return torch.cuda.current_device()


# ---------------------------------------------------------------------------------------------
# Per-thread staging of parameters
# ---------------------------------------------------------------------------------------------


class _Staging:
    """A parameter buffer and the fixed array of pointers into it that the driver reads."""

    __slots__ = ("buffer", "pointers", "address")

    def __init__(self, offsets: tuple[int, ...], size: int):
        self.buffer = (ctypes.c_char * max(size, 1))()
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self.pointers) if offsets else 0


def _dim3(value) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, 1, 1)
    dims = tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"a grid, block or cluster shape has 1 to 3 dims, got {value!r}")
    return dims + (1,) * (3 - len(dims))


# ---------------------------------------------------------------------------------------------
# Loaded kernels
# ---------------------------------------------------------------------------------------------

_CONTEXT_ERRORS = frozenset(
    ["CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_CONTEXT_IS_DESTROYED"]
)
_HINTS = {
    "CUDA_ERROR_INVALID_VALUE": "check block size, shared memory against the opt-in limit, "
    "cluster dims dividing the grid, and the parameter buffer",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or too much shared memory for "
    "this block size",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": "a cooperative grid may not exceed "
    "occupancy() x SM count blocks",
}


class LoadedKernel:
    """A kernel resident on one device, ready to launch."""

    def __init__(self, module: CompiledModule, device_index: int, context, cu_module, function):
        self.module = module
        self.device_index = device_index
        self.context = context
        self.cu_module = cu_module
        self.function = function
        # The cubin's own offsets (informative: they differ per architecture), and where each
        # parameter sits in the packed buffer that launch() takes.
        self.param_offsets, self.param_sizes = _param_info(function)
        self.pack_offsets, self.param_size = packing_offsets(self.param_sizes)
        self.dynamic_smem_limit = _int_attribute(function, "MAX_DYNAMIC_SHARED_SIZE_BYTES")
        self.non_portable_clusters = False
        self._configs: dict[tuple, object] = {}
        self._tls = threading.local()
        cu = driver()
        self._launch_kernel = cu.cuLaunchKernel
        self._launch_kernel_ex = cu.cuLaunchKernelEx

    @property
    def name(self) -> str:
        return self.module.symbol

    def check_layout(self, layout: ParamLayout) -> None:
        """Raise unless ``layout`` packs exactly the parameters the cubin declares (count and
        sizes); a mismatch would otherwise make the kernel read garbage, silently."""
        if tuple(layout.sizes) != self.param_sizes or tuple(layout.offsets) != self.pack_offsets:
            raise LaunchError(
                f"{self.name}: parameter layout {list(layout.kinds)} has sizes "
                f"{list(layout.sizes)}, but the kernel's parameters have sizes "
                f"{list(self.param_sizes)}"
            )

    # -- the hot path --------------------------------------------------------------------------

    def launch(
        self,
        grid,
        block,
        params_buffer,
        *,
        shared_mem: int = 0,
        cluster=None,
        cooperative: bool = False,
        stream_handle: int | None = None,
    ) -> None:
        if stream_handle is None:
            stream_handle = _stream_getter(self.device_index)
        if shared_mem > self.dynamic_smem_limit:
            self._raise_smem_limit(shared_mem)
        # Staging is inlined: this method is the per-call cost we promise to keep small.
        try:
            staging = self._tls.staging
        except AttributeError:
            staging = self._new_staging()
        if len(params_buffer) != self.param_size:
            self._wrong_size(params_buffer)
        staging.buffer.raw = params_buffer
        args = staging.address
        if cluster is None and not cooperative:
            try:
                gx, gy, gz = grid
                bx, by, bz = block
            except (TypeError, ValueError):
                (gx, gy, gz), (bx, by, bz) = _dim3(grid), _dim3(block)
            status = self._launch_kernel(
                self.function, gx, gy, gz, bx, by, bz, shared_mem, stream_handle, args, 0
            )[0]
        else:
            config = self._config(grid, block, shared_mem, cluster, cooperative, stream_handle)
            status = self._launch_kernel_ex(config, self.function, args, 0)[0]
        if status:
            self._recover(status, grid, block, args, shared_mem, cluster, cooperative,
                          stream_handle)

    def _new_staging(self) -> _Staging:
        staging = self._tls.staging = _Staging(self.pack_offsets, self.param_size)
        return staging

    def _wrong_size(self, params_buffer) -> None:
        raise LaunchError(
            f"{self.name}: parameter buffer has {len(params_buffer)} bytes, but the kernel's "
            f"parameters (sizes {list(self.param_sizes)}) pack into {self.param_size}"
        )

    # -- slower paths --------------------------------------------------------------------------

    def _raise_smem_limit(self, shared_mem: int) -> None:
        self._set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", shared_mem)
        self.dynamic_smem_limit = shared_mem

    def _set_attribute(self, name: str, value: int) -> None:
        cu = driver()
        attribute = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        with context_pushed(self.context):
            check(
                cu.cuFuncSetAttribute(self.function, attribute, value),
                f"{self.name}: cuFuncSetAttribute({name}={value})",
                LaunchError,
            )

    def _config(self, grid, block, shared_mem, cluster, cooperative, stream_handle):
        key = (grid, block, shared_mem, cluster, cooperative, stream_handle)
        try:
            return self._configs[key]
        except (KeyError, TypeError):
            pass
        config = self._new_config(grid, block, shared_mem, cluster, cooperative, stream_handle)
        if len(self._configs) > 256:
            self._configs.clear()
        try:
            self._configs[key] = config
        except TypeError:  # a list among the dims: unhashable, just not cached
            pass
        return config

    def _new_config(self, grid, block, shared_mem, cluster, cooperative, stream_handle):
        cu = driver()
        grid, block = _dim3(grid), _dim3(block)
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared_mem
        config.hStream = cu.CUstream(stream_handle)
        attributes = []
        if cluster is not None:
            attributes.append(self._cluster_attribute(grid, _dim3(cluster)))
        if cooperative:
            attribute = cu.CUlaunchAttribute()
            attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attribute.value.cooperative = 1
            attributes.append(attribute)
        config.attrs = attributes
        config.numAttrs = len(attributes)
        return config

    def _cluster_attribute(self, grid, cluster):
        cu = driver()
        if any(g % c for g, c in zip(grid, cluster)):
            raise LaunchError(f"{self.name}: cluster {cluster} does not divide grid {grid}")
        if cluster[0] * cluster[1] * cluster[2] > PORTABLE_CLUSTER_SIZE:
            if not self.non_portable_clusters:
                self._set_attribute("NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
                self.non_portable_clusters = True
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dims = attribute.value.clusterDim
        dims.x, dims.y, dims.z = cluster
        return attribute

    def _recover(self, status, grid, block, args, shared_mem, cluster, cooperative, stream):
        """Retry once with our context current if another was; otherwise explain the error."""
        cu = driver()
        current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent", LaunchError)
        if result_name(status) in _CONTEXT_ERRORS and int(current) != int(self.context):
            with context_pushed(self.context):
                status = self._issue(grid, block, args, shared_mem, cluster, cooperative, stream)
            if not status:
                return
        raise LaunchError(self._describe(status, grid, block, shared_mem, cluster, cooperative))

    def _issue(self, grid, block, args, shared_mem, cluster, cooperative, stream):
        if cluster is None and not cooperative:
            (gx, gy, gz), (bx, by, bz) = _dim3(grid), _dim3(block)
            return self._launch_kernel(
                self.function, gx, gy, gz, bx, by, bz, shared_mem, stream, args, 0
            )[0]
        config = self._config(grid, block, shared_mem, cluster, cooperative, stream)
        return self._launch_kernel_ex(config, self.function, args, 0)[0]

    def _describe(self, status, grid, block, shared_mem, cluster, cooperative) -> str:
        name = result_name(status)
        call = "cuLaunchKernelEx" if cluster is not None or cooperative else "cuLaunchKernel"
        text = (
            f"{self.name}: {call} failed with {name} (grid={grid}, block={block}, "
            f"shared_mem={shared_mem}, cluster={cluster}, cooperative={cooperative}, "
            f"device={self.device_index}; {self.module.ptxas.summary()})"
        )
        hint = _HINTS.get(name)
        return f"{text}: {hint}" if hint else text

    def __repr__(self) -> str:
        return f"LoadedKernel({self.name!r}, device={self.device_index})"


def _param_info(function) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of every parameter, as recorded in the cubin (driver 12.4+)."""
    cu = driver()
    offsets, sizes = [], []
    while True:
        returned = cu.cuFuncGetParamInfo(function, len(offsets))
        if returned[0] != cu.CUresult.CUDA_SUCCESS:
            if returned[0] == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
                return tuple(offsets), tuple(sizes)
            raise LaunchError(f"cuFuncGetParamInfo failed with {result_name(returned[0])}")
        offsets.append(int(returned[1]))
        sizes.append(int(returned[2]))


def _int_attribute(function, name: str) -> int:
    cu = driver()
    attribute = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    value = check(cu.cuFuncGetAttribute(attribute, function), f"cuFuncGetAttribute({name})",
                  LaunchError)
    return int(value)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

_loaded: dict[tuple, LoadedKernel] = {}
_loaded_lock = threading.Lock()


def load(module: CompiledModule, device_index: int | None = None) -> LoadedKernel:
    """The kernel of ``module`` loaded on ``device_index`` (default: torch's current device),
    loaded once per (cubin, kernel, device)."""
    if device_index is None:
        device_index = _default_device_index()
    # bytes cache their hash, so keying on the cubin itself is cheap after the first call.
    key = (module.cubin, module.symbol, device_index)
    with _loaded_lock:
        kernel = _loaded.get(key)
        if kernel is None:
            kernel = _loaded[key] = _load(module, device_index)
    return kernel


def _load(module: CompiledModule, device_index: int) -> LoadedKernel:
    cu = driver()
    context = primary_context(device_index)
    with context_pushed(context):
        cu_module = check(
            cu.cuModuleLoadData(module.cubin),
            f"cuModuleLoadData({module.symbol}, {module.arch} cubin, device {device_index})",
            LaunchError,
        )
        function = check(
            cu.cuModuleGetFunction(cu_module, module.symbol.encode()),
            f"cuModuleGetFunction({module.symbol})",
            LaunchError,
        )
        return LoadedKernel(module, device_index, context, cu_module, function)


def occupancy(kernel: LoadedKernel, block_threads: int, shared_mem: int = 0) -> int:
    """Blocks of ``kernel`` that fit on one SM at once; a cooperative grid may not exceed
    this times the SM count."""
    if shared_mem > kernel.dynamic_smem_limit:
        kernel._raise_smem_limit(shared_mem)
    cu = driver()
    with context_pushed(kernel.context):
        blocks = check(
            cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                kernel.function, block_threads, shared_mem
            ),
            f"{kernel.name}: cuOccupancyMaxActiveBlocksPerMultiprocessor",
            LaunchError,
        )
    return int(blocks)


def cluster_occupancy(kernel: LoadedKernel, block, shared_mem: int, cluster) -> int:
    """Clusters of ``cluster`` blocks of ``kernel`` that fit on the device at once. A GPC holds
    whole clusters only, so this can be less than occupancy() x SM count / cluster size; a
    cooperative grid of clusters may not exceed it times the cluster size."""
    if shared_mem > kernel.dynamic_smem_limit:
        kernel._raise_smem_limit(shared_mem)
    cu = driver()
    cluster = _dim3(cluster)
    config = cu.CUlaunchConfig()
    # One cluster's worth of grid: the query needs a grid the cluster divides, nothing more.
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster
    config.blockDimX, config.blockDimY, config.blockDimZ = _dim3(block)
    config.sharedMemBytes = shared_mem
    config.hStream = cu.CUstream(0)
    attributes = [kernel._cluster_attribute(cluster, cluster)]
    config.attrs = attributes
    config.numAttrs = len(attributes)
    with context_pushed(kernel.context):
        clusters = check(
            cu.cuOccupancyMaxActiveClusters(kernel.function, config),
            f"{kernel.name}: cuOccupancyMaxActiveClusters(cluster={cluster})",
            LaunchError,
        )
    return int(clusters)
