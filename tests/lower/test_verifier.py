"""pyfuser.kir.verifier: each rule rejects a kernel that breaks it, naming the pass; kernels the
pipeline produces pass after every pass."""
import pytest

from kir_testing import empty_inputs, enclosing, lower_upto, op_writing, ops, schedule_and_lower
from pyfuser import FusionDefinition, catalogue
from pyfuser.ir import ParallelType as PT
from pyfuser.ir.tensor import MemoryType
from pyfuser.kir import nodes as K
from pyfuser.kir.verifier import KernelIRError, Rule
from pyfuser.lower import PIPELINE, lower, rules_after, verify
from pyfuser.schedule import (cache_after, cache_before, inline_at, inline_most, parallelize_like,
                              propagate_transforms, rfactor, set_memory_type)


def test_every_pass_declares_its_rules():
    # The rules live beside their passes; the pipeline collects them (no copy of its order).
    for p in PIPELINE:
        assert all(isinstance(r, Rule) for r in p.establishes + p.retires), p.__name__
    names = [r.name for r in rules_after("launch_config")]
    assert names == ["loop nests", "indexed", "lse lanes folded", "asynchronous loads lowered",
                     "checked quotients", "launch declared"]
    assert [r.name for r in rules_after("allocate")] == ["loop nests", "fusion operands",
                                                        "buffers allocated"]


def test_unknown_pass_name():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4])
        fd.add_output(fd.ops.neg(x))
    k = lower(fd.fusion.clone()[0], "k")
    with pytest.raises(ValueError, match="unknown lowering pass 'circular_buffer'.*PIPELINE"):
        verify(k, after="circular_buffer")


