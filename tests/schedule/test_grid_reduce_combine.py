"""The last block's combine of a grid reduction (codegen/cuda.py _GridReduce, the interpreter's
_GridReduce): every thread of the last block takes a fixed strided share of the G partials, in
block order, then a block all-reduce in its fixed tree order. Forced grid splits on the
interpreter against float64 (odd G, G larger and smaller than the block, kept rows beside the
split), the combine order itself, bit-identical runs, NVRTC for sm_90a with the ptxas report."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import schedule_and_lower  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.schedule.schedulers import reduction  # noqa: E402
from pyfuser.testing import run_and_check  # noqa: E402

INTERPRET = {"enable": ["interpret"]}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}


def reduce_fusion(dtype, rank: int, dims, op="sum"):
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1] * rank, dtype=DataType.BFloat16 if dtype == "bf16"
                             else DataType.Float)
        t = fd.ops.cast(t, DataType.Float) if dtype == "bf16" else t
        fd.add_output({"sum": fd.ops.sum, "max": fd.ops.max, "min": fd.ops.min}[op](t, dims))
    return fd


def _full(bdimx, grid_split, vector=1, unroll=1):
    return reduction.ReductionParams(True, vector, bdimx, 1, unroll,
                                     (0,) if vector > 1 else (), grid_split, full=True)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n,bdimx,grid_split", [
    (4099, 32, 67),      # odd G, larger than the block: threads take 2 or 3 partials each
    (4099, 64, 7),       # odd G, smaller than the block: most threads take none
    (1001, 32, 33),      # G one more than the block
    (5, 32, 3),          # blocks without elements
])
def test_forced_full_grid_splits_on_the_interpreter(n, bdimx, grid_split, dtype, op):
    x = torch.randn(n).to(TORCH[dtype])
    fd = reduce_fusion(dtype, 1, [0], op)
    p = _full(bdimx, grid_split)
    run_and_check(fd, [x], scheduler="reduction", options={**INTERPRET, "heuristic": p})
    assert fd.last_run.heuristics[0] == p


@pytest.mark.parametrize("grid_split", [5, 41])
def test_forced_inner_grid_split_with_kept_rows(grid_split):
    """A grid-split row reduction: one semaphore and one set of partials per row (kept blocks
    along blockIdx.x), each row's last block combining its own."""
    x = torch.randn(3, 2053)
    fd = reduce_fusion("fp32", 2, [1])
    p = reduction.ReductionParams(True, 1, 32, 1, 1, (), grid_split)
    run_and_check(fd, [x], scheduler="reduction", options={**INTERPRET, "heuristic": p})


def test_the_combine_order_is_strided_then_a_tree():
    """Partials 1e16, 1, 0, ..., 0, -1e16 at block 32 (of 40, blocks of 32 threads), in float64
    (which the interpreter computes in exactly): in block order the 1 is lost (1e16 + 1 rounds
    to 1e16) and the sum is 0; thread 0 of the last block takes blocks 0 and 32 (0), thread 1
    block 1, and the sum is 1, as on the GPU (tests/gpu/test_reduction_gpu.py)."""
    g, bdimx = 40, 32
    x = torch.zeros(g * bdimx, dtype=torch.float64)   # block b reduces [32 b, 32 b + 32)
    x[0], x[32], x[32 * 32] = 1e16, 1.0, -1e16
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.define_tensor([-1], dtype=DataType.Double), [0]))
    (out,) = fd.execute([x], options={**INTERPRET, "heuristic": _full(bdimx, g)})
    assert fd.last_run.kind == "kernels" and fd.last_run.schedulers == ("reduction",)
    assert out.item() == 1.0


def test_two_runs_are_bit_identical():
    x = torch.randn(9001)
    fd = reduce_fusion("fp32", 1, [0])
    opts = {**INTERPRET, "heuristic": _full(32, 71)}
    first = fd.execute([x], options=opts)[0]
    second = fd.execute([x], options=opts)[0]
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))


def _source(fd, inputs):
    from pyfuser.codegen.cuda import generate_cuda
    st, sch, p, k = schedule_and_lower(fd, inputs, scheduler=reduction)
    assert any(isinstance(s, K.GridReduce) for s in K.walk(k.body))
    return p, k, generate_cuda(k)


@pytest.mark.parametrize("name", ["mse_mean", "amax_scale"])
def test_the_last_block_combines_with_all_its_threads_and_compiles_clean(name):
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime.nvrtc import compile_to_cubin
    from pyfuser.schedule.segmenter import segment
    fd = catalogue.define(name, "bf16")
    n_in = len(fd.fusion.inputs)
    ins = [torch.empty(8192, 8192, dtype=torch.bfloat16, device="meta")] * n_in
    if name == "amax_scale":
        # Its reduction segment, as the plan runs it (x read in bf16: the cast is forwarded).
        seg = segment(fd.fusion).segments[0]
        sub = FusionDefinition()
        sub.fusion = seg.fusion
        fd = sub
    p, k, src = _source(fd, ins)
    assert p.full and p.grid_split > 1
    body = src[src.index("if (pf_grid_last) {"):]
    # The strided share, then the block all-reduce, both inside the last block's branch.
    last = body[:body.index("\n  }\n")]
    assert "pf_r = pf_rt; pf_r < pf_nred; pf_r += pf_nrt" in last
    assert "pf::block_allreduce_x" in last
    mod = compile_to_cubin(src, k.name, arch="sm_90a")
    rep = mod.ptxas
    assert (rep.spill_store_bytes, rep.spill_load_bytes, rep.stack_frame_bytes) == (0, 0, 0), \
        rep.summary()

