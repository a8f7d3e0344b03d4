"""What the schedulers need to know about a GPU, from a table or from the live device.

Why a table: heuristics (threads per block, stages of a circular buffer, persistent grid size,
whether a row fits in shared memory) must be testable on a machine without a GPU, and must give
the same answer for the same device model. The live query exists so that the executor can pick
the entry for the GPU it actually runs on, and so that tests can check the table against it.

The live query goes through cuda_driver.py (the driver API through ctypes), as do the device
helpers (cuInit once, a device handle) that launch.py and tensor_map.py share.
"""

from __future__ import annotations

import dataclasses
import functools

from . import cuda_driver
from .cuda_driver import DriverError

__all__ = [
    "DeviceProperties",
    "DEVICE_TABLE",
    "DriverError",
    "query_device",
    "get_device_properties",
    "cuda_available",
    "supported_arch",
]

PORTABLE_CLUSTER_SIZE = 8


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    sm_count: int
    major: int
    minor: int
    max_threads_per_block: int
    max_shared_memory_per_block_optin: int
    shared_memory_per_sm: int
    registers_per_sm: int
    registers_per_block: int
    l2_bytes: int
    max_cluster_size: int = PORTABLE_CLUSTER_SIZE
    memory_bandwidth_gbps: float | None = None
    max_threads_per_sm: int = 2048
    warp_size: int = 32

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def arch(self) -> str:
        """The NVRTC target: the architecture-specific variant ('a') from Hopper on, because
        wgmma, setmaxnreg and the TMA multicast forms exist only there."""
        suffix = "a" if self.major >= 9 else ""
        return f"sm_{self.major}{self.minor}{suffix}"


_HOPPER_COMMON = dict(
    sm_count=132,
    major=9,
    minor=0,
    max_threads_per_block=1024,
    max_shared_memory_per_block_optin=232448,  # 227 KiB
    shared_memory_per_sm=233472,  # 228 KiB
    registers_per_sm=65536,
    registers_per_block=65536,
    max_cluster_size=PORTABLE_CLUSTER_SIZE,
    max_threads_per_sm=2048,
)

# Peak bandwidths are the data-sheet figures (H100 SXM5 HBM3 3.35 TB/s, H200 HBM3e 4.8 TB/s);
# a device-to-device copy measures about 90% of them.
DEVICE_TABLE: dict[str, DeviceProperties] = {
    "h100": DeviceProperties(
        name="NVIDIA H100 80GB HBM3",
        l2_bytes=52428800,
        memory_bandwidth_gbps=3350.0,
        **_HOPPER_COMMON,
    ),
    "h200": DeviceProperties(
        name="NVIDIA H200",
        l2_bytes=62914560,
        memory_bandwidth_gbps=4800.0,
        **_HOPPER_COMMON,
    ),
}

# The H100's per-SM limits on 4 SMs: what `interpret` schedules for by default, so that
# persistent and cooperative grids stay small enough to run on the CPU.
DEVICE_TABLE["h100-4sm"] = dataclasses.replace(DEVICE_TABLE["h100"], name="H100 (4 SMs)",
                                               sm_count=4)

DEFAULT_DEVICE = "h100"
INTERPRET_DEVICE = "h100-4sm"


def supported_arch(props: DeviceProperties) -> bool:
    """Whether pyfuser generates kernels for this device: its compute capability has an entry
    in the table (every heuristic is tuned on, and every kernel written for, those chips)."""
    return any(e.compute_capability == props.compute_capability for e in DEVICE_TABLE.values())


# ---------------------------------------------------------------------------------------------
# Driver helpers shared by launch.py and tensor_map.py (the calls are in cuda_driver.py)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def init_driver() -> None:
    cuda_driver.call("cuInit", 0)


def cu_device(index: int) -> int:
    init_driver()
    return cuda_driver.out_int("cuDeviceGet", index, what=f"cuDeviceGet({index})")


def _attribute(device: int, name: str) -> int:
    """Device attribute CU_DEVICE_ATTRIBUTE_<name>."""
    return cuda_driver.out_int("cuDeviceGetAttribute", cuda_driver.DEVICE_ATTRIBUTE[name], device,
                               what=f"cuDeviceGetAttribute({name})")


# ---------------------------------------------------------------------------------------------
# Live query
# ---------------------------------------------------------------------------------------------


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _bandwidth_gbps(device) -> float | None:
    """Peak DRAM bandwidth from memory clock (kHz) x bus width (bits) x 2 (double data rate).

    CUDA 13 deprecates the memory-clock attribute, so a failure here is not an error."""
    try:
        clock_khz = _attribute(device, "MEMORY_CLOCK_RATE")
        bus_bits = _attribute(device, "GLOBAL_MEMORY_BUS_WIDTH")
    except DriverError:
        return None
    if clock_khz <= 0 or bus_bits <= 0:
        return None
    return 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9


@functools.lru_cache(maxsize=None)
def query_device(index: int = 0) -> DeviceProperties:
    import torch

    props = torch.cuda.get_device_properties(index)
    device = cu_device(index)
    return DeviceProperties(
        name=props.name,
        sm_count=props.multi_processor_count,
        major=props.major,
        minor=props.minor,
        max_threads_per_block=_attribute(device, "MAX_THREADS_PER_BLOCK"),
        max_shared_memory_per_block_optin=_attribute(device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        shared_memory_per_sm=_attribute(device, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        registers_per_sm=_attribute(device, "MAX_REGISTERS_PER_MULTIPROCESSOR"),
        registers_per_block=_attribute(device, "MAX_REGISTERS_PER_BLOCK"),
        l2_bytes=_attribute(device, "L2_CACHE_SIZE"),
        max_cluster_size=PORTABLE_CLUSTER_SIZE,
        memory_bandwidth_gbps=_bandwidth_gbps(device),
        max_threads_per_sm=_attribute(device, "MAX_THREADS_PER_MULTIPROCESSOR"),
        warp_size=_attribute(device, "WARP_SIZE"),
    )


def get_device_properties(name_or_index: str | int | None = None) -> DeviceProperties:
    """A table entry by name ('h100', 'h200'), the live device by index, or by default the
    current device when CUDA is available and the default table entry otherwise."""
    if isinstance(name_or_index, str):
        key = name_or_index.lower()
        if key not in DEVICE_TABLE:
            raise KeyError(f"unknown device {name_or_index!r}; known: {sorted(DEVICE_TABLE)}")
        return DEVICE_TABLE[key]
    if isinstance(name_or_index, int):
        return query_device(name_or_index)
    if cuda_available():
        import torch

        return query_device(torch.cuda.current_device())
    return DEVICE_TABLE[DEFAULT_DEVICE]
