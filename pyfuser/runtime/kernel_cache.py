"""Two-level cache of compiled kernels: a dict in this process, and files on disk.

Why on disk: NVRTC + ptxas take tens to hundreds of milliseconds per kernel, and a test suite or
a training job recompiles the same kernels in every process. Why the key holds the NVRTC version,
arch, options and pyfuser version: any of them changes the cubin or its report.

A disk entry is one file: a header, JSON metadata (names, options, NVRTC log, source), the
cubin, and a SHA-256 of everything before it. A file that is truncated, corrupt, from another
format version, or holds a different source (a hash collision, however unlikely) is a miss and
is overwritten; the cache never raises because of what it finds on disk. Writes go to a
temporary file in the same directory followed by ``os.replace``, so readers in other processes
see either the old file or the complete new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path

from .nvrtc import CompiledModule, compile_to_cubin, nvrtc_version, parse_ptxas_log

__all__ = [
    "cache_dir",
    "disk_cache_enabled",
    "cache_key",
    "get_or_compile",
    "clear_memory_cache",
    "entry_path",
]

_MAGIC = b"PYFUSER-KERNEL\x00\x01"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<16sQQ")  # magic, metadata length, cubin length
_DIGEST_BYTES = 32

_memory: dict[str, CompiledModule] = {}
_memory_lock = threading.Lock()


def cache_dir() -> Path:
    """Where kernels are stored (PYFUSER_CACHE_DIR, parsed in pyfuser.options); read at call
    time so tests and users can redirect it."""
    from .. import options
    configured = options.setting("cache_dir")
    if configured:
        return Path(configured).expanduser()
    return Path("~/.cache/pyfuser").expanduser()


def disk_cache_enabled() -> bool:
    """False when PYFUSER_DISABLE_DISK_CACHE is set to a true value (pyfuser.options)."""
    from .. import options
    return bool(options.setting("disk_cache"))


def _pyfuser_version() -> str:
    import pyfuser

    return str(getattr(pyfuser, "__version__", "0"))


def cache_key(source: str, kernel_name: str, *, arch: str, options: tuple[str, ...]) -> str:
    fields = [
        _FORMAT_VERSION,
        source,
        kernel_name,
        list(nvrtc_version()),
        list(options),
        arch,
        _pyfuser_version(),
    ]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / "kernels" / key[:2] / f"{key}.pfk"


# ---------------------------------------------------------------------------------------------
# Serialization
# ---------------------------------------------------------------------------------------------


def _serialize(module: CompiledModule) -> bytes:
    meta = {
        "kernel_name": module.kernel_name,
        "entry_name": module.entry_name,
        "nvrtc_version": list(module.nvrtc_version),
        "arch": module.arch,
        "options": list(module.options),
        "log": module.log,
        "source": module.source,
    }
    meta_bytes = json.dumps(meta).encode()
    body = _HEADER.pack(_MAGIC, len(meta_bytes), len(module.cubin)) + meta_bytes + module.cubin
    return body + hashlib.sha256(body).digest()


def _deserialize(data: bytes) -> CompiledModule | None:
    """The module stored in ``data``, or None if the bytes are not one intact entry."""
    if len(data) < _HEADER.size + _DIGEST_BYTES:
        return None
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        return None
    magic, meta_len, cubin_len = _HEADER.unpack_from(body)
    if magic != _MAGIC or _HEADER.size + meta_len + cubin_len != len(body):
        return None
    meta = json.loads(body[_HEADER.size : _HEADER.size + meta_len])
    cubin = body[_HEADER.size + meta_len :]
    return CompiledModule(
        kernel_name=meta["kernel_name"],
        cubin=bytes(cubin),
        ptxas=parse_ptxas_log(meta["log"], meta["entry_name"]),
        nvrtc_version=tuple(meta["nvrtc_version"]),
        arch=meta["arch"],
        options=tuple(meta["options"]),
        log=meta["log"],
        source=meta["source"],
        entry_name=meta["entry_name"],
    )


# ---------------------------------------------------------------------------------------------
# Disk access (never raises)
# ---------------------------------------------------------------------------------------------


def _read_entry(path: Path, source: str, kernel_name: str) -> CompiledModule | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        module = _deserialize(data)
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError):
        return None
    if module is None or module.source != source or module.kernel_name != kernel_name:
        return None
    return module


def _write_entry(path: Path, module: CompiledModule) -> None:
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".pfk", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(_serialize(module))
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError as error:
        warnings.warn(f"pyfuser: could not write kernel cache entry {path}: {error}", stacklevel=3)
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------


def clear_memory_cache() -> None:
    with _memory_lock:
        _memory.clear()


def get_or_compile(
    source: str,
    kernel_name: str,
    *,
    arch: str = "sm_90a",
    options: tuple[str, ...] = (),
) -> tuple[CompiledModule, str]:
    """The compiled module and where it came from: "memory", "disk" or "compiled"."""
    options = tuple(options)
    key = cache_key(source, kernel_name, arch=arch, options=options)
    with _memory_lock:
        module = _memory.get(key)
    if module is not None:
        return module, "memory"
    use_disk = disk_cache_enabled()
    path = entry_path(key) if use_disk else None
    module = _read_entry(path, source, kernel_name) if use_disk else None
    kind = "disk"
    if module is None:
        module = compile_to_cubin(source, kernel_name, arch=arch, options=options)
        kind = "compiled"
        if use_disk:
            _write_entry(path, module)
    with _memory_lock:
        module = _memory.setdefault(key, module)
    return module, kind
