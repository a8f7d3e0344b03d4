"""Two-level cache of compiled kernels: a dict in this process, and files on disk.

Why on disk: NVRTC + ptxas take tens to hundreds of milliseconds per kernel, and a test suite or
a training job recompiles the same kernels in every process. Why the key holds NVRTC (the
identity of its library file, or its version: `nvrtc_fingerprint`), arch, options and pyfuser
version: any of them changes the cubin or its report.

Three kinds of entry, the first two in one file format:

* by CUDA text (`get_or_compile`): a cubin for a source. Reached only after scheduling,
  lowering and printing; it saves NVRTC when two schedules print the same source.
* by plan key (`plan_key`, `load_plan`, `store_plan`): computed by the executor *before*
  scheduling, from the fusion's canonical serialization (ir/fingerprint.py), the signature
  class of the call, the scheduler and its heuristic, the index type, the options, the
  device-table entry, NVRTC (`nvrtc_fingerprint`) and a hash of pyfuser's own source files
  (`source_hash`: a changed checkout never loads a stale kernel; a stat-keyed memo of the
  files' digests beside the cache spares reading them in each process). The entry holds the cubin and
  the kernel's launch description (kir/launch.py), so a hit launches with no scheduling,
  lowering or CUDA printing.
* by segmentation key (`segmentation_key`, `load_segmentation`, `store_segmentation`): the
  segmenter's decision (schedule/segmenter.SegmentationDecision: the scheduler taking the whole
  fusion, or the groups of segments), keyed on its canonical serialization, the names of the
  schedulers excluded, the schedulers registered and `source_hash`: a small JSON file, so that
  a new process replays it instead of asking every scheduler and searching again before its
  kernels' look-ups (no NVRTC in the key: no kernel in the entry).

Bounds: the in-memory dict keeps the MEMORY_ENTRIES modules used last; the directory keeps
at most PYFUSER_CACHE_MAX_MB (default 2048 MB) of entries of all kinds: after each write, the
files used least recently (a hit refreshes a file's modification time) are removed until it
fits.

A kernel entry is one file: a header, JSON metadata (names, options, NVRTC log, source), the
cubin, and a SHA-256 of everything before it; a segmentation entry is JSON holding its key and
the decision. A file that is truncated, corrupt, from another format version, or holds a
different source or key (a hash collision, however unlikely) is a miss and is overwritten; the
cache never raises because of what it finds on disk. Writes go to a temporary file in the same
directory followed by ``os.replace``, so readers in other processes see either the old file or
the complete new one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

from .nvrtc import (
    CompiledModule,
    compile_to_cubin,
    file_identity,
    nvrtc_library_identity,
    nvrtc_search_context,
    nvrtc_version,
    parse_ptxas_log,
)

__all__ = [
    "cache_dir",
    "disk_cache_enabled",
    "cache_key",
    "get_or_compile",
    "clear_memory_cache",
    "entry_path",
    "plan_key",
    "load_plan",
    "store_plan",
    "source_hash",
    "nvrtc_fingerprint",
    "PlanEntry",
    "segmentation_key",
    "segmentation_path",
    "load_segmentation",
    "store_segmentation",
]

_MAGIC = b"PYFUSER-KERNEL\x00\x01"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<16sQQ")  # magic, metadata length, cubin length
_DIGEST_BYTES = 32

# Compiled modules by key, the most recently used last.
MEMORY_ENTRIES = 256
_memory: OrderedDict[str, CompiledModule] = OrderedDict()
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


_NVRTC_MEMO = "nvrtc-library.json"
_NVRTC_MEMO_ENTRIES = 8
_nvrtc_identities: dict = {}     # memo path (None: disk cache off) -> identity, per process


def nvrtc_fingerprint() -> list:
    """What the keys hold about NVRTC: the identity of the library file it is loaded from
    (nvrtc.nvrtc_library_identity: found without loading it, so a process whose kernels all
    come from disk never loads NVRTC), or its version where only loading it tells which file."""
    identity = remembered_nvrtc_identity()
    if identity is not None:
        return ["file", *identity]
    return ["version", *nvrtc_version()]


def remembered_nvrtc_identity():
    """nvrtc_library_identity(), once per process and through a memo beside the disk cache
    (`_NVRTC_MEMO`): the file found for each search context (nvrtc.nvrtc_search_context) seen
    before. A remembered file whose identity is unchanged answers without the search (whose
    import of cuda.pathfinder costs a new process 25-65 ms, H100 machine); a new context, or a
    rewritten or removed file, searches again. Best effort: an unreadable memo searches."""
    memo_path = cache_dir() / _NVRTC_MEMO if disk_cache_enabled() else None
    key = None if memo_path is None else str(memo_path)
    if key not in _nvrtc_identities:
        _nvrtc_identities[key] = _nvrtc_identity_through(memo_path)
    return _nvrtc_identities[key]


def _nvrtc_identity_through(memo_path):
    context = nvrtc_search_context()
    entries = []
    if memo_path is not None:
        try:
            entries = json.loads(memo_path.read_text())
        except (OSError, ValueError):
            entries = []
        entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        for entry in entries:
            if entry.get("context") == context:
                try:
                    identity = file_identity(entry["identity"][0])
                except (OSError, TypeError, IndexError, KeyError):
                    break
                if list(identity) == entry["identity"]:
                    return identity
                break
    identity = nvrtc_library_identity()
    if identity is not None and memo_path is not None:
        entries = [{"context": context, "identity": list(identity)}] + [
            e for e in entries if e.get("context") != context]
        try:
            _atomic_write(memo_path, json.dumps(entries[:_NVRTC_MEMO_ENTRIES]).encode(), ".json")
        except OSError:
            pass        # best effort: the next process searches again
    return identity


def cache_key(source: str, kernel_name: str, *, arch: str, options: tuple[str, ...]) -> str:
    fields = [
        _FORMAT_VERSION,
        source,
        kernel_name,
        nvrtc_fingerprint(),
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


def _serialize(module: CompiledModule, plan: dict | None = None) -> bytes:
    meta = {
        "plan": plan,
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
    found = _deserialize_with_meta(data)
    return None if found is None else found[0]


def _deserialize_with_meta(data: bytes) -> tuple[CompiledModule, dict] | None:
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
    ), meta


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
    _touch(path)
    return module


def _touch(path: Path) -> None:
    """Mark an entry used now: eviction removes the entries used least recently."""
    try:
        os.utime(path)
    except OSError:
        pass


def _max_bytes() -> int:
    from .. import options
    return int(options.setting("cache_max_bytes"))


# The entries of each kind: (folder under cache_dir(), file pattern inside it).
_ENTRY_GLOBS = (("kernels", "*/*.pfk"), ("segmentations", "*/*.json"))


def _evict(limit: int) -> None:
    """Remove the entries used least recently until the directory holds at most `limit` bytes
    of entries (concurrent writers may remove the same file: never an error)."""
    entries = []
    try:
        for folder, pattern in _ENTRY_GLOBS:
            for path in (cache_dir() / folder).glob(pattern):
                try:
                    st = path.stat()
                except OSError:
                    continue
                entries.append((st.st_mtime_ns, st.st_size, path))
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        try:
            path.unlink()
        except OSError:
            pass
        total -= size


def _atomic_write(path: Path, data: bytes, suffix: str) -> None:
    """Write `data` to `path` through a temporary file in its folder and a rename, so that a
    reader sees the old file or the whole new one (raises OSError)."""
    import tempfile
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp_name, path)
        tmp_name = None
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass


def _write_entry(path: Path, module: CompiledModule, plan: dict | None = None) -> None:
    _write_bounded(path, _serialize(module, plan), ".pfk")


def _write_bounded(path: Path, data: bytes, suffix: str) -> None:
    """Write an entry atomically, then evict down to the bound (a failed write warns)."""
    try:
        _atomic_write(path, data, suffix)
        _evict(_max_bytes())
    except OSError as error:
        warnings.warn(f"pyfuser: could not write kernel cache entry {path}: {error}", stacklevel=4)


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------


def clear_memory_cache() -> None:
    with _memory_lock:
        _memory.clear()


def _remember(key: str, module: CompiledModule) -> CompiledModule:
    with _memory_lock:
        module = _memory.setdefault(key, module)
        _memory.move_to_end(key)
        while len(_memory) > MEMORY_ENTRIES:
            _memory.popitem(last=False)
    return module


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
            _memory.move_to_end(key)
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
    return _remember(key, module), kind


# ---------------------------------------------------------------------------------------------
# Entries keyed before scheduling
# ---------------------------------------------------------------------------------------------

_source_hash: str | None = None
_SOURCE_SUFFIXES = (".py", ".cuh", ".h")
_SOURCE_MEMO = "source-digests.json"


def source_hash() -> str:
    """SHA-256 of pyfuser's own source files (Python and the CUDA device library), computed
    once per process: any change to the checkout changes every plan key."""
    global _source_hash
    if _source_hash is None:
        _source_hash = tree_digest(Path(__file__).resolve().parents[1],
                                   cache_dir() / _SOURCE_MEMO)
    return _source_hash


def _source_files(root: str, rel: str = "") -> list[tuple[str, str]]:
    """(relative path, absolute path) of the source files under `root`, in a fixed order."""
    out = []
    try:
        entries = sorted(os.scandir(os.path.join(root, rel) if rel else root),
                         key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "__pycache__":
                out += _source_files(root, name)
        elif entry.name.endswith(_SOURCE_SUFFIXES):
            out.append((name, entry.path))
    return out


def tree_digest(root: Path, memo_path: Path | None = None) -> str:
    """SHA-256 over the source files under `root` (their relative paths and contents).

    Why a memo: reading and hashing every file costs milliseconds in each new process (tens on
    a slow file system) though the files rarely change. `memo_path` (beside the disk cache)
    keeps each file's digest with its size, inode, modification and change times in ns; a file
    whose stat matches is not read again. Writing a file changes its change time (which no
    user call sets), so an edited file is always read and hashed. The memo is best effort:
    unreadable or unwritable, every file is hashed."""
    root_key = str(root)
    memo: dict = {}
    if memo_path is not None:
        try:
            memo = json.loads(memo_path.read_text())
            if not isinstance(memo, dict):
                memo = {}
        except (OSError, ValueError):
            memo = {}
    known = memo.get(root_key)
    known = known if isinstance(known, dict) else {}
    digests, changed = {}, False
    for rel, path in _source_files(root_key):
        try:
            st = os.stat(path)
        except OSError:
            continue
        stamp = [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]
        entry = known.get(rel)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stamp:
            digests[rel] = entry
            continue
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        digests[rel] = [stamp, hashlib.sha256(data).hexdigest()]
        changed = True
    if memo_path is not None and (changed or len(digests) != len(known)):
        memo[root_key] = digests
        _write_memo(memo_path, memo)
    h = hashlib.sha256()
    for rel in sorted(digests):
        h.update(rel.encode() + b"\0" + digests[rel][1].encode() + b"\0")
    return h.hexdigest()


def _write_memo(path: Path, memo: dict) -> None:
    try:
        _atomic_write(path, json.dumps(memo).encode(), ".json")
    except OSError:
        pass        # best effort: the next process hashes the files again


def plan_key(fields: dict) -> str:
    """The key of a kernel for `fields` (what the executor knows before scheduling: the fusion's
    canonical text, the signature class, scheduler, heuristic, index type, options, device
    entry), with the format version, NVRTC (its library file or version) and pyfuser's source
    hash added."""
    whole = dict(fields, format=_FORMAT_VERSION, nvrtc=nvrtc_fingerprint(),
                 pyfuser_source=source_hash(), kind="plan")
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=repr).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """A kernel stored under a plan key: everything a launch needs besides the call's inputs."""

    key: str
    module: CompiledModule
    launch: object                 # kir.launch.LaunchDescription
    scheduler: str
    index_type: str
    fitted_grid: int | None        # the grid the executor's fit step lowered the heuristic's to


