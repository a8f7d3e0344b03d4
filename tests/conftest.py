"""Every test draws its random inputs from a generator seeded by its own name, so a test's
inputs do not depend on which tests ran before it (CI, a -k selection and the GPU split runs
see the same numbers), and a failure reproduces with the test alone.

`isolated_cache`: a disk cache of the test's own. The cache tests use it, and so does every test
that patches what a scheduler accepts: the executor keeps segmentation decisions on disk, keyed
on the fusion and pyfuser's source, not on a patched function, so a refusal patched in one test
would be replayed for the same fusion in a later test sharing the cache."""
import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_torch_by_test_name(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


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
