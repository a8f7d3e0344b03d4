"""Definition-time checks of the frontend: shapes, ranks, operands, context; var_mean."""
import warnings

import pytest
import torch

from pyfuser import DataType, FusionDefinition, FusionDefinitionError


def test_rank_broadcasting_is_right_aligned():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, -1])
        b = fd.define_tensor([-1])
        m = fd.define_tensor([-1, 1])
        y = fd.ops.add(fd.ops.mul(x, b), m)
        fd.add_output(y)
    bb = y.definition.inputs[0].definition.inputs[1]
    assert [i.is_broadcast for i in bb.logical] == [True, True, False]
    mb = y.definition.inputs[1]
    assert [i.is_broadcast for i in mb.logical] == [True, False, True]
    X, B, M = torch.randn(2, 3, 4), torch.randn(4), torch.randn(3, 1)
    (out,) = fd.execute([X, B, M])
    torch.testing.assert_close(out, X * B + M)


def test_scalar_and_tensor_rank_zero_mix():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sub(2.0, x))
    X = torch.randn(3, 4)
    torch.testing.assert_close(fd.execute([X])[0], 2.0 - X)


def test_static_size_mismatch_names_op_operands_and_dims():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        y = fd.define_tensor([4, 6])
        z = fd.define_tensor([3])
        with pytest.raises(FusionDefinitionError) as e:
            fd.ops.add(x, y)
        assert str(e.value) == ("add: operand 0 (T0) dim 1 has size 8 but operand 1 (T1) dim 1 "
                                "has size 6; they do not broadcast")
        with pytest.raises(FusionDefinitionError) as e:
            fd.ops.mul(x, z)
        assert str(e.value) == ("mul: operand 0 (T0) dim 1 has size 8 but operand 1 (T2) dim 0 "
                                "has size 3; they do not broadcast")
        w = fd.define_tensor([4, 1])
        c = fd.define_tensor([-1, 8], dtype=DataType.Bool)
        with pytest.raises(FusionDefinitionError, match=r"^where: operand 0 \(T4\) dim 1 has size "
                                                        r"8 but operand 2 \(T1\) dim 1 has size 6"):
            fd.ops.where(c, x, y)
        out = fd.ops.add(x, w)  # size 1 broadcasts
        fd.add_output(out)
    assert [i.extent.value for i in out.logical] == [4, 8]


def test_where_needs_bool_condition():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        i = fd.define_tensor([-1, -1], dtype=DataType.Int)
        with pytest.raises(FusionDefinitionError) as e:
            fd.ops.where(x, x, 0.0)
        assert str(e.value) == "where: operand 0 (T0) must be bool, got float32"
        with pytest.raises(FusionDefinitionError, match=r"where: operand 0 \(T1\) must be bool, "
                                                        r"got int64"):
            fd.ops.where(i, x, 0.0)
        fd.add_output(fd.ops.where(fd.ops.gt(x, 0.0), x, 0.0))
    X = torch.randn(3, 4)
    torch.testing.assert_close(fd.execute([X, torch.zeros(3, 4, dtype=torch.int64)])[0],
                               X.clamp(min=0))


def test_ops_outside_the_with_block():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    for call, what in [(lambda: fd.ops.neg(x), "ops.neg"), (lambda: fd.ops.add(x, x), "ops.add"),
                       (lambda: fd.ops.sum(x), "ops.sum"), (lambda: fd.add_output(x), "add_output"),
                       (lambda: fd.define_tensor([-1]), "define_tensor"),
                       (lambda: fd.define_scalar(1.0), "define_scalar"),
                       (lambda: fd.ops.full([2], 1.0), "ops.full")]:
        with pytest.raises(FusionDefinitionError) as e:
            call()
        assert str(e.value) == f"{what}: call it inside `with FusionDefinition() as fd:`"
    with pytest.raises(FusionDefinitionError, match="already complete"):
        with fd:
            pass
    assert len(fd.fusion.outputs) == 1


def test_add_output_of_an_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        with pytest.raises(FusionDefinitionError) as e:
            fd.add_output(x)
        assert str(e.value).startswith("add_output: T0 is a fusion input; an input cannot also be "
                                       "an output")
        s = fd.define_scalar(dtype=DataType.Float)
        with pytest.raises(FusionDefinitionError, match="add_output: outputs must be tensors, got "
                                                        "Scalar"):
            fd.add_output(s)
        y = fd.ops.neg(x)
        fd.add_output(y)
        with pytest.raises(FusionDefinitionError, match="add_output: T1 is already an output"):
            fd.add_output(y)
    assert fd.fusion.outputs == [y]


def test_no_outputs():
    with pytest.raises(FusionDefinitionError, match="no outputs; call fd.add_output"):
        with FusionDefinition() as fd:
            fd.define_tensor([-1])


