"""Compile generated CUDA C++ to a cubin with NVRTC, and read ptxas's verdict on it.

Why a cubin and never PTX: a driver JIT-compiles PTX only if the PTX ISA is not newer than the
driver, so PTX from a newer NVRTC fails on an older driver; a cubin of the same major CUDA
version loads fine. Why ``--ptxas-options=-v``: the register count, spills and
"setmaxnreg ignored" diagnostics decide whether a schedule is good, and tests assert on them
without a GPU.

The generated code is self-contained (inline PTX, no CUDA headers), so no include paths are
passed. ``cuda.bindings`` is imported lazily so ``import pyfuser`` works without it.
"""

from __future__ import annotations

import dataclasses
import functools
import re

__all__ = [
    "CompileError",
    "CompiledModule",
    "PtxasReport",
    "check_syntax",
    "compile_to_cubin",
    "nvrtc_version",
    "nvrtc_library_identity",
    "nvrtc_search_context",
    "file_identity",
    "parse_ptxas_log",
    "base_options",
]

# Lines of context shown on each side of the first error line in a CompileError.
_CONTEXT_LINES = 4


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message carries everything needed to debug it offline."""


@dataclasses.dataclass(frozen=True)
class PtxasReport:
    """ptxas's resource usage for one entry function, plus every diagnostic in the log.

    Spills and stack frames are performance bugs in generated code (they go to local memory);
    ``warnings`` holds lines such as ptxas C7508 ("'setmaxnreg' ignored"), which ptxas prints as
    *info* lines even though they silently disable warp specialization's register split.
    """

    registers: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0
    barriers: int = 0
    warnings: tuple[str, ...] = ()
    function: str = ""

    @property
    def has_spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def summary(self) -> str:
        text = (
            f"{self.function or '?'}: {self.registers} registers, {self.barriers} barriers, "
            f"{self.static_smem_bytes} B static smem, {self.stack_frame_bytes} B stack, "
            f"{self.spill_store_bytes} B spill stores, {self.spill_load_bytes} B spill loads"
        )
        if self.warnings:
            text += f", {len(self.warnings)} warning(s)"
        return text


@dataclasses.dataclass(frozen=True)
class CompiledModule:
    """Everything a compile produced, kept together so caches and dumps need nothing else.

    ``entry_name`` is the symbol in the cubin (the lowered, possibly mangled, form of
    ``kernel_name``); the loader looks it up by that name.
    """

    kernel_name: str
    cubin: bytes
    ptxas: PtxasReport
    nvrtc_version: tuple[int, int]
    arch: str
    options: tuple[str, ...]
    log: str
    source: str
    entry_name: str = ""

    @property
    def symbol(self) -> str:
        return self.entry_name or self.kernel_name


# ---------------------------------------------------------------------------------------------
# ptxas log parsing (pure text; testable without NVRTC)
# ---------------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_DIAG_RE = re.compile(r"warning|\(C\d{4}\)|performance loss", re.IGNORECASE)


def _split_functions(log: str) -> dict[str, list[str]]:
    """Group ptxas lines by the entry function they follow; '' collects the preamble."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in log.splitlines():
        match = _ENTRY_RE.search(line)
        if match:
            current = match.group(1)
            sections.setdefault(current, [])
        sections[current].append(line)
    return sections


def _int(pattern: re.Pattern, text: str, group: int = 1) -> int:
    match = pattern.search(text)
    return int(match.group(group)) if match else 0


def _diagnostics(log: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in log.splitlines() if _DIAG_RE.search(line))


def parse_ptxas_log(log: str, function: str = "") -> PtxasReport:
    """Read the resource report of ``function`` (or of the only/first entry) from an NVRTC log.

    Diagnostics are collected from the whole log: ptxas prints some (C7508) before naming the
    function they concern.
    """
    sections = _split_functions(log)
    names = [name for name in sections if name]
    if not function or function not in sections:
        function = names[0] if names else ""
    body = "\n".join(sections.get(function, [])) if function else ""
    frame = _FRAME_RE.search(body)
    return PtxasReport(
        registers=_int(_USED_RE, body),
        stack_frame_bytes=int(frame.group(1)) if frame else 0,
        spill_store_bytes=int(frame.group(2)) if frame else 0,
        spill_load_bytes=int(frame.group(3)) if frame else 0,
        static_smem_bytes=_int(_SMEM_RE, body),
        barriers=_int(_BARRIERS_RE, body),
        warnings=_diagnostics(log),
        function=function,
    )


