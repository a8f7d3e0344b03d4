"""Device properties: the Hopper table (CPU) and, on a GPU, the live query against it."""

import dataclasses

import pytest

from pyfuser.runtime.device import (
    DEVICE_TABLE,
    DeviceProperties,
    cuda_available,
    get_device_properties,
    query_device,
)


def test_hopper_table_numbers():
    h100, h200 = DEVICE_TABLE["h100"], DEVICE_TABLE["h200"]
    for device in (h100, h200):
        assert device.sm_count == 132 and device.compute_capability == (9, 0)
        assert device.max_shared_memory_per_block_optin == 232448 == 227 * 1024
        assert device.shared_memory_per_sm == 233472 == 228 * 1024
        assert device.registers_per_sm == 65536 and device.registers_per_block == 65536
        assert device.max_threads_per_block == 1024 and device.max_cluster_size == 8
        assert device.arch == "sm_90a"
    assert h100.l2_bytes == 50 * 1024 * 1024 and h200.l2_bytes == 60 * 1024 * 1024
    assert h200.memory_bandwidth_gbps > h100.memory_bandwidth_gbps > 3000


def test_properties_are_frozen_and_hashable():
    device = DEVICE_TABLE["h100"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.sm_count = 1
    assert {device: 1}[DEVICE_TABLE["h100"]] == 1


def test_lookup_by_name():
    assert get_device_properties("H200") is DEVICE_TABLE["h200"]
    with pytest.raises(KeyError, match="known"):
        get_device_properties("a100")


@pytest.mark.skipif(cuda_available(), reason="checks the fallback used without a GPU")
def test_default_without_gpu_is_h100():
    assert get_device_properties() is DEVICE_TABLE["h100"]


def test_arch_of_other_generations():
    older = dataclasses.replace(DEVICE_TABLE["h100"], major=8, minor=0)
    newer = dataclasses.replace(DEVICE_TABLE["h100"], major=10, minor=0)
    assert older.arch == "sm_80" and newer.arch == "sm_100a"


def _table_entry_for(name: str) -> DeviceProperties | None:
    for key, entry in DEVICE_TABLE.items():
        if key.upper() in name.upper():
            return entry
    return None


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_live_query_agrees_with_the_table():
    live = query_device(0)
    assert isinstance(live, DeviceProperties)
    assert get_device_properties() == query_device(__import__("torch").cuda.current_device())
    entry = _table_entry_for(live.name)
    if entry is None:
        pytest.skip(f"no table entry for {live.name}")
    for field in ("sm_count", "major", "minor", "max_threads_per_block",
                  "max_shared_memory_per_block_optin", "shared_memory_per_sm",
                  "registers_per_sm", "registers_per_block", "l2_bytes", "max_threads_per_sm",
                  "warp_size"):
        assert getattr(live, field) == getattr(entry, field), field
    if live.memory_bandwidth_gbps is not None:  # CUDA 13 may not report the memory clock
        assert 0.8 < live.memory_bandwidth_gbps / entry.memory_bandwidth_gbps < 1.25