@pytest.mark.parametrize("dtype", [DataType.Int, DataType.Int32, DataType.Bool])
def test_mean_of_integer_tensor(dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=dtype)
        with pytest.raises(FusionDefinitionError) as e:
            fd.ops.mean(x, [1])
        assert str(e.value) == (f"mean: operand 0 (T0) is {dtype.short_name}; mean needs a "
                                "floating tensor (cast it first)")
        with pytest.raises(FusionDefinitionError, match=r"var_mean: operand 0 \(T0\) must be "
                                                        r"floating"):
            fd.ops.var_mean(x, [1])
        fd.add_output(fd.ops.sum(x, [1]))


def test_operand_errors():
    with FusionDefinition() as other:
        q = other.define_tensor([-1])
        other.add_output(other.ops.neg(q))
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        with pytest.raises(FusionDefinitionError, match=r"^add: operand 1 \(T0\) belongs to "
                                                        r"another fusion"):
            fd.ops.add(x, q)
        with pytest.raises(FusionDefinitionError, match=r"^mul: operand 1 has unsupported type "
                                                        r"str"):
            fd.ops.mul(x, "2")
        with pytest.raises(FusionDefinitionError, match=r"^sum: operand 0 must be a tensor, got "
                                                        r"scalar 2.0"):
            fd.ops.sum(2.0, [0])
        fd.add_output(fd.ops.neg(x))


@pytest.mark.parametrize("call, message", [
    (lambda fd, x: fd.ops.sum(x, [2]), r"^sum: dim 2 is out of range for T0 of rank 2$"),
    (lambda fd, x: fd.ops.max(x, [-3]), r"^max: dim -3 is out of range for T0 of rank 2$"),
    (lambda fd, x: fd.ops.sum(x, [1, -1]), r"^sum: dim -1 appears twice in \[1, -1\]$"),
    (lambda fd, x: fd.ops.reshape(x, [5, 7]), r"^reshape: T0 has 32 elements, shape \[5, 7\] "
                                              r"has 35$"),
    (lambda fd, x: fd.ops.reshape(x, [-1, -1]), r"^reshape: more than one -1"),
    (lambda fd, x: fd.ops.squeeze(x, [0]), r"^squeeze: dim 0 of T0 has size 4, not 1$"),
    (lambda fd, x: fd.ops.broadcast(x, [True, False]), r"^broadcast: 2 flags keep 1 dims but T0 "
                                                       r"has 2$"),
    (lambda fd, x: fd.ops.permute(x, [0, 0]), r"^permute: \[0, 0\] is not a permutation"),
    (lambda fd, x: fd.ops.expand(x, [4, 9]), r"^expand: dim 1 of T0 has size 8, not 1"),
    (lambda fd, x: fd.ops.broadcast_in_dim(x, [4, 9, 3], [0, 1]), r"^broadcast_in_dim: dim 1 "
                                                                  r"has size 8, shape asks 9$"),
    (lambda fd, x: fd.ops.broadcast_in_dim(x, [4, 8], [1, 0]), r"^broadcast_in_dim: "
                                                               r"broadcast_dims \[1, 0\] must"),
    (lambda fd, x: fd.ops.gelu(x, approximate="fast"), r"^gelu: approximate must be"),
    (lambda fd, x: fd.ops.full([2, 0], 1.0), r"^full: size 0 of dim 1 must be a positive int$"),
    (lambda fd, x: fd.define_tensor([-1, 0]), r"define_tensor: size 0 of dim 1 must be -1, 1"),
    (lambda fd, x: fd.define_tensor([-1, -1], stride_order=[0, 0]), r"define_tensor: "
                                                                     r"stride_order \[0, 0\]"),
    (lambda fd, x: fd.define_tensor([-1, -1], contiguity=[True]), r"define_tensor: 1 "
                                                                  r"contiguity flags for 2 dims"),
    (lambda fd, x: fd.define_scalar(), r"define_scalar: a runtime scalar needs a dtype"),
])
def test_shape_and_argument_errors(call, message):
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        n_inputs = len(fd.fusion.inputs)
        with pytest.raises(FusionDefinitionError, match=message):
            call(fd, x)
        assert len(fd.fusion.inputs) == n_inputs
        fd.add_output(fd.ops.neg(x))


