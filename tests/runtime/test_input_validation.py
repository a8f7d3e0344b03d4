"""execute() checks its inputs against the definition: every error names the input and the
difference, and nothing is computed on a wrong input. Also fd.from_pytorch for unusual layouts."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition, InputError
from pyfuser.runtime import executor, reference


@pytest.fixture
def calls(monkeypatch):
    """Records every evaluation: a rejected input must leave it empty."""
    seen = []
    real = reference.evaluate

    def recording(*args, **kwargs):
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(executor, "evaluate", recording)
    monkeypatch.setattr(reference, "evaluate", recording)
    return seen


def _fusion():
    """T0 [i0, i1] + T1 [i2, 1] + T2 [i3, i4], times scalar s0 (float)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Float)
        y = fd.define_tensor([-1, 1], dtype=DataType.Float)
        z = fd.define_tensor([-1, -1], dtype=DataType.Float)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(fd.ops.add(fd.ops.add(x, y), z), s))
    return fd


def _good():
    return [torch.randn(4, 6), torch.randn(4, 1), torch.randn(4, 6), 2.0]


def _rejects(fd, inputs, calls, *fragments):
    with pytest.raises(InputError) as e:
        fd.execute(inputs)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert calls == [], "something was computed on a wrong input"
    return msg


def test_good_inputs_run(calls):
    fd = _fusion()
    inputs = _good()
    (out,) = fd.execute(inputs)
    torch.testing.assert_close(out, (inputs[0] + inputs[1] + inputs[2]) * 2.0)
    assert len(calls) == 1


def test_count(calls):
    fd = _fusion()
    msg = _rejects(fd, _good()[:3], calls, "the fusion takes 4 inputs, got 3",
                   "input 3 (scalar s0) is missing")
    _rejects(fd, _good() + [1.0], calls, "the fusion takes 4 inputs, got 5", "input 4")
    assert msg


def test_dtype(calls):
    fd = _fusion()
    inputs = _good()
    inputs[1] = inputs[1].double()
    _rejects(fd, inputs, calls, "input 1 (T1) has dtype torch.float64, the definition says "
                                "torch.float32")
    inputs = _good()
    inputs[2] = inputs[2].to(torch.complex64)  # not a pyfuser type at all
    _rejects(fd, inputs, calls, "input 2 (T2) has dtype torch.complex64")


def test_rank(calls):
    fd = _fusion()
    inputs = _good()
    inputs[1] = inputs[1][:, 0]
    _rejects(fd, inputs, calls, "input 1 (T1) has 1 dims, the definition says 2")
    inputs = _good()
    inputs[0] = inputs[0][None]
    _rejects(fd, inputs, calls, "input 0 (T0) has 3 dims, the definition says 2")


def test_broadcast_size(calls):
    fd = _fusion()
    inputs = _good()
    inputs[1] = torch.randn(4, 2)
    _rejects(fd, inputs, calls, "input 1 (T1) dim 1 has size 2; it was defined as a broadcast "
                                "dim of size 1")


def test_expanded_broadcast_stride(calls):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        e = fd.define_tensor([-1, -1], expanded=[False, True])
        fd.add_output(fd.ops.add(x, e))
    x = torch.randn(3, 5)
    (out,) = fd.execute([x, torch.randn(3, 1).expand(3, 5)])
    calls.clear()
    _rejects(fd, [x, torch.randn(3, 5)], calls, "input 1 (T1) dim 1 has stride 1; it was "
                                                "defined as an expanded broadcast (stride 0)")
    _rejects(fd, [x, torch.randn(3, 1).expand(3, 4)], calls, "input 1 (T1) dim 1",
             "= 4", "input 0 (T0) dim 1", "= 5")


def test_static_size(calls):
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, -1])
        fd.add_output(fd.ops.neg(x))
    _rejects(fd, [torch.randn(7, 3)], calls, "input 0 (T0) dim 0 has size 7, the definition "
                                             "says 8")


def test_symbolic_extent_mismatch_across_inputs(calls):
    fd = _fusion()
    inputs = _good()
    inputs[2] = torch.randn(5, 6)
    msg = _rejects(fd, inputs, calls, "sizes do not match at add dim 0",
                   "i0 = 4 (input 0 (T0) dim 0)", "i3 = 5 (input 2 (T2) dim 0)")
    inputs = _good()
    inputs[2] = torch.randn(4, 7)
    _rejects(fd, inputs, calls, "i1 = 6 (input 0 (T0) dim 1)", "i4 = 7 (input 2 (T2) dim 1)")
    inputs = _good()
    inputs[1] = torch.randn(3, 1)
    _rejects(fd, inputs, calls, "i0 = 4 (input 0 (T0) dim 0)", "i2 = 3 (input 1 (T1) dim 0)")
    assert msg


