"""top-k (fd.ops.topk, ir.exprs.TopKOp): a block top-k kernel along the innermost dim
(tests/schedule/test_topk_kernel.py), elsewhere the library op run by torch.topk, a segment of
its own in the plan, whose values and int64 indices feed the kernels after it; the reference
evaluator against torch; k constant or a runtime scalar; definition errors."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


def _distinct(*shape):
    """Values without ties (torch orders tied values as it likes)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n).float() / n).reshape(shape)


@pytest.mark.parametrize("dim, largest", [(-1, True), (0, False), (1, True)])
def test_matches_torch(dim, largest):
    x = _distinct(37, 53)
    with FusionDefinition() as fd:
        values, indices = fd.ops.topk(fd.from_pytorch(x), 5, dim, largest)
        fd.add_output(values)
        fd.add_output(indices)
    want = torch.topk(x, 5, dim, largest=largest)
    got = evaluate(fd.fusion, [x])
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    if dim % 2 == 1:    # along the innermost dim: the top-k kernel
        run_and_check(fd, [x], scheduler="topk", options=INTERPRET)
    else:
        run_and_check(fd, [x], kernels=0, options=INTERPRET, segments=(("library", "topk"),))
    out = fd.execute([x], options=INTERPRET)
    assert torch.equal(out[0], want.values) and torch.equal(out[1], want.indices)


def test_sampling_step_around_a_library_topk():
    """softmax(x / t) then top-k then a kernel on its values and indices: the plan is a
    kernel, the library topk, and a kernel; k a runtime scalar."""
    x = _distinct(8, 1000)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        k = fd.define_scalar(dtype=DataType.Int)
        scaled = fd.ops.mul(tx, 1.5)
        e = fd.ops.exp(fd.ops.sub(scaled, fd.ops.max(scaled, [1], keepdim=True)))
        p = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        values, indices = fd.ops.topk(p, k, 1)
        fd.add_output(fd.ops.div(values, fd.ops.sum(values, [1], keepdim=True)))
        fd.add_output(fd.ops.mul(indices, 2))
    run_and_check(fd, [x, 7], kernels=0, options=INTERPRET)
    kinds = [(s.kind, s.name) for s in fd.last_run.segments]
    assert ("library", "topk") in kinds and all(k != "reference" for k, _ in kinds), kinds
    out = fd.execute([x, 7], options=INTERPRET)
    assert out[0].shape == (8, 7) and torch.equal(out[1], 2 * torch.topk(x, 7, 1).indices)


@pytest.mark.parametrize("call, message", [
    (lambda fd, x: fd.ops.topk(x, -1), "k -1 must be an int >= 0"),
    (lambda fd, x: fd.ops.topk(x, 8), "k 8 is more than dim 1's 7 elements"),
    (lambda fd, x: fd.ops.topk(x, 2, 2), "dim 2 out of range"),
    (lambda fd, x: fd.ops.topk(fd.ops.gt(x, 0.0), 2), "bool tensors have no order"),
])
def test_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_tensor([3, 7]))


def test_k_0_gives_empty_values_and_indices():
    """torch.topk(x, 0) is allowed: empty values and int64 indices of the right shape."""
    x = torch.randn(3, 7)
    with FusionDefinition() as fd:
        values, indices = fd.ops.topk(fd.from_pytorch(x), 0, 1)
        fd.add_output(values)
        fd.add_output(indices)
    v, i = fd.execute([x], options=INTERPRET)
    assert v.shape == (3, 0) and i.shape == (3, 0) and i.dtype == torch.int64