def load_plan(key: str) -> PlanEntry | None:
    """The entry stored under `key`, or None (disk cache off, missing, damaged, or another
    key's file); never raises."""
    from ..kir.launch import LaunchDescription
    if not disk_cache_enabled():
        return None
    path = entry_path(key)
    try:
        found = _deserialize_with_meta(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError):
        return None
    if found is None:
        return None
    module, meta = found
    plan = meta.get("plan")
    try:
        if not plan or plan["key"] != key:
            return None
        entry = PlanEntry(key, module, LaunchDescription.from_json(plan["launch"]),
                          plan["scheduler"], plan["index_type"], plan["fitted_grid"])
    except (KeyError, TypeError, ValueError):
        return None
    _touch(path)
    _remember(cache_key(module.source, module.kernel_name, arch=module.arch,
                        options=module.options), module)
    return entry


def store_plan(key: str, module: CompiledModule, launch, scheduler: str, index_type: str,
               fitted_grid: int | None = None) -> None:
    """Store a compiled kernel and its launch description under `key` (atomic; a failed write
    warns and is otherwise ignored)."""
    if not disk_cache_enabled():
        return
    plan = {"key": key, "launch": launch.to_json(), "scheduler": scheduler,
            "index_type": index_type, "fitted_grid": fitted_grid}
    _write_entry(entry_path(key), module, plan)


