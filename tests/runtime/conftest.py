"""Make the helper modules beside these tests (cubin_params, runtime_gpu_kernels,
segment_testing) importable: pytest runs with --import-mode=importlib, which does not put test
folders on sys.path. `isolated_cache`: a disk cache of the test's own, for the cache tests."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A disk cache in the test's temporary folder (its path yielded), on and unbounded, options
    read from that environment, and an empty in-memory kernel cache before and after."""
    from pyfuser import options as opts
    from pyfuser.runtime import kernel_cache
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.delenv("PYFUSER_CACHE_MAX_MB", raising=False)
    opts.reload_environment()         # per-call options start from the environment read here
    kernel_cache.clear_memory_cache()
    yield tmp_path / "cache"
    kernel_cache.clear_memory_cache()
    monkeypatch.undo()
    opts.reload_environment()
