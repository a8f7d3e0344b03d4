"""cumsum and cumprod (fd.ops.cumsum / cumprod, ir.exprs.ScanOp) at the frontend: torch's dtypes
(int64 for integer and bool inputs, 16-bit floats summed in float32), the reference against
torch, definition errors. The block-scan kernel is tested in tests/schedule/test_scan_kernel.py."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}


@pytest.mark.parametrize("name, dim, dtype", [("cumsum", 1, torch.float32),
                                              ("cumsum", 0, torch.int32),
                                              ("cumprod", -1, torch.bfloat16),
                                              ("cumsum", -1, torch.bool)])
def test_matches_torch(name, dim, dtype):
    x = (torch.rand(37, 53) * 2).to(dtype) if dtype != torch.bool else torch.rand(37, 53) > 0.5
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(x), dim))
    want = getattr(torch, name)(x, dim)
    got = evaluate(fd.fusion, [x])[0]
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    # The cast to int64 of an integer input and the scan: one scan kernel. dim 0 is not the
    # innermost: the library op, after the cast's kernel.
    if dim == 0:
        run_and_check(fd, [x], kernels=0, options=INTERPRET,
                      segments=(("kernel", "pointwise"), ("library", "scan")))
    else:
        run_and_check(fd, [x], scheduler="scan", options=INTERPRET)


def test_top_p_mask_after_a_softmax():
    """softmax, cumsum of the probabilities, then the mask: the softmax's statistics (one
    logsumexp reduction), then the scan kernel with the softmax and the mask fused (a reduction
    beside a scan is not one kernel yet). The split's plan (schedule/split_normalizations.py)
    stores a key per row between them where the segmenter's (the softmax's kernel, then the
    scan) stores the probabilities."""
    x = torch.randn(8, 1000)
    with FusionDefinition() as fd:
        tx = fd.from_pytorch(x)
        e = fd.ops.exp(fd.ops.sub(tx, fd.ops.max(tx, [1], keepdim=True)))
        p = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        fd.add_output(fd.ops.lt(fd.ops.cumsum(p, 1), 0.9))
    run_and_check(fd, [x], kernels=0, options=INTERPRET, segments=(
        ("kernel", "reduction"), ("kernel", "scan")))
    assert fd.last_run.reason.startswith("normalization split")


def test_definition_errors():
    with pytest.raises(FusionDefinitionError, match="dim 2 out of range for rank 2"):
        with FusionDefinition() as fd:
            fd.ops.cumsum(fd.define_tensor([3, 7]), 2)
