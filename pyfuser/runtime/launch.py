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
* The driver is called through ctypes (cuda_driver.py: cuda.bindings costs milliseconds to
  import and microseconds per launch). The staging buffer is per thread because ctypes releases
  the GIL during the driver call, and per kernel so its pointer array never changes.
* Plain launches use ``cuLaunchKernel``. Cluster and cooperative launches need
  ``cuLaunchKernelEx``; its ``CUlaunchConfig`` costs microseconds to build, so configs are
  cached per (grid, block, shared memory, cluster, cooperative, stream) and never mutated.
* Function attributes (dynamic shared memory above the default 48 KB, non-portable cluster
  sizes) are set once, when a launch first needs them.
* The primary context (the one PyTorch uses) is retained per device. Modules are loaded with
  it pushed, so loading never changes the caller's current context. A launch that fails
  because another context is current is retried once with ours pushed.

``torch`` is imported lazily; libcuda.so.1 is loaded at the first driver call.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading

from . import cuda_driver as cu
from .cuda_driver import DriverError, result_name
from .device import cu_device
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
CUDA_ERROR_INVALID_VALUE = 1
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

_contexts: dict[int, int] = {}
_contexts_lock = threading.Lock()


def primary_context(device_index: int):
    """The device's primary context, retained once: the same context PyTorch uses."""
    with _contexts_lock:
        context = _contexts.get(device_index)
        if context is None:
            device = cu_device(device_index)
            context = cu.out_handle("cuDevicePrimaryCtxRetain", device, error=LaunchError)
            _contexts[device_index] = context
        return context


