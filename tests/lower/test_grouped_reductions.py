"""Pass group_sibling_reductions: sibling block and grid steps side by side reduce in one pass
(one block all-reduce, one grid workspace and semaphore, one combine), on the interpreter against
float64, in the generated CUDA and through NVRTC; siblings that differ, or whose grouped block
step would outgrow its shared workspace bound, stay apart."""
import re

import pytest
import torch
from kir_testing import (batchnorm_backward_sums, compile_clean, interpret_against_float64,
                         lower_upto, schedule_and_lower)

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.cuda import generate_cuda
from pyfuser.kir import nodes as K
from pyfuser.lower.grouped_reductions import GROUPED_WORKSPACE_BYTES
from pyfuser.schedule.schedulers import reduction
from pyfuser.schedule.schedulers.reduction import ReductionParams


def _inputs(n=2, c=24, h=5, w=7, dtype=torch.float32):
    cl = torch.channels_last
    x = torch.randn(n, c, h, w).to(dtype).contiguous(memory_format=cl)
    dy = torch.randn(n, c, h, w).to(dtype).contiguous(memory_format=cl)
    return [x, dy, torch.randn(c), torch.rand(c) + 0.5]


def _steps(kernel):
    walk = list(K.walk(kernel.body))
    return ([s for s in walk if isinstance(s, K.BlockReduce)],
            [s for s in walk if isinstance(s, K.GridReduce)])


# Outer sums split over 3 blocks along y (grid steps), 4 x 4 threads with vectors of 2 (block
# steps over threadIdx.y); 70 rows fill no step evenly.
SPLIT = ReductionParams(False, 2, 4, 4, 1, (0, 1), grid_split=3, interleave=True)


def test_sibling_grid_reductions_reduce_in_one_pass():
    """sum(dy) and sum(dy * x_hat) split over blocks: one block step and one grid step holding
    both values, one workspace and one semaphore in the kernel's parameters; both outputs right
    on the interpreter (each block's partials combined by the one last block)."""
    fd = batchnorm_backward_sums()
    inputs = _inputs()
    st, _, _, kernel = schedule_and_lower(fd, inputs, scheduler=reduction, params=SPLIT)
    blocks, grids = _steps(kernel)
    assert [len(s.values) for s in blocks] == [2] and [len(s.values) for s in grids] == [2]
    assert {v.buffer.name for v in grids[0].values} == {v.buffer.name for v in blocks[0].values}
    kinds = sorted(kind for _, kind in kernel.workspaces)
    assert kinds == ["grid_reduce_data", "semaphore"], kinds
    assert sum(p.name.startswith(("pf_gws", "pf_gsem")) for p in kernel.params) == 2
    interpret_against_float64(fd, st, kernel, inputs)


def test_grouped_grid_step_writes_each_sibling_in_its_plane():
    """The CUDA of the grouped steps (BatchNorm backward's sums at its heuristic: 32 x 32
    threads of 4 columns each): one block all-reduce of 8 values; each sibling's partials in a
    plane of their own of the one workspace, the second's `pf_plane * 4` elements in; one
    semaphore, one arrival; the combine's 8 values scattered back to both; NVRTC clean."""
    fd = batchnorm_backward_sums(DataType.BFloat16)
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    inputs = [x, torch.empty_like(x), torch.empty(256), torch.empty(256)]
    _, _, params, kernel = schedule_and_lower(fd, inputs, scheduler=reduction, device="h200")
    assert (params.bdimx, params.bdimy, params.vector, params.grid_split) == (32, 32, 4, 64)
    src = generate_cuda(kernel)
    body = src.split("__global__", 1)[1]
    assert body.count("pf::block_allreduce_y_group<8>") == 2, body   # the block step, the combine's
    assert "block_allreduce_y_group<4>" not in body
    writes = re.findall(r"(pf_gws\d+)\[(pf_plane \* 4 \+ )?\(.*\* 4 \+ pf_k\] = (T\d+)\[", body)
    assert len(writes) == 2 and writes[0][0] == writes[1][0], writes
    assert [w[1] for w in writes] == ["", "pf_plane * 4 + "], writes
    assert writes[0][2] != writes[1][2], writes
    assert len(set(re.findall(r"pf_gsem\d+", body))) == 1
    # One arrival at GPU scope (acq_rel) by the block's leader after a barrier, no fence in
    # every thread (grid_sync.cuh's ordering chain).
    assert body.count("pf::grid_arrive(") == 1 and "__threadfence" not in body, body
    assert re.search(r"pf_row1 = pf_plane \* 4 \+ \(\(pf_r \* pf_nkept", body), body
    # The combine (its read and write of the second sibling's values) and the scatter.
    assert len(re.findall(r"pf_a\[4 \+ pf_k\]", body)) == 3
    rep = compile_clean(src)
    # The block step's shared workspace holds 8 values of 32 x 32 threads.
    assert rep.static_smem_bytes >= 8 * 32 * 32 * 4, rep.summary()