# ---------------------------------------------------------------------------------------------
# Error formatting
# ---------------------------------------------------------------------------------------------


def _first_error_line(log: str, program_name: str) -> int | None:
    pattern = re.compile(re.escape(program_name) + r"\((\d+)\): (?:catastrophic )?error")
    match = pattern.search(log)
    return int(match.group(1)) if match else None


def numbered_excerpt(source: str, line: int, context: int = _CONTEXT_LINES) -> str:
    """Source lines around ``line`` (1-based), numbered, with the offending line marked."""
    lines = source.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    width = len(str(hi))
    out = []
    for number in range(lo, hi + 1):
        marker = ">>" if number == line else "  "
        out.append(f"{marker} {number:>{width}} | {lines[number - 1]}")
    return "\n".join(out)


def _format_error(kernel_name: str, result: str, log: str, source: str, program: str) -> str:
    parts = [f"NVRTC failed to compile kernel {kernel_name!r} ({result}).", "--- NVRTC log ---"]
    parts.append(log.rstrip() or "(empty log)")
    line = _first_error_line(log, program)
    if line is not None and source:
        parts += [f"--- source around line {line} ---", numbered_excerpt(source, line)]
    elif "__nv_name_map" in log:
        parts.append(f"(the source defines no __global__ function named {kernel_name!r})")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# NVRTC driver