def _binary(shapes):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shapes[0])
        b = fd.define_tensor(shapes[1])
        fd.add_output(fd.ops.add(a, b))
    return fd


@pytest.mark.parametrize("sizes, defined, fix", [
    (((4, 5), (4, 1)), "input 1 (T1) dim 1", [-1, 1]),
    (((4, 5), (1, 5)), "input 1 (T1) dim 0", [1, -1]),
    (((4, 1), (4, 5)), "input 0 (T0) dim 1", [-1, 1]),
])
def test_a_symbolic_dim_of_size_1_says_how_to_define_the_broadcast(calls, sizes, defined, fix):
    """torch broadcasts a dim of size 1; a dim defined -1 does not (the broadcast is part of
    the definition): the message names the dim and the shape that defines it, and that shape
    works."""
    fd = _binary([[-1, -1], [-1, -1]])
    ins = [torch.randn(s) for s in sizes]
    _rejects(fd, ins, calls, "sizes do not match at add dim", f"{defined} was defined with size "
             "-1, so it does not broadcast at run time as torch would broadcast a dim of size 1",
             f"shape={fix} in define_tensor", "fd.ops.broadcast_in_dim")
    k = int(defined[6])
    shapes = [[-1, -1], [-1, -1]]
    shapes[k] = fix
    fixed = _binary(shapes)
    torch.testing.assert_close(fixed.execute(ins)[0], ins[0] + ins[1])


def test_a_rank_1_operand_lines_up_with_the_last_dim(calls):
    """[4, 5] + [4]: torch refuses it too (the [4] lines up with dim 1). The message says how
    to place it along dim 0, and that works."""
    fd = _binary([[-1, -1], [-1]])
    x, w = torch.randn(4, 5), torch.randn(4)
    _rejects(fd, [x, w], calls, "sizes do not match at add dim 1: i1 = 5 (input 0 (T0) dim 1) "
             "but i2 = 4 (input 1 (T1) dim 0)", "Operands line up from their last dim, as in "
             "torch", "shape=[..., 1]", "expanded=[...]",
             "(for input 1 (T1) along dim 0 of T0: fd.ops.broadcast_in_dim(T1, [-1, -1], [0]))")
    with FusionDefinition() as fixed:
        a = fixed.define_tensor([-1, -1])
        b = fixed.define_tensor([-1])
        fixed.add_output(fixed.ops.add(a, fixed.ops.broadcast_in_dim(b, [-1, -1], [0])))
    torch.testing.assert_close(fixed.execute([x, w])[0], x + w[:, None])
    calls.clear()
    # No dim of T0 has T1's size: no placement to suggest.
    _rejects(fd, [x, torch.randn(3)], calls, "Operands line up from their last dim")
    with pytest.raises(InputError) as e:
        fd.execute([x, torch.randn(3)])
    assert "for input 1" not in str(e.value)


def test_symbolic_extent_reused_within_one_input(calls):
    # The same symbolic extent on two dims of one tensor (here via an op on itself).
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.add(x, fd.ops.permute(x, [1, 0])))
    torch.testing.assert_close(fd.execute([torch.ones(3, 3)])[0], torch.full((3, 3), 2.0))
    calls.clear()
    _rejects(fd, [torch.randn(3, 4)], calls, "i0 = 3 (input 0 (T0) dim 0)",
             "i1 = 4 (input 0 (T0) dim 1)")


def test_contiguity_transposed(calls):
    fd = _fusion()
    inputs = _good()
    inputs[2] = torch.randn(6, 4).t()
    _rejects(fd, inputs, calls, "input 2 (T2) is not contiguous as defined",
             "innermost dim 1 has stride 4, expected 1", "strides (1, 4)")


def test_contiguity_sliced(calls):
    fd = _fusion()
    inputs = _good()
    inputs[0] = torch.randn(4, 10)[:, 2:8]
    _rejects(fd, inputs, calls, "input 0 (T0) is not contiguous as defined",
             "dim 0 has stride 10, expected 6")
    inputs = _good()
    inputs[0] = torch.randn(4, 12)[:, ::2]
    _rejects(fd, inputs, calls, "input 0 (T0) is not contiguous as defined",
             "innermost dim 1 has stride 2, expected 1")


