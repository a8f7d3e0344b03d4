"""Loader for the device-helper library that generated kernels are compiled with.

The helpers are CUDA C++ headers under ``runtime_src/`` written without any CUDA header (NVRTC
compiles them with no include path). The code generator pastes their text in front of each kernel,
in the fixed order of :data:`PARTS`: each part may use only the parts before it.
"""

from __future__ import annotations

import functools
from importlib import resources

# The workspace sizes of the block reductions are kernel-IR facts that lowering needs too; they
# live in pyfuser.kir.workspace and are re-exported here for the library's users.
from ..kir.workspace import block_allreduce_x_smem_elems, block_allreduce_y_smem_elems

__all__ = ["PARTS", "DEPENDS", "device_library_source", "block_allreduce_x_smem_elems",
           "block_allreduce_y_smem_elems"]

#: Library parts in concatenation order (file ``runtime_src/<part>.cuh``).
PARTS: tuple[str, ...] = (
    "types",
    "math",
    "memory",
    "reduce",
    "mbarrier",
    "tma",
    "warp_group",
    "mma",
    "cluster",
    "cluster_reduce",
    "scan",
    "topk",
    "grid_sync",
)

#: Parts each part uses directly (all earlier in PARTS). device_library_source adds them.
DEPENDS: dict[str, tuple[str, ...]] = {
    "types": (),
    "math": ("types",),
    "memory": ("types",),
    "reduce": ("types", "math"),
    "mbarrier": (),
    "tma": (),
    "warp_group": (),
    "mma": ("types", "tma"),
    "cluster": ("types",),
    "cluster_reduce": ("memory", "reduce", "cluster"),
    "scan": ("types", "memory", "reduce", "cluster"),
    "topk": ("types", "math", "reduce"),
    "grid_sync": (),
}


@functools.cache
def _part_source(part: str) -> str:
    text = resources.files("pyfuser.codegen").joinpath("runtime_src", f"{part}.cuh").read_text(
        encoding="utf-8"
    )
    # Each part is pasted verbatim; a missing final newline would glue two lines together.
    return text if text.endswith("\n") else text + "\n"


@functools.cache
def _joined(parts: tuple[str, ...]) -> str:
    return "".join(_part_source(p) for p in parts)


def _closure(parts: list[str]) -> tuple[str, ...]:
    need: set[str] = set()
    stack = list(parts)
    while stack:
        p = stack.pop()
        if p not in need:
            need.add(p)
            stack.extend(DEPENDS[p])
    return tuple(p for p in PARTS if p in need)


def device_library_source(parts: list[str] | None = None) -> str:
    """Concatenated text of library parts, always in :data:`PARTS` order.

    ``parts=None`` means every part. Otherwise the requested parts plus the parts they depend on
    (:data:`DEPENDS`), each once, in :data:`PARTS` order; an empty list gives "". Unknown names
    raise ``ValueError``. The text has no ``#include`` and compiles with NVRTC for sm_90a with no
    include path. Cached.
    """
    if parts is None:
        return _with_torch_rules(_joined(PARTS))
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown device library part(s) {unknown}; known: {list(PARTS)}")
    return _with_torch_rules(_joined(_closure(list(parts))))


# types.cuh's constant for the e4m3fn overflow rule, as written there (torch 2.13's).
_E4M3_RULE = "constexpr bool kE4m3OverflowIsNan = false;"


def _with_torch_rules(text: str) -> str:
    """The library with the e4m3fn overflow rule of the torch installed beside the kernels (it
    changed in torch 2.13: NaN above 464 before, +-448 since); part of the kernel text, so of
    its cache key."""
    from ..ir.dtype import e4m3fn_overflow_is_nan
    if e4m3fn_overflow_is_nan():
        return text.replace(_E4M3_RULE, _E4M3_RULE.replace("false", "true"))
    return text


