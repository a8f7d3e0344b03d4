"""The guarded call on the GPU (runtime/call_guard.py): a second call with the signature of the
first skips the key and the look-up, and still computes right on its own inputs, for a lean
plan (RMSNorm), a plan with tile maps (a matmul), one with index checks (index_select, an
index out of range raised at the next call) and one with a scalar input; a call whose input
is aligned otherwise takes the look-up and is right too. Outputs are checked against float64,
and the second call is new inputs' (the first call's values would pass a stale pointer)."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition, check_index_errors
from pyfuser.runtime.index_check import IndexOutOfRange

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F32, BF16 = DataType.Float, DataType.BFloat16


def _no_key(fd, monkeypatch):
    def forbidden(*a, **kw):
        raise AssertionError("the key was computed: the call did not take the guarded call")
    monkeypatch.setattr(fd._executor, "_key", forbidden)


def _rmsnorm():
    with FusionDefinition("rmsnorm") as fd:
        x = fd.define_tensor([-1, -1], dtype=BF16)
        w = fd.define_tensor([-1], dtype=BF16)
        xf = fd.ops.cast(x, F32)
        ms = fd.ops.mean(fd.ops.mul(xf, xf), [1], keepdim=True)
        y = fd.ops.mul(fd.ops.mul(xf, fd.ops.rsqrt(fd.ops.add(ms, 1e-6))), fd.ops.cast(w, F32))
        fd.add_output(fd.ops.cast(y, BF16))
    return fd


def _rmsnorm_ref(x, w):
    xd = x.double()
    return xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-6) * w.double()


def test_a_lean_plan(monkeypatch):
    fd = _rmsnorm()
    x, w = torch.randn(37, 1024, device="cuda").bfloat16(), torch.randn(1024, device="cuda").bfloat16()
    fd.execute([x, w])
    assert fd._executor.guarded_call is not None and fd._executor._guarded_plan.lean
    x2, w2 = torch.randn_like(x), torch.randn_like(w)
    with monkeypatch.context() as m:
        _no_key(fd, m)
        (y,) = fd.execute([x2, w2])
    torch.testing.assert_close(y.double(), _rmsnorm_ref(x2, w2), rtol=2e-2, atol=2e-2)
    # an input 2 bytes off the plan's alignment: the look-up, another plan, still right
    buf = torch.randn(37 * 1024 + 1, device="cuda").bfloat16()
    x3 = buf[1:].view(37, 1024)
    (y3,) = fd.execute([x3, w2])
    torch.testing.assert_close(y3.double(), _rmsnorm_ref(x3, w2), rtol=2e-2, atol=2e-2)
    (y4,) = fd.execute([x2, w2])      # and back to the first plan
    torch.testing.assert_close(y4, y)


def test_a_matmul_with_tile_maps(monkeypatch):
    with FusionDefinition("linear") as fd:
        a = fd.define_tensor([-1, -1], dtype=BF16)
        b = fd.define_tensor([-1, -1], dtype=BF16)
        fd.add_output(fd.ops.linear(a, b))
    x, w = torch.randn(300, 256, device="cuda").bfloat16(), torch.randn(264, 256, device="cuda").bfloat16()
    fd.execute([x, w])
    assert fd.last_run.schedulers == ("matmul",)
    assert fd._executor.guarded_call is not None
    x2, w2 = torch.randn_like(x), torch.randn_like(w)
    with monkeypatch.context() as m:
        _no_key(fd, m)
        (y,) = fd.execute([x2, w2])
    torch.testing.assert_close(y.double(), x2.double() @ w2.double().t(), rtol=2e-2, atol=1e-1)


def test_index_checks_still_raise(monkeypatch):
    with FusionDefinition("select") as fd:
        a = fd.define_tensor([-1, -1], dtype=F32)
        i = fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.index_select(a, i, 0))
    x = torch.randn(1031, 77, device="cuda")
    idx = torch.randint(0, 1031, (333,), device="cuda")
    fd.execute([x, idx])
    assert fd._executor.guarded_call is not None
    x2, idx2 = torch.randn_like(x), torch.randint(0, 1031, (333,), device="cuda")
    with monkeypatch.context() as m:
        _no_key(fd, m)
        (y,) = fd.execute([x2, idx2])
        torch.testing.assert_close(y, x2[idx2])
        bad = idx2.clone()
        bad[100] = 1031
        fd.execute([x2, bad])
        with pytest.raises(IndexOutOfRange, match="1031"):
            check_index_errors()
    (y,) = fd.execute([x2, idx2])      # the context lives on
    torch.testing.assert_close(y, x2[idx2])


def test_a_scalar_input(monkeypatch):
    with FusionDefinition("scale") as fd:
        a = fd.define_tensor([-1], dtype=F32)
        s = fd.define_scalar(dtype=F32)
        fd.add_output(fd.ops.mul(a, s))
    x = torch.randn(100003, device="cuda")
    fd.execute([x, 2.0])
    assert fd._executor.guarded_call is not None
    with monkeypatch.context() as m:
        _no_key(fd, m)
        for value in (3.5, -0.25):
            x2 = torch.randn_like(x)
            (y,) = fd.execute([x2, value])
            torch.testing.assert_close(y, x2 * value)
    (y,) = fd.execute([x, 3])     # an int: another key, the look-up
    torch.testing.assert_close(y, x * 3)
