"""Every environment knob of pyfuser, parsed in one place.

PYFUSER_DUMP      comma list of stages to print: fusion_ir, scheduled_ir, transforms, heuristics,
                  segments, kernel_ir (after the last pass), kernel_ir_passes (after each pass),
                  cuda, ptxas, launch. `all` prints every stage.
PYFUSER_ENABLE    comma list of optional features to force on  (e.g. ws_normalization)
PYFUSER_DISABLE   comma list of features to force off          (e.g. tma_inner_persistent)
PYFUSER_DUMP_DIR  write dumps to files in this folder instead of stderr
PYFUSER_CACHE_DIR the on-disk kernel cache (default ~/.cache/pyfuser)
PYFUSER_DEVICE    the device-table entry kernels are scheduled for when there is no live GPU to
                  ask: `interpret` runs (default h100-4sm, the H100 with 4 SMs) and `explain`
PYFUSER_DISABLE_DISK_CACHE=1  compile in memory only
PYFUSER_CACHE_MAX_MB  size bound of the on-disk kernel cache (default 2048): after a write, the
                  entries used least recently are removed until the cache fits

The same settings can be given per call: `fd.execute(inputs, options={"dump": ["cuda"],
"enable": ["ws_normalization"]})` or `with pyfuser.options.override(disable=["ws_normalization"])`.
A whole heuristic can be forced per call: `options={"heuristic": ReductionParams(...)}`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading

DUMP_STAGES = (
    "fusion_ir", "scheduled_ir", "transforms", "heuristics", "segments", "kernel_ir",
    "kernel_ir_passes", "cuda", "ptxas", "launch",
)

# Features that can be forced on or off. Each scheduler documents what its features change.
FEATURES = {
    "ws_normalization": "warp-specialized inner-outer persistent (norm backward) kernels",
    "ws_inner_persistent": "warp-specialized inner persistent (norm forward, softmax) kernels",
    "ws_pingpong": "with ws_inner_persistent: two compute roles take the row groups in turn, "
                   "their loads and reductions ordered, each role's stores overlapping the "
                   "other's work (ping-pong)",
    "tma_inner_persistent": "TMA loads in the inner persistent scheduler (per-thread cp.async "
                            "copies for rows a 1D bulk copy cannot take)",
    "looped_inner_persistent": "the inner persistent scheduler's looped variant (each pass over "
                               "the row reads it again) for every row, not only rows registers "
                               "cannot hold (forced off: such rows are planned without it)",
    "tma_tensor_map": "TMA variants copy a stage of whole rows with one tensor-map box instead of "
                      "one 1D bulk copy per row",
    "matmul_pingpong": "matmul kernels with two compute warp groups taking whole 128x128 tiles "
                       "in turn, one's epilogue under the other's MMAs (ping-pong; forced off: "
                       "both split each tile's rows, cooperative; unset: the cost model chooses)",
    "matmul_few_rows": "the matmul kernel for matmuls of 64 rows (M) or fewer; unset, torch's "
                       "matmul runs them as a library segment (faster there until split-K is "
                       "built)",
    "matmul_as_reduction": "matmuls and linears of few rows (M) whose weight is read along K "
                           "run as a row reduction of the products, the epilogue fused "
                           "(schedule/few_row_matmuls.py; unset: on; forced off: the matmul "
                           "kernel or torch's matmul)",
    "matmul_split_k": "matmul kernels that split K over the CTAs of one output tile, the partial "
                      "sums added in a fixed order by the last of them, wherever K has two "
                      "64-deep blocks per split (unset: not split; measured slower than the "
                      "unsplit kernel or cuBLAS on the shapes swept)",
    "matmul_stream_k": "matmul kernels that cut the last waves' tiles into runs of 64-deep k "
                       "blocks spread evenly over the persistent CTAs, a tile's fp32 partials "
                       "added in k order by the CTA of its first k blocks (unset: where the heuristic's "
                       "cost model says it wins; forced on: cooperative tiles always stream-K; "
                       "forced off: never)",
    "matmul_cluster": "matmul kernels in clusters of 2 CTAs along M, each loading half of the B "
                      "tile the two share and multicasting it to both (unset: the heuristic's "
                      "rule, cooperative 128x256 tiles over at least a wave and K >= 1024; forced "
                      "off: no cluster; forced on: every tile whose B splits in two, without "
                      "split-K)",
    "kernel_reuse": "reuse compiled kernels across shapes whose heuristics are equal",
    "reference_fallback": "run fusions no scheduler takes through the reference evaluator",
    "one_pass_logsumexp": "make max(x) and sum(exp(x - max(x))) over the same dims one reduction "
                          "of (max, sum) keys that reads x once (schedule/logsumexp.py; unset: "
                          "on; read when a definition's executor is made, so set it with "
                          "PYFUSER_DISABLE)",
    "streaming_loads": "read fusion inputs with ld.global.nc.L1::no_allocate (read once, no L1 "
                       "reuse) instead of ld.global.nc",
    "poison_outputs": "fill outputs with NaN (or -1) before each launch, so tests see unwritten "
                      "elements",
    "interpret": "run the generated kernels on CPU tensors with the kernel-IR interpreter "
                 "(runtime/interpreter.py) instead of the reference evaluator",
    "verify_kernel_ir": "check the kernel IR after every lowering pass (kir/verifier.py, the rules "
                        "each pass establishes): a wrong kernel IR fails at the pass that made "
                        "it, not in the generated code; lowering takes longer",
    "shared_divisor_quotients": "quotients by a divisor their loop shares through its reciprocal, "
                                "range checked, the loop again with IEEE division where a check "
                                "fails (lower/shared_divisor.py; the same values as div.rn; unset: "
                                "on; forced off: every float division is div.rn)",
    "group_reductions": "sibling block and grid reduction steps side by side reduce in one pass "
                        "(lower/grouped_reductions.py; unset: on; forced off: each reduction "
                        "its own steps)",
    "sync_index_checks": "wait for each kernel that checks indices (gathers) and raise an index "
                         "out of range from the call that launched it, instead of reading the "
                         "check asynchronously (runtime/index_check.py)",
}


# Features that change no kernel, only what runs around it (filling outputs before a launch,
# waiting for index checks, the fallback, reusing kernels): left out of the kernels' keys, so
# that a test's poisoned run and a plain one share a kernel. Every other forced feature is in
# them (kernel_features).
RUNTIME_FEATURES = frozenset({"poison_outputs", "sync_index_checks", "reference_fallback",
                              "kernel_reuse"})


def kernel_features(options) -> tuple:
    """The features `options` force on and off that may change a kernel (sorted tuples)."""
    return (tuple(sorted(options.enable - RUNTIME_FEATURES)),
            tuple(sorted(options.disable - RUNTIME_FEATURES)))


class OptionError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Options:
    dump: frozenset = frozenset()
    enable: frozenset = frozenset()
    disable: frozenset = frozenset()
    dump_dir: str | None = None
    cache_dir: str | None = None
    disk_cache: bool = True
    cache_max_bytes: int = 2048 << 20
    device: str | None = None       # a device-table entry (PYFUSER_DEVICE)
    # A heuristic dataclass to use instead of the scheduler's own choice (same scheduler only):
    # how users force a schedule, and how sweeps measure alternatives.
    heuristic: object = None

    def dumps(self, stage: str) -> bool:
        return stage in self.dump or "all" in self.dump

    def is_enabled(self, feature: str) -> bool:
        """Forced on: True; forced off: False; else None (the heuristic decides)."""
        if feature in self.disable:
            return False
        if feature in self.enable:
            return True
        return None

    def merged(self, **changes) -> "Options":
        """These options with `changes` on top: lists add to the current ones, and a feature
        enabled here is no longer disabled (and the reverse), so the innermost setting wins."""
        out = self
        fields = {f.name for f in dataclasses.fields(Options)}
        for key, value in changes.items():
            if key not in fields:
                raise OptionError(f"unknown option {key!r}; choose from {sorted(fields)}")
            if value is None:
                continue
            if key in ("dump", "enable", "disable"):
                value = _parse_list(value, key)
                out = dataclasses.replace(out, **{key: getattr(out, key) | value})
                other = {"enable": "disable", "disable": "enable"}.get(key)
                if other:
                    out = dataclasses.replace(out, **{other: getattr(out, other) - value})
            else:
                out = dataclasses.replace(out, **{key: value})
        return out


def _parse_list(value, what: str) -> frozenset:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    else:
        items = list(value)
    allowed = set(DUMP_STAGES) | {"all"} if what == "dump" else set(FEATURES)
    bad = [v for v in items if v not in allowed]
    if bad:
        raise OptionError(f"unknown {what} option(s) {bad}; choose from {sorted(allowed)}")
    return frozenset(items)


def from_environment(environ=None) -> Options:
    env = os.environ if environ is None else environ
    return Options(
        dump=_parse_list(env.get("PYFUSER_DUMP", ""), "dump"),
        enable=_parse_list(env.get("PYFUSER_ENABLE", ""), "enable"),
        disable=_parse_list(env.get("PYFUSER_DISABLE", ""), "disable"),
        dump_dir=env.get("PYFUSER_DUMP_DIR") or None,
        cache_dir=env.get("PYFUSER_CACHE_DIR") or None,
        disk_cache=env.get("PYFUSER_DISABLE_DISK_CACHE", "0").strip().lower()
        not in ("1", "true", "yes", "on"),
        cache_max_bytes=_parse_megabytes(env.get("PYFUSER_CACHE_MAX_MB", "")),
        device=env.get("PYFUSER_DEVICE", "").strip().lower() or None,
    )


def _parse_megabytes(value: str) -> int:
    value = value.strip()
    if not value:
        return Options.cache_max_bytes
    try:
        mb = float(value)
    except ValueError:
        mb = -1
    if mb < 0:
        raise OptionError(f"PYFUSER_CACHE_MAX_MB must be a number of megabytes >= 0, "
                          f"got {value!r}")
    return int(mb * (1 << 20))


class _ThreadState(threading.local):
    """Each thread's stack of override()s. A subclass whose __init__ makes the stack, so that
    reading it never misses an attribute: current() runs on every execute, and an
    AttributeError raised and caught inside getattr costs more than the rest of it."""

    def __init__(self):
        self.stack: list = []


_state = _ThreadState()
_env_options: Options | None = None


def current() -> Options:
    """The options in force: environment, then every active override() on this thread."""
    stack = _state.stack
    if stack:
        return stack[-1]
    return _env_options or _read_environment()


def _read_environment() -> Options:
    global _env_options
    _env_options = from_environment()
    return _env_options


def setting(name: str):
    """One setting as it stands now: a per-call override if one is active, else the environment
    read at this moment (for knobs such as the cache directory that tests redirect at run time)."""
    stack = _state.stack
    if stack:
        return getattr(stack[-1], name)
    return getattr(from_environment(), name)


def reload_environment() -> Options:
    global _env_options
    _env_options = from_environment()
    return _env_options


@contextlib.contextmanager
def override(options: Options | dict | None = None, **changes):
    """Apply options for the duration of a `with` block (per call: execute(options=...))."""
    base = current()
    if isinstance(options, Options):
        new = options
    else:
        new = _merged(base, {**(options or {}), **changes})
    _state.stack.append(new)
    try:
        yield new
    finally:
        _state.stack.pop()


# (base options, the changes frozen) -> base.merged(**changes), the most recent last: equal
# per-call options give the same Options object, which a cached call compares by identity
# (runtime/executor.py's guarded call).
_MERGED: dict = {}
_MERGED_LIMIT = 64


def _frozen(value):
    return tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else value


def _merged(base: Options, changes: dict) -> Options:
    try:
        key = (base, tuple(sorted((k, _frozen(v)) for k, v in changes.items())))
        new = _MERGED.pop(key, None)
    except TypeError:               # an unhashable value (a heuristic that is no dataclass)
        return base.merged(**changes)
    if new is None:
        new = base.merged(**changes)
        if len(_MERGED) >= _MERGED_LIMIT:
            _MERGED.pop(next(iter(_MERGED)), None)
    _MERGED[key] = new
    return new


def dump(stage: str, title: str, text) -> None:
    """Write one dumped stage to stderr, or to PYFUSER_DUMP_DIR/<title>.<stage>.txt. `text`: the
    text, or a function making it, called only when the stage is dumped (printing a fusion
    costs about a millisecond, which a new process's first execute would pay per segment)."""
    opts = current()
    if not opts.dumps(stage):
        return
    if callable(text):
        text = text()
    if opts.dump_dir:
        os.makedirs(opts.dump_dir, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in title)
        with open(os.path.join(opts.dump_dir, f"{safe}.{stage}.txt"), "w") as f:
            f.write(text)
        return
    print(f"===== {stage}: {title} =====\n{text}\n", file=sys.stderr)