@contextlib.contextmanager
def context_pushed(context):
    """Make ``context`` current for the block and restore the caller's afterwards."""
    current = cu.out_handle("cuCtxGetCurrent", error=LaunchError)
    if current == context:
        yield
        return
    cu.call("cuCtxPushCurrent", context, error=LaunchError)
    try:
        yield
    finally:
        cu.out_handle("cuCtxPopCurrent", error=LaunchError)


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
    """A parameter buffer, the fixed array of pointers into it that the driver reads (as the
    c_void_p the untyped launch takes), and the last stream launched on, as a c_void_p."""

    __slots__ = ("buffer", "pointers", "address", "kernel_params", "stream", "stream_pointer")

    def __init__(self, offsets: tuple[int, ...], size: int):
        self.buffer = (ctypes.c_char * max(size, 1))()
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))
        self.address = ctypes.addressof(self.pointers) if offsets else 0
        self.kernel_params = ctypes.c_void_p(self.address or None)
        self.stream, self.stream_pointer = 0, ctypes.c_void_p()


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

    def __init__(self, module: CompiledModule, device_index: int, context: int, cu_module: int,
                 function: int):
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
        self._function_pointer = ctypes.c_void_p(function)
        self._launch_kernel = cu.launch_kernel()
        self._launch_kernel_ex = cu.function("cuLaunchKernelEx")

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
        if cluster is None and not cooperative:
            try:
                gx, gy, gz = grid
                bx, by, bz = block
            except (TypeError, ValueError):
                (gx, gy, gz), (bx, by, bz) = _dim3(grid), _dim3(block)
            if stream_handle != staging.stream:
                staging.stream, staging.stream_pointer = stream_handle, ctypes.c_void_p(
                    stream_handle or None)
            status = self._launch_kernel(
                self._function_pointer, gx, gy, gz, bx, by, bz, shared_mem,
                staging.stream_pointer, staging.kernel_params, None
            )
        else:
            config = self._config(grid, block, shared_mem, cluster, cooperative, stream_handle)
            status = self._launch_kernel_ex(ctypes.byref(config), self.function,
                                            staging.address, None)
        if status:
            self._recover(status, grid, block, staging, shared_mem, cluster, cooperative,
                          stream_handle)

    def launcher(self, grid, block, layout: ParamLayout, shared_mem: int = 0):
        """A plain launch of fixed shape on PyTorch's current stream, as `launch_values(values)`:
        `layout` packs the values straight into this thread's staging buffer, with no bytes
        object between. For a plan's cached call (no cluster, not cooperative; tensor maps
        take `launch`, which checks their size)."""
        self.check_layout(layout)
        if layout._tmap_indices:
            raise LaunchError(f"{self.name}: a launcher packs no tensor maps; use launch()")
        if shared_mem > self.dynamic_smem_limit:
            self._raise_smem_limit(shared_mem)
        (gx, gy, gz), (bx, by, bz) = _dim3(grid), _dim3(block)
        pack_into = layout._struct.pack_into
        tls, index, function = self._tls, self.device_index, self._function_pointer
        launch_kernel = self._launch_kernel

        def launch_values(values) -> None:
            stream_handle = _stream_getter(index)
            try:
                staging = tls.staging
            except AttributeError:
                staging = self._new_staging()
            pack_into(staging.buffer, 0, *values)
            if stream_handle != staging.stream:
                staging.stream, staging.stream_pointer = stream_handle, ctypes.c_void_p(
                    stream_handle or None)
            status = launch_kernel(function, gx, gy, gz, bx, by, bz, shared_mem,
                                   staging.stream_pointer, staging.kernel_params, None)
            if status:
                self._recover(status, grid, block, staging, shared_mem, None, False,
                              stream_handle)
        return launch_values

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
        with context_pushed(self.context):
            cu.call("cuFuncSetAttribute", self.function, cu.FUNCTION_ATTRIBUTE[name], value,
                    what=f"{self.name}: cuFuncSetAttribute({name}={value})", error=LaunchError)

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
        grid, block = _dim3(grid), _dim3(block)
        attributes = []
        if cluster is not None:
            attributes.append(self._cluster_attribute(grid, _dim3(cluster)))
        if cooperative:
            attributes.append(cu.cooperative_attribute())
        return cu.launch_config(grid, block, shared_mem, stream_handle, attributes)

    def _cluster_attribute(self, grid, cluster):
        if any(g % c for g, c in zip(grid, cluster)):
            raise LaunchError(f"{self.name}: cluster {cluster} does not divide grid {grid}")
        if cluster[0] * cluster[1] * cluster[2] > PORTABLE_CLUSTER_SIZE:
            if not self.non_portable_clusters:
                self._set_attribute("NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
                self.non_portable_clusters = True
        return cu.cluster_attribute(cluster)

    def _recover(self, status, grid, block, staging, shared_mem, cluster, cooperative, stream):
        """Retry once with our context current if another was; otherwise explain the error."""
        current = cu.out_handle("cuCtxGetCurrent", error=LaunchError)
        if result_name(status) in _CONTEXT_ERRORS and current != self.context:
            with context_pushed(self.context):
                status = self._issue(grid, block, staging, shared_mem, cluster, cooperative,
                                     stream)
            if not status:
                return
        raise LaunchError(self._describe(status, grid, block, shared_mem, cluster, cooperative))

    def _issue(self, grid, block, staging, shared_mem, cluster, cooperative, stream):
        if cluster is None and not cooperative:
            (gx, gy, gz), (bx, by, bz) = _dim3(grid), _dim3(block)
            return self._launch_kernel(
                self._function_pointer, gx, gy, gz, bx, by, bz, shared_mem,
                ctypes.c_void_p(stream or None), staging.kernel_params, None
            )
        config = self._config(grid, block, shared_mem, cluster, cooperative, stream)
        return self._launch_kernel_ex(ctypes.byref(config), self.function, staging.address,
                                      None)

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
    """(offsets, sizes) of every parameter, as recorded in the cubin (driver 12.4+). A driver
    whose cuGetProcAddress gives cuFuncGetParamCount for API 13.0 gives the count; otherwise
    (driver 580.159 on the H200 does not) the last query is past the last parameter, whose
    CUDA_ERROR_INVALID_VALUE memcheck lists as one API error per loaded kernel."""
    get = cu.function("cuFuncGetParamInfo")
    count_of = cu.optional_function("cuFuncGetParamCount")
    count = None
    if count_of is not None:
        n = ctypes.c_size_t()
        cu.check(count_of(function, ctypes.byref(n)), "cuFuncGetParamCount", LaunchError)
        count = n.value
    offsets, sizes = [], []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    while count is None or len(offsets) < count:
        status = get(function, len(offsets), ctypes.byref(offset), ctypes.byref(size))
        if status != cu.CUDA_SUCCESS:
            if status == CUDA_ERROR_INVALID_VALUE and count is None:   # past the last one
                break
            raise LaunchError(f"cuFuncGetParamInfo failed with {result_name(status)}")
        offsets.append(offset.value)
        sizes.append(size.value)
    return tuple(offsets), tuple(sizes)


def _int_attribute(function, name: str) -> int:
    return cu.out_int("cuFuncGetAttribute", cu.FUNCTION_ATTRIBUTE[name], function,
                      what=f"cuFuncGetAttribute({name})", error=LaunchError)


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
    context = primary_context(device_index)
    with context_pushed(context):
        cu_module = cu.out_handle(
            "cuModuleLoadData", module.cubin,
            what=f"cuModuleLoadData({module.symbol}, {module.arch} cubin, device {device_index})",
            error=LaunchError,
        )
        function = cu.out_handle("cuModuleGetFunction", cu_module, module.symbol.encode(),
                                 what=f"cuModuleGetFunction({module.symbol})", error=LaunchError)
        return LoadedKernel(module, device_index, context, cu_module, function)


def occupancy(kernel: LoadedKernel, block_threads: int, shared_mem: int = 0) -> int:
    """Blocks of ``kernel`` that fit on one SM at once; a cooperative grid may not exceed
    this times the SM count."""
    if shared_mem > kernel.dynamic_smem_limit:
        kernel._raise_smem_limit(shared_mem)
    with context_pushed(kernel.context):
        return cu.out_int("cuOccupancyMaxActiveBlocksPerMultiprocessor", kernel.function,
                          block_threads, shared_mem,
                          what=f"{kernel.name}: cuOccupancyMaxActiveBlocksPerMultiprocessor",
                          error=LaunchError)


def cluster_occupancy(kernel: LoadedKernel, block, shared_mem: int, cluster) -> int:
    """Clusters of ``cluster`` blocks of ``kernel`` that fit on the device at once. A GPC holds
    whole clusters only, so this can be less than occupancy() x SM count / cluster size; a
    cooperative grid of clusters may not exceed it times the cluster size."""
    if shared_mem > kernel.dynamic_smem_limit:
        kernel._raise_smem_limit(shared_mem)
    cluster = _dim3(cluster)
    # One cluster's worth of grid: the query needs a grid the cluster divides, nothing more.
    config = cu.launch_config(cluster, _dim3(block), shared_mem, 0,
                              [kernel._cluster_attribute(cluster, cluster)])
    with context_pushed(kernel.context):
        return cu.out_int("cuOccupancyMaxActiveClusters", kernel.function, ctypes.byref(config),
                          what=f"{kernel.name}: cuOccupancyMaxActiveClusters(cluster={cluster})",
                          error=LaunchError)
