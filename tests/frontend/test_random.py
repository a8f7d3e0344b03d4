"""Random numbers (fd.ops.uniform, normal, rand_like, randn_like; ir.exprs.RandOp): Philox4x32-10
against Random123's known answers; the reference evaluator and the generated kernels on the
interpreter draw the same bits for the same seed and offset; different seeds, offsets and ops
draw different numbers; the moments of large draws; seeds drawn from torch's generator when
none is given (torch.manual_seed repeats them); dropout's mask recomputed in the backward from
the forward's seed and offset; definition errors; the kernels compile."""
import math
import re

import numpy as np
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime import philox
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
F32, BF16, INT = DataType.Float, DataType.BFloat16, DataType.Int


@pytest.mark.parametrize("counter, key, want", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, want):
    """Random123's known-answer vectors of Philox4x32-10."""
    assert tuple(int(w) for w in philox.philox4x32_10(*counter, *key)) == want


def _seeded(build):
    """A fusion whose first two inputs are the seed and the offset of its random ops."""
    with FusionDefinition() as fd:
        seed, offset = fd.define_scalar(dtype=INT), fd.define_scalar(dtype=INT)
        build(fd, seed, offset)
    return fd


def _uniform_and_normal(fd, seed, offset):
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.rand_like(x, rng_seed=seed, rng_offset=offset))
    fd.add_output(fd.ops.uniform(-2.0, 3.0, [37, 5], rng_seed=seed, rng_offset=offset,
                                 dtype=BF16))
    fd.add_output(fd.ops.randn_like(x, rng_seed=seed, rng_offset=offset))


def test_kernels_draw_the_references_bits():
    """The same seed and offset give the same numbers in the reference and in the generated
    kernels (interpreted), every output bit for bit."""
    fd = _seeded(_uniform_and_normal)
    inputs = [123456789012345, 77, torch.zeros(37, 53)]
    run_and_check(fd, inputs, kernels=0, options=INTERPRET)
    assert fd.last_run.kind == "kernels"
    for out, ref in zip(fd.execute(inputs, options=INTERPRET), evaluate(fd.fusion, inputs)):
        assert torch.equal(out, ref)


def test_a_16_bit_draw_takes_its_dtypes_bits():
    """rand_like of a bf16 tensor draws 8 random bits (multiples of 2^-8 below 1, exact in
    bf16, as torch draws it), of an fp16 one 11: never 1.0 by rounding."""
    for dtype, bits in ((torch.bfloat16, 8), (torch.float16, 11)):
        fd = _seeded(lambda fd, s, o: fd.add_output(fd.ops.rand_like(
            fd.define_tensor([-1], dtype=DataType.BFloat16 if bits == 8 else DataType.Half),
            rng_seed=s, rng_offset=o)))
        u, = fd.execute([3, 4, torch.zeros(100000, dtype=dtype)], options=INTERPRET)
        scaled = u.double() * 2 ** bits
        assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
        assert torch.equal(scaled, scaled.round()) and scaled.max() == 2 ** bits - 1


def test_seeds_offsets_and_ops_draw_apart():
    fd = _seeded(_uniform_and_normal)
    x = torch.zeros(37, 53)
    base = evaluate(fd.fusion, [5, 0, x])[0]
    assert torch.equal(base, evaluate(fd.fusion, [5, 0, x])[0])
    for seed, offset in ((6, 0), (5, 4), (5 + 2 ** 32, 0), (5, 2 ** 34)):
        other = evaluate(fd.fusion, [seed, offset, x])[0]
        assert (other != base).float().mean() > 0.99, (seed, offset)
    # As torch's, an offset counts draws in steps of 4: offsets 0 to 3 draw alike.
    assert torch.equal(evaluate(fd.fusion, [5, 3, x])[0], base)
    # Two random ops of one fusion are two streams (op k draws at offset + k).
    fd2 = _seeded(lambda fd, s, o: [fd.add_output(fd.ops.uniform(0, 1, [1000], rng_seed=s,
                                                                  rng_offset=o))
                                    for _ in range(2)])
    a, b = evaluate(fd2.fusion, [5, 0])
    assert (a != b).float().mean() > 0.99