def _pointwise():
    """[5, 7] + bias[7], flattened, split by 4 over threadIdx.x."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([5, 7])
        b = fd.define_tensor([7])
        fd.add_output(fd.ops.add(x, b))
    f, _ = fd.fusion.clone()
    out = f.outputs[0]
    out.merge(0).split(0, 4).parallelize(1, PT.TIDx)
    propagate_transforms(out)
    parallelize_like(out)
    inline_most(fusion=f)
    return f


def _row_sum():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(x, [1]))
    f, _ = fd.fusion.clone()
    red = cache_before(f.outputs[0])
    red.split(1, 32).parallelize(0, PT.BIDx).parallelize(2, PT.TIDx)
    rf = rfactor(red, [1])
    propagate_transforms(rf)
    parallelize_like(rf)
    inline_most(fusion=f)
    return f


def _err(kernel, after, match):
    with pytest.raises(KernelIRError, match=match) as e:
        verify(kernel, after=after)
    assert f"after pass {after!r}" in str(e.value)
    return str(e.value)


def test_every_pass_verifies_on_small_kernels():
    for build in (_pointwise, _row_sum):
        f = build()
        k = K.Kernel("k", f)
        from pyfuser.lower.context import LoweringContext
        k.ctx = LoweringContext(f)
        for p in PIPELINE:
            k = p(k)
            verify(k, after=p.__name__)


@pytest.mark.parametrize("name", ["gelu_bias", "silu_mul", "row_sum", "col_sum"])
@pytest.mark.parametrize("shape", [(7, 1023), (16384, 8192), (3, 100004)])
def test_catalogue_kernels_verify_after_each_pass(name, shape):
    fd = catalogue.define(name, "bf16")
    schedule_and_lower(fd, empty_inputs(name, *shape))   # lowers with the verifier after every pass


# Each rule, broken by hand ------------------------------------------------------------------
def test_unallocated_buffer():
    k = lower_upto(_pointwise(), "index_and_predicate")
    alloc = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate))
    scope = enclosing(k, alloc)[-1].body
    scope.remove(alloc)
    msg = _err(k, "index_and_predicate", r"buffer T2 \(local\) in .* neither a kernel parameter "
                                         r"nor allocated")
    assert "T2[0] = BroadcastOp" in msg     # the statement is shown


def test_buffer_allocated_after_its_use():
    k = lower_upto(_pointwise(), "allocate")
    alloc = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate))
    scope = enclosing(k, alloc)[-1].body
    scope.remove(alloc)
    scope.append(alloc)
    _err(k, "allocate", r"T2 is neither a kernel parameter nor allocated")


def test_buffer_allocated_in_a_sibling_scope():
    k = lower_upto(_row_sum(), "index_and_predicate")
    # Move T3's allocation into the reduction loop: the op after that loop reads it out of scope.
    t3 = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate) and s.buffer.name == "T3")
    outer = enclosing(k, t3)[-1].body
    outer.remove(t3)
    red_loop = next(s for s in outer if isinstance(s, K.ForLoop) and s.parallel == "Serial")
    red_loop.body.insert(0, t3)
    _err(k, "index_and_predicate", r"T3 \(local\)")


def test_allocated_twice():
    k = lower_upto(_pointwise(), "allocate")
    alloc = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate))
    enclosing(k, alloc)[-1].body.insert(0, K.Allocate(alloc.buffer))
    _err(k, "allocate", "allocated twice")


def test_loop_variable_outside_its_loop():
    k = lower_upto(_pointwise(), "index_and_predicate")
    serial = next(s for s in K.walk(k.body) if isinstance(s, K.ForLoop) and s.parallel == "Serial")
    # A statement after the loop that indexes with the loop's variable.
    op = ops(k)[-1]
    stray = K.TensorOp(op.expr, K.TensorIndex(op.out.buffer, serial.var), list(op.ins),
                       nest=[])
    k.body.append(stray)
    _err(k, "index_and_predicate", f"loop variable {serial.var.name} is used in TensorOp.out "
                                   "outside its loop")


def test_undefined_variable():
    k = lower_upto(_pointwise(), "index_and_predicate")
    op = op_writing(k, "T3")
    op.predicate = K.lt(K.Var("i9"), 3)
    _err(k, "index_and_predicate", "variable i9 in TensorOp.predicate is neither")


def test_loop_emitted_twice():
    k = lower_upto(_pointwise(), "build_loops")
    loop = k.body[0]
    k.body.append(K.ForLoop(K.Var("jx"), K.Const(0), loop.stop, K.Const(1), [],
                            loop.parallel, loop=loop.loop))
    _err(k, "build_loops", "emitted twice")


def test_loop_never_emitted():
    k = lower_upto(_pointwise(), "build_loops")
    inner = k.body[0].body[0]
    k.body[0].body = list(inner.body)       # drop the TIDx loop, keep its ops
    _err(k, "build_loops", r"the loops around the op .* are not its nest")


def test_ops_hold_fusion_vals_before_indexing():
    k = lower_upto(_pointwise(), "allocate")
    op = ops(k)[0]
    op.out = K.TensorIndex(K.Buffer("T2", op.out.dtype, "local", K.Const(1)), K.Const(0))
    _err(k, "allocate", "already indexed")


def test_ops_are_indexed_after_indexing():
    k = lower_upto(_pointwise(), "index_and_predicate")
    op = op_writing(k, "T3")
    op.ins[0] = op.expr.inputs[0]            # a fusion TensorView again
    _err(k, "index_and_predicate", r"input 0 is TensorView .* not a kernel expression")


def test_register_buffer_of_runtime_size():
    k = lower_upto(_row_sum(), "allocate")
    alloc = next(s for s in K.walk(k.body) if isinstance(s, K.Allocate))
    alloc.buffer.size = K.Var("i1")
    _err(k, "allocate", "register buffer T2 has a non-constant size i1")


@pytest.mark.parametrize("width,dtype_bytes,match", [
    (3, 4, "vector width 3 is not one of"),
    (8, 4, "vector access of 8 x 4 bytes to .* exceeds 16 bytes"),
])
def test_bad_vector_width(width, dtype_bytes, match):
    from pyfuser import DataType
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    ca = cache_after(f.inputs[0])
    y.split(0, 4).parallelize(0, PT.BIDx)
    propagate_transforms(y)
    parallelize_like(y)
    ca.parallelize(-1, PT.Vectorize)
    inline_most(fusion=f)
    k = lower_upto(f, "vectorize_and_unroll")
    op = next(s for s in ops(k) if s.vector > 1)
    assert op.vector == 4
    op.vector = width
    for a in [op.out] + op.ins:
        a.vector = width
    _err(k, "vectorize_and_unroll", match)


def test_vector_operand_in_a_scalar_op():
    k = lower_upto(_pointwise(), "index_and_predicate")
    op_writing(k, "T3").ins[0].vector = 4
    _err(k, "index_and_predicate", "is a vector access in a scalar op")


def test_block_reduce_under_a_predicate():
    k = lower_upto(_row_sum(), "lower_reductions")
    br = next(s for s in K.walk(k.body) if isinstance(s, K.BlockReduce))
    scope = enclosing(k, br)[-1].body
    pos = scope.index(br)
    scope[pos] = K.IfThenElse(K.lt(K.Special("threadIdx.x"), 16), [br])
    _err(k, "lower_reductions", r"inside the predicated branch `if \(threadIdx.x < 16\)`")


def test_block_reduce_inside_its_thread_loop():
    k = lower_upto(_row_sum(), "lower_reductions")
    br = next(s for s in K.walk(k.body) if isinstance(s, K.BlockReduce))
    scope = enclosing(k, br)[-1].body
    scope.remove(br)
    tidx = next(s for s in scope if isinstance(s, K.ForLoop) and s.parallel == "TIDx")
    tidx.body.append(br)
    _err(k, "lower_reductions", "over threadIdx.x is inside a loop bound to threadIdx.x")


def test_block_reduce_values_after_indexing():
    k = lower_upto(_row_sum(), "index_and_predicate")
    br = next(s for s in K.walk(k.body) if isinstance(s, K.BlockReduce))
    assert [v.buffer.name for v in br.values] == ["T2"]
    br.values = []
    _err(k, "index_and_predicate", "BlockReduce has no values")


def test_launch_config_required_and_block_limit():
    k = lower_upto(_pointwise())
    k.launch.block = [2048, 1, 1]
    _err(k, "launch_config", r"block \[2048, 1, 1\] has 2048 threads")
    k.launch = None
    _err(k, "launch_config", "no launch configuration")


def test_shared_buffer_must_be_allocated_before_use():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, 64])
        fd.add_output(fd.ops.neg(a))
    f, _ = fd.fusion.clone()
    y = f.outputs[0]
    ca = cache_after(f.inputs[0])
    set_memory_type(ca, MemoryType.Shared)
    y.parallelize(0, PT.BIDx).parallelize(1, PT.TIDx)
    propagate_transforms(y)
    parallelize_like(y)
    inline_at(ca, 1)
    k = lower_upto(f, "insert_syncs")
    assert isinstance(k.body[0], K.Allocate) and k.body[0].buffer.memory == "shared"
    k.body.append(k.body.pop(0))
    _err(k, "insert_syncs", r"buffer T2 \(shared\)")


def test_loop_with_its_ops_dropped_is_never_emitted():
    k = lower_upto(_pointwise(), "build_loops")
    k.body = []
    _err(k, "build_loops", r"lowering loop Loop\(T3.0 .*\) is never emitted")


def _grid_synced():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 8])
        fd.add_output(fd.ops.neg(fd.ops.exp(x)))
    f, _ = fd.fusion.clone()
    a = f.exprs()[0].outputs[0]
    set_memory_type(a, MemoryType.Global)
    for t in (a, f.outputs[0]):
        t.parallelize(0, PT.BIDx)
    return lower_upto(f)


def test_grid_sync_must_be_reached_by_every_block_and_launched_cooperatively():
    k = _grid_synced()
    gs = next(s for s in k.body if isinstance(s, K.GridSync))
    k.launch.cooperative = False
    _err(k, "launch_config", "synchronizes the grid but its launch is not cooperative")
    k.launch.cooperative = True
    k.body[k.body.index(gs)] = K.IfThenElse(K.eq(K.Special("blockIdx.x"), 0), [gs])
    _err(k, "launch_config", r"GridSync is inside the predicated branch `if \(blockIdx.x == 0\)`")


def _issue17_fusions():
    """Fusions of the slicing and indexing ops: each adds operands of its own in indexing (a
    gather's stride, extent and error record, a window's condition and fill, an iota's element
    index), one for all lanes of a vector op."""
    import torch
    from pyfuser import DataType
    x, t = torch.empty(64, 1000), torch.zeros(64, dtype=torch.int64)
    ids, w = torch.zeros(8, dtype=torch.int64), torch.empty(100, 64)
    h = torch.empty(64, 2048, dtype=torch.bfloat16)
    row = lambda fd, i: fd.ops.broadcast(i, [False, True])  # noqa: E731
    return {
        "take_along_axis": ([x, t], lambda fd, a, i: fd.ops.take_along_axis(a, row(fd, i), 1)),
        "pad": ([x], lambda fd, a: fd.ops.pad(a, [1, 2], 0.0)),
        "slice": ([x], lambda fd, a: fd.ops.slice(a, [0, 3], [64, 900], [1, 1])),
        "cat": ([x], lambda fd, a: fd.ops.cat([a, a], 1)),
        "scatter": ([t], lambda fd, i: fd.ops.scatter(fd.ops.zeros([64, 1000], DataType.Float),
                                                      row(fd, i), 1.0, 1)),
        "embedding (a vector gather)": ([ids, w], lambda fd, i, e: fd.ops.embedding(i, e)),
        "iota one-hot": ([t], lambda fd, i: fd.ops.eq(
            fd.ops.broadcast(fd.ops.iota(1000), [True, False]), row(fd, i))),
        "chunked SwiGLU (vector windows)": ([h], lambda fd, a: fd.ops.mul(
            fd.ops.silu(fd.ops.slice(a, [0, 0], [64, 1024], [1, 1])),
            fd.ops.slice(a, [0, 1024], [64, 2048], [1, 1]))),
    }


@pytest.mark.parametrize("name", list(_issue17_fusions()))
def test_slicing_and_indexing_kernels_pass_every_rule(name):
    """The operands indexing adds to these ops are kernel expressions, and a vector gather's
    index and a vector window's fill are one for all lanes (K.vector_operands): the rules take
    them (before, the verifier refused every kernel of these ops)."""
    inputs, build = _issue17_fusions()[name]
    with FusionDefinition() as fd:
        fd.add_output(build(fd, *[fd.from_pytorch(x) for x in inputs]))
    schedule_and_lower(fd, inputs)      # the verifier runs after every pass