def test_non_contiguous_definition_accepts_slices(calls):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True])
        fd.add_output(fd.ops.neg(x))
    x = torch.randn(4, 10)[:, 2:8]
    torch.testing.assert_close(fd.execute([x])[0], -x)
    calls.clear()
    _rejects(fd, [torch.randn(4, 12)[:, ::2]], calls, "input 0 (T0) is not contiguous as defined",
             "innermost dim 1 has stride 2, expected 1")


def test_stride_order(calls):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], stride_order=[0, 1])  # column major
        fd.add_output(fd.ops.neg(x))
    good = torch.randn(6, 4).t()
    torch.testing.assert_close(fd.execute([good])[0], -good)
    calls.clear()
    _rejects(fd, [torch.randn(4, 6)], calls, "input 0 (T0) has strides (6, 1)",
             "dim 1 (stride 1) should be outside dim 0 (stride 6)")


def test_device_mismatch(calls):
    fd = _fusion()
    inputs = _good()
    inputs[2] = inputs[2].to("meta")
    _rejects(fd, inputs, calls, "input 2 (T2) is on meta but input 0 is on cpu")


@pytest.mark.parametrize("bad, kind", [([1.0] * 6, "list"), (None, "NoneType"),
                                       (3.0, "float")])
def test_non_tensor_input(calls, bad, kind):
    fd = _fusion()
    inputs = _good()
    inputs[1] = bad
    _rejects(fd, inputs, calls, f"input 1 (T1) must be a torch.Tensor, got {kind}")


@pytest.mark.parametrize("dtype, bad, kind", [
    (DataType.Double, "2", "str"), (DataType.Double, torch.tensor(2.0), "Tensor"),
    (DataType.Int, 2.5, "float"), (DataType.Bool, 1, "int"),
])
def test_scalar_input_type(calls, dtype, bad, kind):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s = fd.define_scalar(dtype=dtype)
        fd.add_output(fd.ops.mul(x, fd.ops.cast(s, DataType.Float)))
    _rejects(fd, [torch.randn(3), bad], calls, "input 1 (scalar s0) must be a Python "
                                               f"{dtype.short_name} number, got {kind}")


def test_scalar_input_accepts_python_numbers(calls):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(x, s))
    x = torch.randn(3)
    torch.testing.assert_close(fd.execute([x, 2])[0], x * 2)
    torch.testing.assert_close(fd.execute([x, 0.5])[0], x * 0.5)


# The inputs argument itself ----------------------------------------------------------------------
def _rank1():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    return fd


def test_a_bare_tensor_is_not_read_as_its_rows(calls):
    """A [1, 4] tensor iterated gives its row 0, a [4] tensor: the same signature as a cached
    plan of [x]. It is refused, after a good call too (the cached path)."""
    fd = _rank1()
    x = torch.randn(4)
    torch.testing.assert_close(fd.execute([x])[0], -x)
    calls.clear()
    _rejects(fd, x[None], calls, "inputs must be a list or tuple of the fusion's 1 input (T0), "
                                 "in order, e.g. fd.execute([x0]); got a torch.Tensor of shape "
                                 "(1, 4) (wrap even a single input in a list: fd.execute([x]))")
    _rejects(fd, x, calls, "got a torch.Tensor of shape (4,)")


@pytest.mark.parametrize("make, got", [
    (lambda ins: (t for t in ins), "got an iterator (generator); pass list(...) of it"),
    (lambda ins: iter(ins), "got an iterator (list_iterator)"),
    (lambda ins: map(lambda t: t, ins), "got an iterator (map)"),
    (lambda ins: dict(enumerate(ins)), "got a dict"),
    (lambda ins: None, "got a NoneType"),
])
def test_inputs_other_than_a_list_or_tuple_are_refused(calls, make, got):
    fd = _fusion()
    _rejects(fd, make(_good()), calls, "inputs must be a list or tuple of the fusion's 4 inputs "
                                       "(T0, T1, T2, scalar s0), in order, e.g. "
                                       "fd.execute([x0, x1, x2, x3]); " + got)
    assert fd._executor._plans == {}


def test_a_tuple_is_taken(calls):
    fd = _fusion()
    inputs = _good()
    (out,) = fd.execute(tuple(inputs))
    torch.testing.assert_close(out, (inputs[0] + inputs[1] + inputs[2]) * 2.0)