def test_the_moments_of_large_draws():
    """Mean and variance of 2^20 draws within 6 standard errors; uniform in [low, high)."""
    n = 2 ** 20
    index = np.arange(n)
    u = philox.uniform(index, 2026, 11, -1.0, 3.0).astype(np.float64)
    assert u.min() >= -1.0 and u.max() < 3.0
    assert abs(u.mean() - 1.0) < 6 * math.sqrt(16 / 12 / n)
    assert abs(u.var() - 16 / 12) < 6 * math.sqrt((16 ** 2 / 80 - (16 / 12) ** 2) / n)
    z = philox.normal(index, 2026, 11, 0.5, 2.0).astype(np.float64)
    assert abs(z.mean() - 0.5) < 6 * 2.0 / math.sqrt(n)
    assert abs(z.var() - 4.0) < 6 * 4.0 * math.sqrt(2 / n)
    # The words are uniform bits too: each of the 32 bits set half the time.
    w = philox.words(index, 2026, 11, 1)[:, 0]
    for bit in range(32):
        assert abs(((w >> np.uint64(bit)) & np.uint64(1)).mean() - 0.5) < 6 * 0.5 / math.sqrt(n)


def test_seeds_come_from_torch_when_none_is_given():
    """rand_like without rng_seed: execute draws the seed from torch's generator (CPU here),
    so torch.manual_seed repeats a call and the next call draws other numbers; the drawn
    state (last_rng_state) reproduces the call in the reference evaluator."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        r = fd.ops.rand_like(x)
        y = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(fd.ops.mul(r, x), y))
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    torch.manual_seed(0)
    first = fd.execute([x, y], options=INTERPRET)[0]
    state = fd.last_rng_state
    torch.manual_seed(0)
    assert torch.equal(fd.execute([x, y], options=INTERPRET)[0], first)
    assert not torch.equal(fd.execute([x, y], options=INTERPRET)[0], first)
    ref = evaluate(fd.fusion, fd.complete_inputs([x, y], rng_state=state))[0]
    assert torch.equal(ref, first)
    with pytest.raises(InputError, match="takes 2 inputs, got 1 .* drawn by execute"):
        fd.execute([x], options=INTERPRET)


def _dropout(fd, seed, offset, keep):
    """where(rand < keep, t / keep, 0) of a new input t (dropout's forward, or its backward on
    the gradient with the forward's seed and offset)."""
    t = fd.define_tensor([-1, -1], dtype=BF16)
    r = fd.ops.rand_like(t, rng_seed=seed, rng_offset=offset)
    kept = fd.ops.lt(r, keep)
    y = fd.ops.where(kept, fd.ops.mul(fd.ops.cast(t, F32), 1.0 / keep), 0.0)
    fd.add_output(fd.ops.cast(y, BF16))
    fd.add_output(kept)


def test_dropout_backward_recomputes_the_forwards_mask():
    """The forward and the backward are two fusions given the same seed and offset: the
    backward's mask is the forward's, element for element; about keep of the elements stay."""
    keep = 0.9
    fwd = _seeded(lambda fd, s, o: _dropout(fd, s, o, keep))
    bwd = _seeded(lambda fd, s, o: _dropout(fd, s, o, keep))
    x, dy = torch.randn(129, 1000).bfloat16(), torch.randn(129, 1000).bfloat16()
    y, mask = fwd.execute([42, 7, x], options=INTERPRET)
    dx, mask_b = bwd.execute([42, 7, dy], options=INTERPRET)
    run_and_check(fwd, [42, 7, x], scheduler="pointwise", options=INTERPRET)
    assert torch.equal(mask, mask_b)
    assert abs(mask.float().mean().item() - keep) < 6 * math.sqrt(keep * (1 - keep) / x.numel())
    assert torch.equal(y, torch.where(mask, (x.float() / keep).bfloat16(), 0))
    assert torch.equal(dx, torch.where(mask, (dy.float() / keep).bfloat16(), 0))


@pytest.mark.parametrize("call, message", [
    (lambda fd, s: fd.ops.uniform(0, 1, [3], rng_seed=s, rng_offset=s, dtype=INT),
     "dtype must be floating"),
    (lambda fd, s: fd.ops.uniform(0, 1, [3], rng_seed=s), "give both rng_seed and rng_offset"),
    (lambda fd, s: fd.ops.normal(0, 1, [3, 0], rng_seed=s, rng_offset=s),
     "size 0 of dim 1 must be a positive int"),
    (lambda fd, s: fd.ops.uniform(0, 1, [3], rng_seed=1.5, rng_offset=s),
     "rng_seed must be an int scalar"),
    (lambda fd, s: fd.ops.uniform(fd.define_tensor([3]), 1, [3], rng_seed=s, rng_offset=s),
     "must be a number"),
])
def test_definition_errors(call, message):
    with pytest.raises(FusionDefinitionError, match=message):
        with FusionDefinition() as fd:
            call(fd, fd.define_scalar(dtype=INT))


def test_the_kernels_compile():
    """NVRTC compiles the Philox draws (uniform and normal) for sm_90a without spills."""
    fd = _seeded(_uniform_and_normal)
    plan = fd.explain([1, 2, torch.empty(8192, 4096, device="meta")], compile=True)
    for seg in plan.segments:
        assert "pf::philox_" in seg.kernel.kernel.source
        assert re.search(r"0 B spill stores, 0 B spill loads", seg.kernel.ptxas), seg.kernel.ptxas


def test_uniform_draws_stay_below_high():
    """A value that rounds to `high` in the output dtype is `low` (as torch folds it): bf16
    uniform(1, 2) rounds 1 + u near 2 up to 2.0 about once in 256 draws; a float64 draw maps u
    in double, so it never falls below `low`."""
    index = np.arange(2 ** 18)
    v = philox.uniform(index, 9, 0, 1.0, 2.0, "bfloat16")
    assert v.max() < 2.0 and v.min() >= 1.0
    d = philox.uniform(index, 9, 0, 0.7, 0.8, "float64")
    assert d.dtype == np.float64 and d.min() >= 0.7 and d.max() < 0.8
    fd = _seeded(lambda fd, s, o: fd.add_output(fd.ops.uniform(1.0, 2.0, [4096], rng_seed=s,
                                                              rng_offset=o, dtype=BF16)))
    out, = fd.execute([9, 0], options=INTERPRET)
    assert out.max() < 2.0 and torch.equal(out, evaluate(fd.fusion, [9, 0])[0])


def test_explain_keeps_the_last_drawn_state_and_run_and_check_uses_it():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(fd.ops.rand_like(x), x))
    x = torch.randn(1000)
    run_and_check(fd, [x], scheduler="pointwise", options=INTERPRET)
    state = fd.last_rng_state
    fd.explain([x])
    assert fd.last_rng_state == state