@pytest.mark.parametrize("dims", [[1], [0], [0, 2], None, [-1]])
@pytest.mark.parametrize("correction", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("static", [False, True])
def test_var_mean_matches_torch(dims, correction, keepdim, static):
    """Corrections of N and more (N = 3 rows over dim 0): torch divides by max(N - correction,
    0), so the variance is inf, never negative."""
    X = torch.randn(3, 5, 7, dtype=torch.float64)
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 5, 7] if static else [-1, -1, -1], dtype=DataType.Double)
        var, mean = fd.ops.var_mean(x, dims, correction=correction, keepdim=keepdim)
        fd.add_output(var)
        fd.add_output(mean)
    got_var, got_mean = fd.execute([X])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # torch: "degrees of freedom is <= 0"
        want_var, want_mean = torch.var_mean(X, dims, correction=correction, keepdim=keepdim)
    assert got_var.shape == want_var.shape and got_mean.shape == want_mean.shape
    torch.testing.assert_close(got_var, want_var)
    torch.testing.assert_close(got_mean, want_mean)


def test_var_and_mean_float32():
    X = torch.randn(6, 33)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.var(x, [1]))
        fd.add_output(fd.ops.mean(x, [0], keepdim=True))
    v, m = fd.execute([X])
    torch.testing.assert_close(v, X.var(1))
    torch.testing.assert_close(m, X.mean(0, keepdim=True))


# A definition that raised ----------------------------------------------------------------------
def _stack_is_clean():
    from pyfuser.ir.base import current_fusion
    return current_fusion() is None


def test_a_failed_definition_is_discarded_and_can_be_defined_again():
    fd = FusionDefinition()
    with pytest.raises(FusionDefinitionError, match="do not broadcast"):
        with fd:
            stale = fd.define_tensor([-1, 4])
            w = fd.define_tensor([5])
            fd.add_output(fd.ops.neg(stale))
            fd.ops.add(stale, w)                    # 4 vs 5: raises
    assert _stack_is_clean()
    with pytest.raises(FusionDefinitionError, match=r"execute: the definition failed "
                                                    r"\(FusionDefinitionError: add: .*do not "
                                                    r"broadcast\); define it again"):
        fd.execute([torch.randn(2, 4), torch.randn(5)])
    with fd:                                        # starts from an empty fusion
        x = fd.define_tensor([-1])
        with pytest.raises(FusionDefinitionError, match="belongs to another fusion"):
            fd.ops.neg(stale)
        with pytest.raises(FusionDefinitionError, match="add_output: T0 belongs to another fusion"):
            fd.add_output(stale)
        fd.add_output(fd.ops.mul(x, 2.0))
    assert _stack_is_clean()
    assert fd.fusion.inputs == [x] and len(fd.fusion.outputs) == 1 and x.name == 0
    X = torch.randn(3)
    torch.testing.assert_close(fd.execute([X])[0], X * 2.0)


def test_any_exception_in_the_block_discards_the_definition():
    fd = FusionDefinition()
    with pytest.raises(KeyError):
        with fd:
            fd.define_tensor([-1])
            {}["user code fails"]
    assert _stack_is_clean()
    with fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
    assert len(fd.fusion.inputs) == 1
    X = torch.randn(3, 4)
    torch.testing.assert_close(fd.execute([X])[0], X.sum(1))


def test_a_definition_that_fails_on_exit_is_discarded():
    fd = FusionDefinition()
    with pytest.raises(FusionDefinitionError, match="no outputs"):
        with fd:
            fd.define_tensor([-1])
    assert _stack_is_clean()
    with fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.neg(x))
    assert len(fd.fusion.inputs) == 1
    torch.testing.assert_close(fd.execute([torch.ones(2)])[0], -torch.ones(2))


def test_nested_blocks():
    fd = FusionDefinition()
    with pytest.raises(FusionDefinitionError, match="already being defined"):
        with fd:
            with fd:
                pass
    assert _stack_is_clean()
    with FusionDefinition() as outer:
        x = outer.define_tensor([-1])
        with pytest.raises(FusionDefinitionError, match="another FusionDefinition's `with` block "
                                                        "is open inside this one's"):
            with FusionDefinition() as inner:
                outer.define_tensor([-1])
        assert inner._failed and not outer._failed
        outer.add_output(outer.ops.neg(x))
    assert _stack_is_clean() and len(outer.fusion.inputs) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_var_mean_of_16_bit_rows_computes_in_float(dtype):
    """torch rounds a 16-bit var_mean once, from float: the sum of 65536 squares of N(0, 1)
    values (about 65536) passes fp16's largest value (65504), so a definition that summed
    16-bit squares gave inf."""
    X = torch.randn(2, 65536, dtype=dtype)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Half if dtype == torch.float16
                             else DataType.BFloat16)
        var, mean = fd.ops.var_mean(x, [1])
        fd.add_output(var)
        fd.add_output(mean)
    got_var, got_mean = fd.execute([X])             # CPU: the reference evaluator, in 16 bits
    want_var, want_mean = torch.var_mean(X, [1])
    assert got_var.dtype == got_mean.dtype == dtype
    torch.testing.assert_close(got_var, want_var)
    torch.testing.assert_close(got_mean, want_mean)
