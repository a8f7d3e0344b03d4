"""pyfuser.runtime.cuda_driver: the driver API through ctypes.

Its constants and launch structures are written out by hand; these tests check them against
cuda.bindings (where installed) and against cuda.h compiled by the C compiler (where both are
found), and that no pyfuser module imports cuda.bindings.driver again. The calls themselves are
checked against the recording fake driver (test_launch_fake_driver.py) and on the GPU."""

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyfuser.runtime import cuda_driver as cu

REPO = Path(__file__).resolve().parents[2]


def test_constants_match_cuda_bindings():
    bindings = pytest.importorskip("cuda.bindings.driver")
    for name, value in cu.DEVICE_ATTRIBUTE.items():
        assert int(getattr(bindings.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")) == value
    for name, value in cu.FUNCTION_ATTRIBUTE.items():
        assert int(getattr(bindings.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")) == value
    ids = bindings.CUlaunchAttributeID
    assert int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE) == cu.LAUNCH_ATTRIBUTE_COOPERATIVE
    assert int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) == cu.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    tables = [
        (cu.TENSOR_MAP_DATA_TYPE, bindings.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_"),
        (cu.TENSOR_MAP_SWIZZLE, bindings.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_"),
        (cu.TENSOR_MAP_L2_PROMOTION, bindings.CUtensorMapL2promotion,
         "CU_TENSOR_MAP_L2_PROMOTION_"),
        (cu.TENSOR_MAP_FLOAT_OOB_FILL, bindings.CUtensorMapFloatOOBfill,
         "CU_TENSOR_MAP_FLOAT_OOB_FILL_"),
    ]
    for table, enum, prefix in tables:
        for name, value in table.items():
            assert int(getattr(enum, prefix + name)) == value, prefix + name
    assert int(bindings.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE) == \
        cu.TENSOR_MAP_INTERLEAVE_NONE
    assert int(bindings.CUresult.CUDA_ERROR_INVALID_VALUE) == 1    # launch.py's end of params


def test_launch_structure_layout():
    """CUlaunchAttribute: a 4-byte id padded to 8, then a 64-byte union; CUlaunchConfig: seven
    unsigned ints, then (8-aligned) the stream, the attribute pointer and their count."""
    assert ctypes.sizeof(cu.LaunchAttribute) == 72 and cu.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(cu.LaunchConfig) == 56
    offsets = [cu.LaunchConfig.hStream.offset, cu.LaunchConfig.attrs.offset,
               cu.LaunchConfig.numAttrs.offset]
    assert offsets == [32, 40, 48]


def _cuda_header() -> Path | None:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    roots += sorted(str(p) for p in Path("/usr/local").glob("cuda-*"))
    for root in filter(None, roots):
        header = Path(root) / "include" / "cuda.h"
        if header.is_file():
            return header
    return None


def test_launch_structure_layout_against_cuda_h(tmp_path):
    header, compiler = _cuda_header(), shutil.which("cc") or shutil.which("gcc")
    if header is None or compiler is None:
        pytest.skip("needs cuda.h and a C compiler")
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\n"
        "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %d %d\\n\", "
        "sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value), "
        "sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), "
        "offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs), "
        "(int)CU_LAUNCH_ATTRIBUTE_COOPERATIVE, (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION); }\n")
    binary = tmp_path / "layout"
    subprocess.run([compiler, f"-I{header.parent}", "-o", str(binary), str(source)], check=True)
    printed = [int(v) for v in subprocess.run([str(binary)], capture_output=True, text=True,
                                              check=True).stdout.split()]
    ours = [ctypes.sizeof(cu.LaunchAttribute), cu.LaunchAttribute.value.offset,
            ctypes.sizeof(cu.LaunchConfig), cu.LaunchConfig.hStream.offset,
            cu.LaunchConfig.attrs.offset, cu.LaunchConfig.numAttrs.offset,
            cu.LAUNCH_ATTRIBUTE_COOPERATIVE, cu.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]
    assert printed == ours


def test_launch_config_keeps_its_attributes():
    config = cu.launch_config((4, 2, 1), (128, 1, 1), 1024, 0x1234,
                              [cu.cluster_attribute((2, 1, 1)), cu.cooperative_attribute()])
    assert (config.gridDimX, config.gridDimY, config.blockDimX, config.sharedMemBytes) == \
        (4, 2, 128, 1024)
    assert config.hStream == 0x1234 and config.numAttrs == 2
    first, second = config.attrs[0], config.attrs[1]
    assert first.id == cu.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (first.value.clusterDim.x, first.value.clusterDim.y) == (2, 1)
    assert second.id == cu.LAUNCH_ATTRIBUTE_COOPERATIVE and second.value.cooperative == 1
    assert cu.launch_config((1, 1, 1), (1, 1, 1), 0, 0, []).hStream is None


def test_no_module_imports_cuda_bindings_driver():
    """Importing it costs a new process about 23 ms (H100 machine): the runtime calls libcuda
    through cuda_driver.py instead. (cuda.bindings.nvrtc imports it, but only compiling does.)"""
    pattern = re.compile(r"^\s*(from\s+cuda\.bindings\s+import\s+.*\bdriver\b|"
                         r"import\s+cuda\.bindings\.driver|from\s+cuda\.bindings\.driver\s)", re.M)
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "pyfuser").rglob("*.py")
                 if pattern.search(p.read_text())]
    assert offenders == []


def test_missing_driver_library_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cu, "LIBRARY", "libcuda-that-does-not-exist.so.1")
    monkeypatch.setattr(cu, "_library", None)
    monkeypatch.setattr(cu, "_functions", {})
    with pytest.raises(cu.DriverError, match="cannot be loaded.*interpreter"):
        cu.function("cuInit")