# A refused call caches nothing ------------------------------------------------------------------
@pytest.mark.parametrize("path", [None, {"enable": ["interpret"]}])
def test_a_refused_call_caches_nothing_and_a_correct_one_runs(calls, path):
    fd = _fusion()
    bad = _good()
    bad[2] = torch.randn(5, 6)                           # sizes do not match at add dim 0
    for _ in range(2):                                   # the second call: no cached plan either
        with pytest.raises(InputError, match="sizes do not match"):
            fd.execute(bad, options=path)
        assert fd._executor._plans == {} and fd._executor.kernels() == []
    assert calls == []
    inputs = _good()
    (out,) = fd.execute(inputs, options=path)
    torch.testing.assert_close(out, (inputs[0] + inputs[1] + inputs[2]) * 2.0)
    assert len(fd._executor._plans) == 1


# fd.from_pytorch ------------------------------------------------------------------------------
LAYOUTS = {
    "permuted": lambda: torch.randn(4, 5, 6).permute(2, 0, 1),
    "expanded": lambda: torch.randn(4, 1, 6).expand(4, 5, 6),
    "expanded_inner": lambda: torch.randn(4, 1).expand(4, 6),
    "size1": lambda: torch.randn(4, 1, 6),
    "sliced": lambda: torch.randn(4, 10)[:, 2:8],
    "strided": lambda: torch.randn(4, 12)[:, ::2],
    "sliced_rows": lambda: torch.randn(10, 6)[2:6],
    "permuted_sliced": lambda: torch.randn(6, 10)[:, 1:5].t(),
    "all_size1": lambda: torch.randn(1, 1),
    "bf16_permuted": lambda: torch.randn(3, 8).to(torch.bfloat16).t(),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_from_pytorch_accepts_the_tensor_and_computes_right(calls, layout):
    t = LAYOUTS[layout]()
    with FusionDefinition() as fd:
        x = fd.from_pytorch(t)
        fd.add_output(fd.ops.mul(fd.ops.exp(x), 2.0))
    assert len(x.logical) == t.dim()
    for i, size, stride in zip(x.logical, t.shape, t.stride()):
        assert i.is_broadcast == (size == 1 or stride == 0)
        assert (i.expanded_extent is not None) == (stride == 0 and size != 1)
    (out,) = fd.execute([t])
    assert out.shape == t.shape and out.dtype == t.dtype
    torch.testing.assert_close(out, t.exp() * 2.0)
    # Another tensor with the same layout (other sizes) is accepted too.
    t2 = LAYOUTS[layout]()
    torch.testing.assert_close(fd.execute([t2])[0], t2.exp() * 2.0)


def test_from_pytorch_descriptions():
    with FusionDefinition() as fd:
        p = fd.from_pytorch(torch.randn(4, 5, 6).permute(2, 0, 1))
        e = fd.from_pytorch(torch.randn(4, 1, 6).expand(4, 5, 6))
        s = fd.from_pytorch(torch.randn(4, 10)[:, 2:8])
        k = fd.from_pytorch(torch.randn(4, 6), static_sizes=True)
        fd.add_output(fd.ops.neg(p))
    # permuted (6, 4, 5) with strides (1, 30, 6): allocation dims 1, 2, 0.
    assert p.domain.allocation == [p.logical[1], p.logical[2], p.logical[0]]
    assert p.domain.contiguity == [True, True, True]
    assert e.logical[1].is_broadcast and e.logical[1].expanded_extent is not None
    assert e.domain.contiguity == [True, None, True]
    assert s.domain.allocation is None and s.domain.contiguity == [False, True]
    assert [i.extent.value for i in k.logical] == [4, 6]


def test_from_pytorch_rejects_other_layouts(calls):
    t = torch.randn(4, 5, 6).permute(2, 0, 1)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(t)
        fd.add_output(fd.ops.neg(x))
    _rejects(fd, [t.contiguous()], calls, "input 0 (T0) has strides (20, 5, 1)",
             "dim 2 (stride 1) should be outside dim 0 (stride 20)")
    e = torch.randn(4, 1, 6).expand(4, 5, 6)
    with FusionDefinition() as fd:
        x = fd.from_pytorch(e)
        fd.add_output(fd.ops.neg(x))
    _rejects(fd, [e.contiguous()], calls, "input 0 (T0) dim 1 has stride 6; it was defined as an "
                                          "expanded broadcast (stride 0)")