# ---------------------------------------------------------------------------------------------
# Segmentation decisions
# ---------------------------------------------------------------------------------------------

_SEGMENTATION_FORMAT = 3


def segmentation_key(fields: dict) -> str:
    """The key of a segmentation decision for `fields` (the fusion's canonical text, the names
    of the schedulers excluded, the schedulers registered), with the format version and
    pyfuser's source hash added."""
    whole = dict(fields, format=_SEGMENTATION_FORMAT, pyfuser_source=source_hash(),
                 kind="segmentation")
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()


def segmentation_path(key: str) -> Path:
    return cache_dir() / "segmentations" / key[:2] / f"{key}.json"


def load_segmentation(key: str):
    """The decision (its JSON value) stored under `key`, or None (disk cache off, missing,
    damaged, or another key's file); never raises."""
    if not disk_cache_enabled():
        return None
    path = segmentation_path(key)
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):       # ValueError: not JSON, nor UTF-8
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    _touch(path)
    return entry.get("decision")


def store_segmentation(key: str, decision) -> None:
    """Store a decision's JSON value under `key` (atomic; a failed write warns and is otherwise
    ignored)."""
    if not disk_cache_enabled():
        return
    _write_bounded(segmentation_path(key), json.dumps({"key": key, "decision": decision}).encode(),
                   ".json")
