"""Random numbers on the GPU: uniform draws equal the reference evaluator's bit for bit (the
device library's Philox is runtime/philox.py's), normal draws to float32 rounding; seeds from
torch's CUDA generator when none is given (torch.cuda.manual_seed repeats a call, the offset
advances as torch advances it); dropout's forward and backward masks equal."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

INT, BF16 = DataType.Int, DataType.BFloat16


def _draws():
    with FusionDefinition() as fd:
        seed, offset = fd.define_scalar(dtype=INT), fd.define_scalar(dtype=INT)
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.rand_like(x, rng_seed=seed, rng_offset=offset))
        fd.add_output(fd.ops.uniform(-2.0, 3.0, [1031, 777], rng_seed=seed, rng_offset=offset,
                                     dtype=BF16))
        fd.add_output(fd.ops.randn_like(x, rng_seed=seed, rng_offset=offset))
    return fd


def test_uniform_bits_equal_the_reference_and_normal_draws_are_close():
    fd = _draws()
    inputs = [2 ** 40 + 3, 12345, torch.zeros(1031, 777, device="cuda")]
    outs = fd.execute(inputs)
    run_and_check(fd, inputs, kernels=0)
    assert fd.last_run.kind == "kernels"
    refs = evaluate(fd.fusion, inputs)
    assert torch.equal(outs[0], refs[0]) and torch.equal(outs[1], refs[1])
    torch.testing.assert_close(outs[2], refs[2])


def test_seeds_from_the_cuda_generator():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.mul(fd.ops.rand_like(x), x))
    x = torch.randn(129, 1000, device="cuda")
    torch.cuda.manual_seed(7)
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    start = gen.get_offset()
    first = fd.execute([x])[0]
    assert fd.last_rng_state == (7, start) and gen.get_offset() == start + 4
    assert not torch.equal(fd.execute([x])[0], first)
    torch.cuda.manual_seed(7)
    assert torch.equal(fd.execute([x])[0], first)
    ref = evaluate(fd.fusion, fd.complete_inputs([x], rng_state=fd.last_rng_state))[0]
    assert torch.equal(first, ref)


def test_dropout_masks_of_forward_and_backward_are_equal():
    def dropout():
        with FusionDefinition() as fd:
            seed, offset = fd.define_scalar(dtype=INT), fd.define_scalar(dtype=INT)
            t = fd.define_tensor([-1, -1], dtype=BF16)
            keep = fd.ops.lt(fd.ops.rand_like(t, rng_seed=seed, rng_offset=offset), 0.9)
            fd.add_output(fd.ops.cast(fd.ops.where(keep, fd.ops.mul(fd.ops.cast(
                t, DataType.Float), 1 / 0.9), 0.0), BF16))
            fd.add_output(keep)
        return fd
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    dy = torch.randn(8192, 4096, device="cuda").bfloat16()
    fwd, bwd = dropout(), dropout()
    _, mask = fwd.execute([11, 22, x])
    _, mask_b = bwd.execute([11, 22, dy])
    run_and_check(fwd, [11, 22, x], scheduler="pointwise")
    assert torch.equal(mask, mask_b)
    # A bf16 draw is k / 256 for k uniform in [0, 256) (runtime/philox.py), so u < 0.9 keeps
    # k <= 230: 231 / 256 = 0.9023, not 0.9 (torch's CUDA bf16 rand_like keeps the same share:
    # float32 draws rounded to bf16, with 1.0 folded to 0). 5 standard deviations of 33.5M
    # draws: 2.6e-4.
    assert abs(mask.float().mean().item() - 231 / 256) < 2.6e-4


def test_float32_draws_keep_the_share_asked_for():
    """Dropout drawn in float32 (24-bit draws): u < 0.9 keeps 0.9 of the elements, within 5
    standard deviations of 33.5M draws."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=BF16)
        fd.add_output(fd.ops.lt(fd.ops.rand_like(fd.ops.cast(t, DataType.Float)), 0.9))
    keep, = fd.execute([torch.zeros(8192, 4096, device="cuda").bfloat16()])
    assert abs(keep.float().mean().item() - 0.9) < 2.6e-4