def test_siblings_of_different_ops_stay_apart():
    """A sum and a max over the same dims: two block steps, two grid steps (the max following
    the sum's last block), both right."""
    fd = batchnorm_backward_sums(second_op="max")
    inputs = _inputs()
    st, _, _, kernel = schedule_and_lower(fd, inputs, scheduler=reduction, params=SPLIT)
    blocks, grids = _steps(kernel)
    assert [len(s.values) for s in blocks] == [1, 1] and [len(s.values) for s in grids] == [1, 1]
    assert [g.follows_last_block for g in grids] == [False, True]
    interpret_against_float64(fd, st, kernel, inputs)


def test_grouping_stops_at_the_shared_workspace_bound():
    """1024 threads (16 x 64) of 8 values each: one block step takes 32 KiB of shared memory,
    two would take 64 KiB, past GROUPED_WORKSPACE_BYTES: the siblings stay apart."""
    assert 16 * 64 * 8 * 4 <= GROUPED_WORKSPACE_BYTES < 2 * 16 * 64 * 8 * 4
    fd = batchnorm_backward_sums(DataType.BFloat16)
    x = torch.empty(32, 256, 56, 56, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    inputs = [x, torch.empty_like(x), torch.empty(256), torch.empty(256)]
    params = ReductionParams(False, 8, 16, 64, 1, (0, 1), grid_split=64)
    _, _, _, kernel = schedule_and_lower(fd, inputs, scheduler=reduction, params=params)
    blocks, grids = _steps(kernel)
    assert [len(s.values) for s in blocks] == [1, 1] and [len(s.values) for s in grids] == [1, 1]
    compile_clean(generate_cuda(kernel))


@pytest.mark.parametrize("shape", [(3, 40), (65, 9)])
def test_sibling_block_reductions_of_rows_reduce_in_one_pass(shape):
    """Row sums of x and of x * x (no grid split): one block step over threadIdx.x holding
    both, right on the interpreter."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sum(t, [1]))
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [1]))
    inputs = [torch.randn(*shape)]
    st, _, _, kernel = schedule_and_lower(fd, inputs)
    blocks, grids = _steps(kernel)
    assert [len(s.values) for s in blocks] == [2] and not grids, blocks
    interpret_against_float64(fd, st, kernel, inputs)
    compile_clean(generate_cuda(kernel))


def test_steps_apart_in_the_body_are_not_grouped():
    """A statement between two block steps keeps them apart (the pass only reorders steps that
    are side by side)."""
    from pyfuser.lower.grouped_reductions import group_sibling_reductions
    fd = batchnorm_backward_sums()
    inputs = _inputs()
    st, _, _, _ = schedule_and_lower(fd, inputs, scheduler=reduction, params=SPLIT)
    kernel = lower_upto(st.fusion, "index_and_predicate")
    for body in K.bodies(kernel.body):
        k = next((i for i, s in enumerate(body) if isinstance(s, K.BlockReduce)), None)
        if k is not None:
            body.insert(k + 2, K.Comment("between"))
            break
    kernel = group_sibling_reductions(kernel)
    blocks, _ = _steps(kernel)
    assert [len(s.values) for s in blocks] == [1, 1], blocks


def _mixed_sums(dims):
    """Sums of x and x * x over `dims` of a bf16 [8192, 4096], in float and in double: the
    kernel's block-reduction workspace is one array per type at its largest step's size."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        f, d = fd.ops.cast(t, DataType.Float), fd.ops.cast(t, DataType.Double)
        for v in (f, d):
            fd.add_output(fd.ops.sum(v, dims))
            fd.add_output(fd.ops.sum(fd.ops.mul(v, v), dims))
    return fd, [torch.empty(8192, 4096, dtype=torch.bfloat16)]


def test_grouping_does_not_grow_a_workspace_of_two_types_past_the_bound():
    """Column sums in float and in double, 64 x 8 threads of 8 columns: each type's array holds
    the largest step's 8 x 64 x 8 elements (48 KiB for both types). Grouping the float sums
    would double both arrays (96 KiB of static shared memory): they stay apart, and the kernel's
    workspace is what it was. The row sums' block steps over threadIdx.x (a few elements per
    warp) group."""
    fd, inputs = _mixed_sums([0])
    _, _, params, kernel = schedule_and_lower(fd, inputs, scheduler=reduction)
    assert (params.bdimx, params.bdimy, params.vector) == (64, 8, 8), params
    blocks, _ = _steps(kernel)
    assert [len(s.values) for s in blocks] == [1, 1, 1, 1], blocks
    assert kernel.reduction_workspace == 8 * 64 * 8
    fd, inputs = _mixed_sums([1])
    _, _, _, kernel = schedule_and_lower(fd, inputs, scheduler=reduction)
    blocks, _ = _steps(kernel)
    assert sorted(len(s.values) for s in blocks) == [2, 2], blocks
