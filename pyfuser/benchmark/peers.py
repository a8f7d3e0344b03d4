"""The peers pyfuser is measured against, per catalogue fusion (entry points of ANCHORS.md).

Each builder takes the inputs and eps and returns a zero-argument callable, or raises: a peer
that cannot be imported or does not support the case is reported as missing, never dropped.
"""
from __future__ import annotations

import functools


class PeerMissing(RuntimeError):
    pass


def _F():
    import torch.nn.functional as F
    return F


@functools.lru_cache(maxsize=None)
def _compiled(name, eps):
    """One compiled function per fusion: every input set of a case reuses it (a new wrapper per
    set made dynamo recompile until its limit and fall back to slow paths)."""
    import torch

    from .. import catalogue
    entry = catalogue.get(name)
    return torch.compile(lambda *ins: entry.torch_reference(list(ins), eps), dynamic=False)


# Eager ------------------------------------------------------------------------------------------
def _eager(name, ins, eps):
    import torch
    F = _F()
    if name == "gelu_bias":
        x, b = ins
        return lambda: F.gelu(x + b, approximate="tanh")
    if name == "silu_mul":
        a, b = ins
        return lambda: F.silu(a) * b
    if name == "row_sum":
        return lambda: ins[0].sum(1)
    if name == "col_sum":
        return lambda: ins[0].sum(0)
    if name == "mse_mean":
        p, t = ins
        return lambda: F.mse_loss(p, t)
    if name == "amax_scale":
        x = ins[0]
        return lambda: x * (448.0 / x.abs().amax())
    if name == "softmax":
        return lambda: torch.softmax(ins[0], -1)
    if name == "softmax_dim0":
        return lambda: torch.softmax(ins[0], 0)
    if name == "log_softmax":
        return lambda: torch.log_softmax(ins[0], -1)
    if name == "rmsnorm_fwd":
        x, w = ins
        return lambda: F.rms_norm(x, (x.shape[-1],), w, eps)
    if name == "add_rmsnorm_fwd":
        x, r, w = ins

        def fn():
            h = x + r
            return F.rms_norm(h, (x.shape[-1],), w, eps), h
        return fn
    if name == "layernorm_fwd":
        x, w, b = ins
        return lambda: F.layer_norm(x, (x.shape[-1],), w, b, eps)
    if name in ("rmsnorm_bwd", "layernorm_bwd"):
        return _autograd_bwd(name, ins, eps, lambda x, w, b: (
            F.rms_norm(x, (x.shape[-1],), w, eps) if b is None
            else F.layer_norm(x, (x.shape[-1],), w, b, eps)))
    raise PeerMissing(f"no eager form of {name}")


def _autograd_bwd(name, ins, eps, forward):
    """Backward kernels only: the forward graph is built once, grad() is what is timed."""
    import torch
    x, dy, w = ins[0], ins[1], ins[2]
    xg = x.detach().requires_grad_(True)
    wg = w.detach().requires_grad_(True)
    bg = None
    if name == "layernorm_bwd":
        bg = torch.zeros_like(w).requires_grad_(True)
    y = forward(xg, wg, bg)
    leaves = [xg, wg] + ([bg] if bg is not None else [])
    return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


# torch.compile ----------------------------------------------------------------------------------
def _compile(name, ins, eps):
    fn = _compiled(name, eps)
    return lambda: fn(*ins)


# Liger --------------------------------------------------------------------------------------------
def _liger(name, ins, eps):
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # noqa: BLE001 - any import failure means the peer is missing
        raise PeerMissing(f"liger_kernel not importable: {e}") from None
    if name == "rmsnorm_fwd":
        x, w = ins
        return lambda: LigerRMSNormFunction.apply(x, w, eps)
    if name == "layernorm_fwd":
        x, w, b = ins
        return lambda: LigerLayerNormFunction.apply(x, w, b, eps)
    if name == "rmsnorm_bwd":
        return _autograd_bwd(name, ins, eps, lambda x, w, b: LigerRMSNormFunction.apply(x, w, eps))
    if name == "layernorm_bwd":
        return _autograd_bwd(name, ins, eps,
                             lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, eps))
    raise PeerMissing(f"Liger has no {name}")


# Quack ----------------------------------------------------------------------------------------------
def _quack(name, ins, eps):
    try:
        import quack  # noqa: F401
    except Exception as e:  # noqa: BLE001
        raise PeerMissing(f"quack not importable: {e}") from None
    if name == "softmax":
        from quack.softmax import softmax
        return lambda: softmax(ins[0])
    if name == "rmsnorm_fwd":
        from quack.rmsnorm import rmsnorm_fwd
        x, w = ins
        return lambda: rmsnorm_fwd(x, w, eps=eps)
    if name == "add_rmsnorm_fwd":
        from quack.rmsnorm import rmsnorm_fwd
        x, r, w = ins
        return lambda: rmsnorm_fwd(x, w, residual=r, eps=eps)
    if name == "rmsnorm_bwd":
        from quack.rmsnorm import rmsnorm_bwd
        x, dy, w, rstd = ins
        r = rstd.reshape(-1).contiguous()
        return lambda: rmsnorm_bwd(x, w, dy, r)
    if name == "layernorm_fwd":
        from quack.rmsnorm import layernorm_fwd
        x, w, b = ins
        wf, bf = w.float(), b.float()
        return lambda: layernorm_fwd(x, wf, bf, eps=eps)
    if name == "layernorm_bwd":
        from quack.rmsnorm import layernorm_bwd
        x, dy, w, mean, rstd = ins
        wf = w.float()
        m, r = mean.reshape(-1).contiguous(), rstd.reshape(-1).contiguous()
        return lambda: layernorm_bwd(x, wf, dy, r, m)
    raise PeerMissing(f"Quack has no {name}")


PEERS = {"eager": _eager, "compile": _compile, "liger": _liger, "quack": _quack}


@functools.lru_cache(maxsize=None)
def peer_names() -> tuple[str, ...]:
    return tuple(PEERS)