@pytest.mark.parametrize("shape", [(5, 7, 9), (5, 7, 16)])
def test_a_flat_loops_draw_index_has_no_division(shape):
    """In a flat loop over a dense [N, M, K] tensor the draw's row-major index is the flat index
    itself: (f / K / M) * M + (f / K) % M, times K, plus f % K folds to f (no runtime divisions
    per element), also where the vector lane is folded out of f % K (K = 16: a vector of 4
    draws from one Philox block); the interpreter's bits equal the reference's with it."""
    fd = _seeded(lambda fd, s, o: fd.add_output(fd.ops.mul(fd.ops.rand_like(
        fd.define_tensor([-1, -1, -1]), rng_seed=s, rng_offset=o), 2.0)))
    x = torch.zeros(*shape)
    seg, = fd.explain([1, 2, x]).segments
    source = seg.kernel.kernel.source
    if "pf::philox_uniform_vec<" in source:     # a vector of draws: (out, first index, ...)
        index = source.split("pf::philox_uniform_vec<float, 24, 4>(")[1].split(", ")[1]
    else:
        index = source.split("pf::philox_uniform<float, 24>(")[1].split(",")[0]
    assert "/" not in index and "%" not in index, index
    out, = fd.execute([1, 2, x], options=INTERPRET)
    assert torch.equal(out, evaluate(fd.fusion, [1, 2, x])[0])


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_a_vector_of_draws_shares_philox_blocks(dist):
    """Four consecutive uniform draws (two normal ones) come from one Philox block: a
    vectorized flat loop draws them together (pf::philox_*_vec, one block per 4 or 2), from a
    first index that is a multiple of 4; the bits equal the reference's (uniform) on the
    interpreter."""
    fd_op = "rand_like" if dist == "uniform" else "randn_like"
    fd = _seeded(lambda fd, s, o: fd.add_output(getattr(fd.ops, fd_op)(
        fd.define_tensor([-1, -1], dtype=DataType.BFloat16), rng_seed=s, rng_offset=o)))
    x = torch.zeros(6, 24).bfloat16()
    seg, = fd.explain([3, 8, x]).segments
    source = seg.kernel.kernel.source
    want = "pf::philox_uniform_vec<" if dist == "uniform" else "pf::philox_normal_vec<"
    assert want in source, source
    out, = fd.execute([3, 8, x], options=INTERPRET)
    ref = evaluate(fd.fusion, [3, 8, x])[0]
    if dist == "uniform":
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref)
