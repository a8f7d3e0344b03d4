"""The two-level kernel cache: memory, disk (across processes), and damaged files."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from pyfuser.runtime import kernel_cache  # noqa: E402
from pyfuser.runtime.kernel_cache import (  # noqa: E402
    cache_dir,
    cache_key,
    clear_memory_cache,
    disk_cache_enabled,
    entry_path,
    get_or_compile,
)

REPO = Path(__file__).resolve().parents[2]

SOURCE = r"""
extern "C" __global__ void cached(float* out, int n) {
  __shared__ float s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i;
  __syncthreads();
  if (i < n) out[i] = s[255 - threadIdx.x];
}
"""


pytestmark = pytest.mark.usefixtures("isolated_cache")   # tests/conftest.py


def _path():
    return entry_path(cache_key(SOURCE, "cached", arch="sm_90a", options=()))


def test_cache_dir_and_switch_read_the_environment_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.delenv("PYFUSER_CACHE_DIR")
    assert cache_dir() == Path("~/.cache/pyfuser").expanduser()
    assert disk_cache_enabled()
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    assert not disk_cache_enabled()


def test_compiled_then_memory_then_disk():
    first, kind = get_or_compile(SOURCE, "cached")
    assert kind == "compiled"
    again, kind = get_or_compile(SOURCE, "cached")
    assert kind == "memory" and again is first
    clear_memory_cache()
    restored, kind = get_or_compile(SOURCE, "cached")
    assert kind == "disk"
    assert restored == first, "a disk hit restores the whole module, ptxas report included"
    assert restored.ptxas.static_smem_bytes == 1024 and restored.ptxas.barriers == 1


def test_disk_hit_in_a_second_process(isolated_cache):
    module, kind = get_or_compile(SOURCE, "cached")
    assert kind == "compiled"
    script = textwrap.dedent(
        f"""
        from pyfuser.runtime.kernel_cache import get_or_compile
        module, kind = get_or_compile({SOURCE!r}, "cached")
        print(kind, module.ptxas.registers, len(module.cubin))
        """
    )
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(isolated_cache))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["disk", str(module.ptxas.registers), str(len(module.cubin))]


def test_key_changes_with_every_input():
    base = cache_key(SOURCE, "cached", arch="sm_90a", options=())
    assert base == cache_key(SOURCE, "cached", arch="sm_90a", options=())
    assert base != cache_key(SOURCE + " ", "cached", arch="sm_90a", options=())
    assert base != cache_key(SOURCE, "other", arch="sm_90a", options=())
    assert base != cache_key(SOURCE, "cached", arch="sm_100a", options=())
    assert base != cache_key(SOURCE, "cached", arch="sm_90a", options=("-G",))


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "empty", "flipped_byte", "other_source"],
)
def test_damaged_entry_is_recompiled_and_replaced(damage):
    module, _ = get_or_compile(SOURCE, "cached")
    path = _path()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a kernel at all")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "flipped_byte":
        path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:  # an intact entry whose key collides with a different kernel
        other, _ = get_or_compile(SOURCE.replace("255", "254"), "cached")
        path.write_bytes(kernel_cache._serialize(other))
    clear_memory_cache()
    again, kind = get_or_compile(SOURCE, "cached")
    assert kind == "compiled"
    assert again.cubin == module.cubin and again.ptxas == module.ptxas  # the log's timing differs
    clear_memory_cache()
    assert get_or_compile(SOURCE, "cached")[1] == "disk", "the bad file was overwritten"


def test_unreadable_entry_is_a_miss_and_unwritable_cache_only_warns():
    path = _path()
    path.mkdir(parents=True)  # a directory where the file should be: reading and replacing fail
    with pytest.warns(UserWarning, match="could not write kernel cache entry"):
        module, kind = get_or_compile(SOURCE, "cached")
    assert kind == "compiled" and module.cubin[:4] == b"\x7fELF"


def test_cache_dir_that_is_a_file_only_warns(monkeypatch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning):
        assert get_or_compile(SOURCE, "cached")[1] == "compiled"


def test_disk_cache_can_be_disabled(monkeypatch, isolated_cache):
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    assert get_or_compile(SOURCE, "cached")[1] == "compiled"
    assert not isolated_cache.exists()
    clear_memory_cache()
    assert get_or_compile(SOURCE, "cached")[1] == "compiled"


def test_writes_leave_no_temporary_files(isolated_cache):
    get_or_compile(SOURCE, "cached")
    get_or_compile(SOURCE.replace("255", "254"), "cached")
    files = [p for p in isolated_cache.rglob("*") if p.is_file()]
    entries = [p for p in files if p.suffix == ".pfk"]
    # Besides the two entries: the memo of the NVRTC file found (kernel_cache._NVRTC_MEMO).
    assert len(entries) == 2 and sorted(p.name for p in files if p not in entries) == \
        ["nvrtc-library.json"]
    assert not [p for p in files if "tmp" in p.name]
