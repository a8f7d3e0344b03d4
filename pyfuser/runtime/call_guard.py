"""The cached call's signature check, done in C++ by torch's own tensor guards.

Why: a cached call must find its plan from the inputs' signature (executor.FusionExecutorCache
keys plans on each tensor's dtype, sizes, strides, device and pointer alignment). Reading those
from Python costs five attribute reads per tensor, 0.7 us each on the GPU machine's host, a
tenth of the whole call. torch.compile faces the same question before it reuses a graph, and
answers it with `torch._C._dynamo.guards.TensorGuards`: one C++ call that compares dtype,
device, dispatch keys (the device type among them, and autograd's), requires_grad, sizes and
strides of every tensor against the ones it was built from.

What a guard may and may not do: it may refuse a call whose key equals the plan's (a tensor
that requires grad, a subclass, an inference tensor: the executor's dict look-up then finds the
plan), but it must never pass a call whose key differs, apart from the pointers' alignment,
which the plan itself checks as it reads the pointers (executor._KernelPlan.run_if_aligned).
tests/runtime/test_call_guard.py checks both against the executor's key.

The guard is private torch API: where torch lacks it or it refuses the inputs, `tensor_guard`
returns None and every call takes the dict look-up, as before.
"""
from __future__ import annotations

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:           # an older or newer torch without it: the look-up serves every call
    _TensorGuards = None


def tensor_guard(tensors):
    """A `check(*tensors) -> bool` that passes only tensors of the dtypes, devices, sizes and
    strides of `tensors` (one each, in order; a wrong count raises TypeError), or None where
    torch offers no such guard."""
    if _TensorGuards is None:
        return None
    try:
        guard = _TensorGuards(
            *tensors,
            dynamic_dims_sizes=[[int(s) for s in t.shape] for t in tensors],
            dynamic_dims_strides=[[int(s) for s in t.stride()] for t in tensors])
        check = guard.check
        if not check(*tensors):     # a guard that refuses its own tensors serves no call
            return None
    except Exception:
        return None
    return check