# ---------------------------------------------------------------------------------------------


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {getattr(result, 'name', result)}")


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC library; part of every cache key."""
    err, major, minor = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return (int(major), int(minor))


def nvrtc_search_context() -> list:
    """What decides which NVRTC file `nvrtc_library_identity` finds, as cuda.pathfinder's early
    steps search: the interpreter, its site-packages folders (site.getsitepackages() and the
    user's) with each one's modification time (installing or removing a package changes it),
    and the environment variables those steps read. JSON-able: the disk cache remembers the
    file found per context (kernel_cache.nvrtc_fingerprint)."""
    import os
    import site
    import sys
    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    stamped = []
    for folder in folders:
        try:
            stamped.append([folder, os.stat(folder).st_mtime_ns])
        except OSError:
            stamped.append([folder, None])
    environment = [os.environ.get(name) for name in ("CUDA_PATH", "CUDA_HOME", "CONDA_PREFIX")]
    return [sys.executable, stamped, environment]


def file_identity(path: str) -> tuple[str, int, int, int]:
    """(real path, size, inode, modification time in ns) of a file; OSError if it is gone."""
    import os
    path = os.path.realpath(path)
    st = os.stat(path)
    return (path, st.st_size, st.st_ino, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def nvrtc_library_identity() -> tuple[str, int, int, int] | None:
    """The NVRTC library file ``cuda.bindings`` loads, found as it finds it but without loading
    it: (path, size, inode, modification time in ns), or None where only loading tells.

    Why: loading NVRTC to ask its version costs milliseconds, and a process whose kernels all
    come from the disk cache never compiles; a different NVRTC is a different file (another
    path, or the same path rewritten), so the file's identity keys the cache as well as its
    version. ``cuda.bindings`` loads NVRTC through cuda.pathfinder, whose order is: a library
    already loaded in the process, else one in an NVIDIA wheel or the conda environment, else
    the system loader's search. The first two are file look-ups, repeated here with
    cuda.pathfinder's own steps; the third resolves only by loading, so it answers None (the
    caller then asks the version), as does any failure of these look-ups (they use
    cuda.pathfinder's internals). Importing cuda.pathfinder costs a new process 25-65 ms (H100
    machine): kernel_cache.nvrtc_fingerprint remembers the answer on disk."""
    return _find_nvrtc_file()


def _find_nvrtc_file() -> tuple[str, int, int, int] | None:
    try:
        from cuda.pathfinder._dynamic_libs.lib_descriptor import LIB_DESCRIPTORS
        from cuda.pathfinder._dynamic_libs.platform_loader import LOADER
        from cuda.pathfinder._dynamic_libs.search_steps import (
            EARLY_FIND_STEPS,
            SearchContext,
            run_find_steps,
        )
        desc = LIB_DESCRIPTORS["nvrtc"]
        loaded = LOADER.check_if_already_loaded_from_elsewhere(desc)
        if loaded is not None:
            path = loaded.abs_path
        else:
            found = run_find_steps(SearchContext(desc), EARLY_FIND_STEPS)
            if found is None:
                return None
            path = found.abs_path
    except Exception:   # noqa: BLE001  (internals of another package: ask the version instead)
        return None
    try:
        return file_identity(path)
    except OSError:
        return None


def base_options(arch: str) -> tuple[str, ...]:
    return ("-std=c++17", f"--gpu-architecture={arch}", "--ptxas-options=-v", "-lineinfo")


def _program_name(kernel_name: str) -> str:
    return re.sub(r"\W", "_", kernel_name) + ".cu"


def _read_log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    # NVRTC writes into the buffer, so it must be a fresh, mutable one. b" " * size is not: for
    # an empty log (size 1, its NUL) it is CPython's shared one-byte b" ", and the NUL turns
    # every later b" " of the process into b"\0" and, on Python 3.12, whose parser builds
    # one-character literals through it, the " " of modules compiled afterwards.
    buffer = bytearray(size)
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buffer)
    _check(err, "nvrtcGetProgramLog")
    return buffer.rstrip(b"\x00").decode("utf-8", errors="replace")


def _read_cubin(prog) -> bytes:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    _check(err, "nvrtcGetCUBINSize")
    buffer = bytearray(size)     # a buffer of its own, as in _read_log
    (err,) = nvrtc.nvrtcGetCUBIN(prog, buffer)
    _check(err, "nvrtcGetCUBIN")
    return bytes(buffer)


def _lowered_name(prog, kernel_name: str) -> str:
    err, name = _nvrtc().nvrtcGetLoweredName(prog, kernel_name.encode())
    _check(err, "nvrtcGetLoweredName")
    return name.decode() if isinstance(name, bytes) else str(name)


def _validate_arch(arch: str) -> None:
    # A virtual architecture (compute_XX) yields PTX only; we never ship PTX.
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must be a real architecture such as 'sm_90a', got {arch!r}")


def compile_to_cubin(
    source: str,
    kernel_name: str,
    *,
    arch: str = "sm_90a",
    options: tuple[str, ...] = (),
) -> CompiledModule:
    """Compile ``source`` and return the cubin of ``kernel_name`` with its ptxas report.

    ``kernel_name`` is registered as a name expression, so a namespaced or templated kernel
    resolves to its mangled symbol, and a misspelled name fails at compile time rather than at
    load time on the GPU.
    """
    _validate_arch(arch)
    nvrtc = _nvrtc()
    all_options = base_options(arch) + tuple(options)
    program = _program_name(kernel_name)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), program.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, kernel_name.encode())
        _check(err, "nvrtcAddNameExpression")
        encoded = [option.encode() for option in all_options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _read_log(prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            message = _format_error(kernel_name, result.name, log, source, program)
            raise CompileError(message)
        cubin = _read_cubin(prog)
        entry = _lowered_name(prog, kernel_name)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompiledModule(
        kernel_name=kernel_name,
        cubin=cubin,
        ptxas=parse_ptxas_log(log, entry),
        nvrtc_version=nvrtc_version(),
        arch=arch,
        options=all_options,
        log=log,
        source=source,
        entry_name=entry,
    )


def check_syntax(source: str, name: str = "program", *, arch: str = "sm_90a") -> str:
    """Run only NVRTC's C++ front end on ``source`` (-fdevice-syntax-only: no NVVM, no ptxas) and
    return its log; raise CompileError on an error. Twenty times faster than compile_to_cubin,
    for tests that check that generated text is valid C++ over many type combinations; it says
    nothing of registers, spills or ptxas diagnostics."""
    _validate_arch(arch)
    nvrtc = _nvrtc()
    options = ("-std=c++17", f"--gpu-architecture={arch}", "-fdevice-syntax-only")
    program = _program_name(name)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), program.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        encoded = [option.encode() for option in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _read_log(prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(_format_error(name, result.name, log, source, program))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return log
