"""In-place outputs: fd.add_output(t, alias_input=x) writes t into x's storage and, as in
nvFuser, does not return t (unless it is also added as a plain output). Checked on the
reference path and on the kernel-IR interpreter against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.frontend.ops import FusionDefinitionError
from pyfuser.runtime.inputs import InputError
from pyfuser.runtime.reference import evaluate
from pyfuser.testing import run_and_check

INTERPRET = {"enable": ["interpret"]}
LR, B1, B2, EPS, WD, STEP = 1e-2, 0.9, 0.999, 1e-8, 0.01, 3


def _adamw(return_p: bool = False):
    """One AdamW step updating p, m and v in place (g read only)."""
    with FusionDefinition("adamw") as fd:
        p, g, m, v = (fd.define_tensor([-1, -1], dtype=DataType.Float) for _ in range(4))
        m2 = fd.ops.add(fd.ops.mul(m, B1), fd.ops.mul(g, 1 - B1))
        v2 = fd.ops.add(fd.ops.mul(v, B2), fd.ops.mul(fd.ops.mul(g, g), 1 - B2))
        m_hat = fd.ops.div(m2, 1 - B1 ** STEP)
        v_hat = fd.ops.div(v2, 1 - B2 ** STEP)
        upd = fd.ops.add(fd.ops.div(m_hat, fd.ops.add(fd.ops.sqrt(v_hat), EPS)),
                         fd.ops.mul(p, WD))
        p2 = fd.ops.sub(p, fd.ops.mul(upd, LR))
        fd.add_output(p2, alias_input=p)
        fd.add_output(m2, alias_input=m)
        fd.add_output(v2, alias_input=v)
        if return_p:
            fd.add_output(p2)
    return fd


def _adamw_float64(p, g, m, v):
    p, g, m, v = (t.double() for t in (p, g, m, v))
    m2 = B1 * m + (1 - B1) * g
    v2 = B2 * v + (1 - B2) * g * g
    upd = (m2 / (1 - B1 ** STEP)) / ((v2 / (1 - B2 ** STEP)).sqrt() + EPS) + WD * p
    return p - LR * upd, m2, v2


def _state(shape=(37, 129), seed=0):
    gen = torch.Generator().manual_seed(seed)
    p, g, m = (torch.randn(shape, generator=gen) for _ in range(3))
    v = torch.rand(shape, generator=gen)
    return [p, g, m, v]


@pytest.mark.parametrize("options", [None, INTERPRET], ids=["reference", "interpret"])
def test_adamw_step_updates_p_m_v_in_place(options):
    fd = _adamw()
    ins = _state()
    ptrs = [t.data_ptr() for t in ins]
    g_before = ins[1].clone()
    want = _adamw_float64(*ins)
    outs = fd.execute(ins, options=options)
    assert outs == []                                  # in-place outputs are not returned
    if options:
        assert fd.last_run.kind == "kernels" and fd.last_run.backend == "interpreter"
    assert [t.data_ptr() for t in ins] == ptrs         # the same storage, updated
    assert torch.equal(ins[1], g_before)
    for got, ref in zip((ins[0], ins[2], ins[3]), want):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    # A second step reads the updated state.
    want2 = _adamw_float64(*ins)
    fd.execute(ins, options=options)
    for got, ref in zip((ins[0], ins[2], ins[3]), want2):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_run_and_check_compares_updated_inputs_on_the_interpreter():
    fd = _adamw(return_p=True)
    ins = _state((5, 8), seed=1)
    (p_out,) = run_and_check(fd, ins, scheduler="pointwise", options=INTERPRET)
    assert torch.equal(p_out, ins[0])                  # returned and written


def test_an_output_also_added_plainly_is_returned():
    fd = _adamw(return_p=True)
    # p2, added plainly after its alias, moves last (its place among the returned outputs)
    # and is returned; m2 and v2 stay hidden.
    assert fd.fusion.hidden_outputs == {0, 1}
    assert fd.fusion.output_aliases == {2: 0, 0: 2, 1: 3}
    ins = _state((3, 4), seed=2)
    want = _adamw_float64(*ins)
    (p_out,) = fd.execute(ins)
    torch.testing.assert_close(p_out.double(), want[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(p_out, ins[0]) and p_out.data_ptr() != ins[0].data_ptr()


def test_evaluate_all_outputs_writes_nothing():
    fd = _adamw()
    ins = _state((3, 4), seed=3)
    copies = [t.clone() for t in ins]
    every = evaluate(fd.fusion, ins, promote_to_double=True, all_outputs=True)
    assert len(every) == 3 and all(torch.equal(a, b) for a, b in zip(ins, copies))
    assert evaluate(fd.fusion, ins) == []
    assert not torch.equal(ins[0], copies[0])


@pytest.mark.parametrize("options", [None, INTERPRET], ids=["reference", "interpret"])
def test_a_returned_copy_of_the_input_keeps_the_old_values(options):
    """y = set(x) returned beside x + 1 written into x: y holds x before the update (the
    reference evaluator computes a set as the input tensor itself)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.set(x))
        fd.add_output(fd.ops.add(x, 1.0), alias_input=x)
    t = torch.arange(6, dtype=torch.float32)
    (y,) = fd.execute([t], options=options)
    assert torch.equal(y, torch.arange(6, dtype=torch.float32))
    assert torch.equal(t, torch.arange(6, dtype=torch.float32) + 1)


