"""Scheduling: primitives on TensorViews, transform propagation, and the schedulers.

Loop transforms (split, merge, reorder, parallelize) are TensorView methods; the primitives here
restructure the fusion around a tensor.
"""
from .allocation import pad_shared_rows, set_allocation_domain
from .cache import cache_after, cache_before, set_memory_type
from .circular_buffer import check_register_counts, circular_buffer
from .inlining import inline_at, inline_most, max_inline_position
from .rfactor import rfactor
from .transform_propagation import parallelize_like, propagate_transforms, replay

__all__ = [
    "cache_after", "cache_before", "check_register_counts", "circular_buffer", "inline_at",
    "inline_most", "max_inline_position", "pad_shared_rows", "parallelize_like", "propagate_transforms", "replay",
    "rfactor", "set_allocation_domain", "set_memory_type",
]