def test_an_input_written_into_another_input():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=DataType.Float)
        b = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(a, alias_input=b)
        fd.add_output(fd.ops.mul(a, 2.0))
    ta, tb = torch.randn(5), torch.zeros(5)
    (out,) = fd.execute([ta, tb], options=INTERPRET)
    assert torch.equal(tb, ta) and torch.equal(out, ta * 2)


def test_running_statistics_bf16_update_on_the_interpreter():
    """A running mean [1, C] updated in place beside the returned batch mean (bf16 storage),
    in the reduction scheduler's kernel."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        rm = fd.define_tensor([1, -1], dtype=DataType.BFloat16)
        mean = fd.ops.mean(fd.ops.cast(x, DataType.Float), dims=[0], keepdim=True)
        new_rm = fd.ops.add(fd.ops.mul(fd.ops.cast(rm, DataType.Float), 0.9),
                            fd.ops.mul(mean, 0.1))
        fd.add_output(fd.ops.cast(new_rm, DataType.BFloat16), alias_input=rm)
        fd.add_output(mean)
    xs = torch.randn(64, 33).bfloat16()
    rms = torch.randn(1, 33).bfloat16()
    want = (rms.double() * 0.9 + xs.double().mean(0, keepdim=True) * 0.1)
    run_and_check(fd, [xs, rms], scheduler="reduction", options=INTERPRET)
    torch.testing.assert_close(rms.double(), want, rtol=1e-2, atol=1e-2)


# Errors ----------------------------------------------------------------------------------------
def _define_error(body) -> str:
    with pytest.raises(FusionDefinitionError) as e:
        with FusionDefinition() as fd:
            body(fd)
    return str(e.value)


def test_alias_errors():
    def not_an_input(fd):
        x = fd.define_tensor([-1])
        y = fd.ops.add(x, 1.0)
        fd.add_output(fd.ops.add(y, 1.0), alias_input=y)
    assert "not a tensor input" in _define_error(not_an_input)

    def dtype(fd):
        x = fd.define_tensor([-1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.cast(x, DataType.Float), alias_input=x)
    assert "has its input's dtype" in _define_error(dtype)

    def rank(fd):
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]), alias_input=x)
    assert "rank 1" in _define_error(rank)

    def static_size(fd):
        x = fd.define_tensor([4])
        y = fd.define_tensor([5])
        fd.add_output(fd.ops.add(y, 1.0), alias_input=x)
    assert "size 5" in _define_error(static_size)

    def broadcast(fd):
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1], keepdim=True), alias_input=x)
    assert "broadcast" in _define_error(broadcast)

    def expanded(fd):
        x = fd.define_tensor([-1, -1], expanded=[False, True])
        fd.add_output(fd.ops.add(x, 1.0), alias_input=x)
    assert "expanded" in _define_error(expanded)

    def twice_into_one(fd):
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(x, 1.0), alias_input=x)
        fd.add_output(fd.ops.add(x, 2.0), alias_input=x)
    assert "two outputs cannot be written into one input" in _define_error(twice_into_one)

    def one_into_two(fd):
        x = fd.define_tensor([-1])
        z = fd.define_tensor([-1])
        y = fd.ops.add(x, 1.0)
        fd.add_output(y, alias_input=x)
        fd.add_output(y, alias_input=z)
    assert "already written into input" in _define_error(one_into_two)

    def other_fusion(fd):
        with FusionDefinition() as other:
            o = other.define_tensor([-1])
            other.add_output(other.ops.add(o, 1.0))
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(x, 1.0), alias_input=o)
    assert "another fusion" in _define_error(other_fusion)


def test_symbolic_size_mismatch_is_an_input_error():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        y = fd.define_tensor([-1])
        fd.add_output(fd.ops.add(y, 1.0), alias_input=x)
    with pytest.raises(InputError, match="in-place output"):
        fd.execute([torch.zeros(4), torch.zeros(5)])


def _alias_beside_a_full_sum(fd):
    """An in-place update (a column sum into `acc`) beside a full sum: a reduction kernel (the
    update its epilogue) and a full-reduction kernel or a reference segment."""
    x = fd.define_tensor([-1, -1])
    acc = fd.define_tensor([-1])
    col = fd.ops.sum(x, [0])
    fd.add_output(fd.ops.add(fd.ops.mul(acc, 0.9), col), alias_input=acc)
    fd.add_output(fd.ops.sum(fd.ops.mul(col, col), [0]))


@pytest.mark.filterwarnings("ignore::pyfuser.runtime.executor.FallbackWarning")
@pytest.mark.parametrize("full_sum", ["kernel", "reference"])
def test_an_in_place_output_of_a_segmented_plan(full_sum, monkeypatch, isolated_cache):
    """The plan writes the in-place output after its segments; the segments' sub-fusions had
    kept the whole fusion's output_aliases, so the reference segment wrote its result into
    input 1 of its own inputs (it has one: an IndexError). The full sum is a reduction kernel
    now; with the reduction scheduler made to refuse full reductions (as before it had a
    schedule for them), it is the reference segment of that regression."""
    from pyfuser.schedule.schedulers import reduction
    from pyfuser.schedule.segmenter import segment

    if full_sum == "reference":
        takes = reduction.can_schedule
        monkeypatch.setattr(reduction, "can_schedule", lambda f: (False, "refused by this test")
                            if takes(f)[1].startswith("full") else takes(f))
    with FusionDefinition() as fd:
        _alias_beside_a_full_sum(fd)
    segs = segment(fd.fusion).segments
    last = ("kernel", "reduction") if full_sum == "kernel" else ("reference", "reference")
    assert [s.kind for s in segs] == ["kernel", last[0]]
    assert all(not s.fusion.output_aliases and not s.fusion.hidden_outputs for s in segs)
    gen = torch.Generator().manual_seed(2)
    x, acc = torch.randn(9, 20, generator=gen), torch.randn(20, generator=gen)
    want_acc = acc.double() * 0.9 + x.double().sum(0)
    (total,) = run_and_check(fd, [x, acc], kernels=2 if full_sum == "kernel" else 0,
                             options=INTERPRET, segments=(("kernel", "reduction"), last))
    torch.testing.assert_close(acc.double(), want_acc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total.double(), (x.double().sum(0) ** 2).sum(), rtol=1e-5,
                               atol=1e-4)
