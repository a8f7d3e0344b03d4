"""The cp.async variant of the inner persistent scheduler and the cp.async kind of the
`pipeline_loads` pass (CPU).

Rows a 1D bulk copy refuses (row bytes not a multiple of 16, 8-byte aligned pointers or strides)
are copied by the threads that read them, with cp.async, into a circular buffer. Here: the choice
and its reasons, the structure of the lowered kernel (prologue / main loop / epilogue, one commit
per stage, wait_group(prefetch), no barrier when each thread reads its own copies), the
interpreter against the reference (it lands a copy only at the wait that covers its group and
keeps it private to its thread until a block barrier, so a wrong count or a missing barrier
fails), the barriers of a schedule whose threads read each other's copies, and NVRTC compiles
for sm_90a with a clean ptxas report.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kir_testing import compile_clean  # noqa: E402
from kir_testing import (InterpreterError, clone_bindings, empty_inputs,  # noqa: E402
                         forced_inner_persistent, interpret, lower_upto,
                         lowered_inner_persistent, reference, schedule_and_lower, setup)
from pyfuser import DataType, FusionDefinition, catalogue, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.ir import LoadKind, ParallelType as PT  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.kir.printer import kernel_str  # noqa: E402
from pyfuser.kir.verifier import KernelIRError  # noqa: E402
from pyfuser.lower import verify  # noqa: E402
from pyfuser.schedule import cache_after, circular_buffer, inline_at  # noqa: E402
from pyfuser.schedule.schedulers import inner_persistent as ip  # noqa: E402

FORWARD = ["softmax", "log_softmax", "rmsnorm_fwd", "add_rmsnorm_fwd", "layernorm_fwd"]
TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "bf16": dict(rtol=2e-2, atol=2e-2)}


def lowered(name, M, N, dtype="bf16", **changes):
    fd, inputs, st, p, k = lowered_inner_persistent(name, M, N, dtype, "tma_inner_persistent",
                                                    **changes)
    assert p.cp_async_inputs and not p.tma_inputs, p.reason
    return fd, inputs, st, p, k


def _loop(kernel, label):
    (loop,) = [s for s in K.walk(kernel.body) if isinstance(s, K.ForLoop) and s.label == label]
    return loop


def _copies(body):
    return [s for s in K.walk(body) if isinstance(s, K.CpAsyncCopy)]


def _check_against_reference(fd, inputs, k, st, dtype):
    outs, it = interpret(k, st.bindings, inputs)
    refs = reference(fd, inputs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.double(), r.double(), **TOL[dtype])
    for j, _ in enumerate(fd.fusion.outputs):
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert set(counts) == {1} and len(counts) == refs[j].numel()


# The choice -------------------------------------------------------------------------------
def _forced(fd, inputs, alignment=None):
    with options.override(enable=["tma_inner_persistent"]):
        st = setup(fd, inputs, alignment=alignment)
        return ip.compute_heuristics(st.fusion, st.info)


def test_rows_the_bulk_copy_refuses_are_copied_with_cp_async():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    p = _forced(fd, empty_inputs("rmsnorm_fwd", 4096, 1004), alignment=16)
    assert (p.tma_inputs, p.cp_async_inputs, p.cp_async_bytes) == ((), (0,), (8,))
    assert (p.stages, p.prefetch, p.vector) == (4, 3, 4)
    assert p.grid == 132 * p.blocks_per_sm and p.blocks_per_sm == 4
    assert "2008 bytes, not a multiple of 16" in p.reason
    assert "cp.async instead" in p.reason and "8-byte copies" in p.reason
    assert "cp.async: inputs [0] copied by the threads that read them" in p.describe()


def test_the_bulk_path_stays_where_its_rules_hold():
    fd = catalogue.define("add_rmsnorm_fwd", "bf16")
    p = _forced(fd, empty_inputs("add_rmsnorm_fwd", 4096, 1024), alignment=16)
    assert (p.tma_inputs, p.cp_async_inputs, p.cp_async_bytes) == ((0, 1), (), ())
    assert p.reason.startswith("TMA forced on (tma_inner_persistent): 1D bulk copies")
    fd, inputs, st, p, k = lowered_inner_persistent("add_rmsnorm_fwd", 9, 64, "fp32",
                                                    "tma_inner_persistent")
    assert p.tma_inputs == (0, 1) and not p.cp_async_inputs
    assert not _copies(k.body) and any(isinstance(s, K.BulkLoad) for s in K.walk(k.body))
    assert {kind for *_, kind in k.circular_buffers} == {"pipelined"}


def test_a_less_aligned_pointer_narrows_the_copies_and_the_vectors():
    """8-byte aligned rows of 1024 bf16: no bulk copy; cp.async of 8 bytes, so the kernel's
    vectors (8 elements for registers) become 4."""
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = empty_inputs("rmsnorm_fwd", 4096, 1024)
    assert _forced(fd, inputs, alignment=16).tma_inputs == (0,)
    p = _forced(fd, inputs, alignment=8)
    assert (p.cp_async_inputs, p.cp_async_bytes, p.vector) == ((0,), (8,), 4)
    assert "8-byte aligned, not 16" in p.reason
    assert set(p.vector_inputs) >= {0}


def test_one_staging_kind_per_kernel():
    """add_rmsnorm with a bulk-copyable x and an 8-byte aligned residual: both rows are staged
    with cp.async (one pipelining pass per loop), at the width both allow."""
    fd = catalogue.define("add_rmsnorm_fwd", "bf16")
    inputs = empty_inputs("add_rmsnorm_fwd", 4096, 1024)
    p = _forced(fd, inputs, alignment=[16, 8, 16])
    assert (p.tma_inputs, p.cp_async_inputs, p.cp_async_bytes, p.vector) == ((), (0, 1),
                                                                             (8, 8), 4)
    assert "input 1: its data pointer is 8-byte aligned" in p.reason
    assert "input 0:" not in p.reason


@pytest.mark.parametrize("stride,nbytes", [(2052, 8), (2050, 4), (2056, 16)])
def test_row_strides_choose_the_copy_width(stride, nbytes):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        fd.add_output(fd.ops.div(xf, fd.ops.sum(xf, [1], keepdim=True)))
    x = torch.empty(64, stride, dtype=torch.bfloat16)[:, :2048]
    p = _forced(fd, [x], alignment=16)
    if nbytes == 16:
        assert p.tma_inputs == (0,) and not p.cp_async_inputs
    else:
        assert p.cp_async_bytes == (nbytes,) and f"stride {stride}" in p.reason


@pytest.mark.parametrize("dtype,n,why", [
    ("bf16", 1001, "allow 2-byte copies"),     # 2-byte elements, no vector divides the row
    ("fp16", 1003, "allow 2-byte copies"),
])
def test_copies_under_4_bytes_keep_register_rows(dtype, n, why):
    fd = catalogue.define("layernorm_fwd", dtype)
    p = _forced(fd, empty_inputs("layernorm_fwd", 64, n, dtype), alignment=16)
    assert p.stages == 0 and not p.cp_async_inputs and not p.tma_inputs
    assert "cp.async not possible either, register rows instead" in p.reason and why in p.reason
    assert f"{n * 2} bytes, not a multiple of 16" in p.reason


def test_non_contiguous_rows_keep_register_rows():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, False], dtype=DataType.Float)
        fd.add_output(fd.ops.div(x, fd.ops.sum(x, [1], keepdim=True)))
    x = torch.empty(64, 2000, dtype=torch.float32)[:, ::2]      # innermost stride 2
    p = _forced(fd, [x], alignment=16)
    assert p.stages == 0 and "rows not contiguous" in p.reason


def test_stage_count_follows_the_tma_rule():
    """fp32 rows of 16383 (vector 1, 4-byte copies, 64 KB slots per stage): two stages fit the
    shared-memory budget, four do not."""
    fd = catalogue.define("rmsnorm_fwd", "fp32")
    p = _forced(fd, empty_inputs("rmsnorm_fwd", 256, 16383, "fp32"), alignment=16)
    slot = p.bdimy * p.persistent_batch * p.bdimx * p.vector * 4
    assert p.cp_async_bytes == (4,) and (p.stages, p.prefetch) == (2, 1)
    assert 2 * slot <= ip._tma_budget(setup(fd, empty_inputs("rmsnorm_fwd", 2, 2, "fp32")).info)
    assert p.blocks_per_sm == 1


# The lowered kernel -----------------------------------------------------------------------
def test_pipelined_structure():
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 37, 1004, stages=4, prefetch=3, grid=5)
    assert [(s, pf, kind) for _, s, pf, kind in k.circular_buffers] == [(4, 3, "cp.async")]
    body = k.body
    assert not any(isinstance(s, (K.MBarrierAlloc, K.BulkLoad, K.MBarrierWait))
                   for s in K.walk(body))
    slot = next(s.buffer for s in body if isinstance(s, K.Allocate)
                and s.buffer.memory == "shared")
    per_stage = p.bdimy * p.persistent_batch * p.bdimx * p.vector
    assert slot.size.value == 4 * per_stage
    # Prologue: `prefetch` issues of iterations 0, 1, 2 (each guarded by `s < trips`), each
    # followed by an unconditional commit (an out-of-range stage commits an empty group).
    top = [s for s in body if isinstance(s, (K.IfThenElse, K.CpAsyncCommit))]
    assert [type(s).__name__ for s in top] == ["IfThenElse", "CpAsyncCommit"] * 3
    for j, guard in enumerate(top[::2]):
        assert repr(guard.cond).startswith(f"({j} < pf_cp_trips_")
        copies = _copies(guard.then_body)
        assert copies and all(c.bytes == 8 and c.dst.vector == 4 for c in copies)
        assert all(f"+ {j * per_stage})" in repr(c.dst.index) or j == 0 for c in copies)
    main, epi = _loop(k, K.CB_MAIN_LOOP), _loop(k, K.CB_EPILOGUE)
    kinds = [type(s).__name__ for s in main.body]
    # Main loop: issue k + 3 into slot (k + 3) % 4, commit, wait until 3 groups are pending,
    # then the body; no block barrier (each thread reads only what it copied).
    first_commit = kinds.index("CpAsyncCommit")
    assert kinds.count("CpAsyncCommit") == 1 and kinds[first_commit + 1] == "CpAsyncWait"
    assert main.body[first_commit + 1].pending == 3
    assert _copies(main.body[:first_commit]) and not _copies(main.body[first_commit:])
    kv = main.var.name
    assert all(f"((({kv} + 3) % 4) * {per_stage})" in repr(c.dst.index)
               for c in _copies(main.body))
    assert not any(isinstance(s, K.BlockSync) for s in K.walk(main.body + epi.body))
    # Epilogue: an empty group per iteration keeps wait_group(3) meaning "iteration k landed".
    assert [type(s).__name__ for s in epi.body[:2]] == ["CpAsyncCommit", "CpAsyncWait"]
    assert epi.body[1].pending == 3 and not _copies(epi.body)
    assert repr(epi.start) == f"max({main.stop!r}, 0)"
    # Reads of the slot address the iteration's stage.
    reads = [i for s in K.walk(main.body) if isinstance(s, K.TensorOp) for i in s.ins
             if isinstance(i, K.TensorIndex) and i.buffer is slot]
    assert reads and all(f"(({kv} % 4) * {per_stage})" in repr(i.index) for i in reads)
    assert k.bulk_sources == set() and k.vector_widths["T0"] == 4
    text = kernel_str(k)
    assert "cp_async_wait_group 3" in text and "cp_async_commit_group" in text


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype,M,N,stages,grid", [
    ("bf16", 9, 1004, 2, 1), ("bf16", 7, 1002, 3, 2), ("fp32", 5, 1001, 4, 3),
    ("bf16", 33, 202, 4, 2)])
def test_interpreted_cp_async_kernels_match_the_reference(name, dtype, M, N, stages, grid):
    fd, inputs, st, p, k = lowered(name, M, N, dtype, stages=stages, grid=grid)
    _check_against_reference(fd, inputs, k, st, dtype)


def test_prefetch_below_stages_minus_one():
    fd, inputs, st, p, k = lowered("softmax", 29, 202, stages=4, prefetch=1, grid=2)
    waits = [s for s in K.walk(k.body) if isinstance(s, K.CpAsyncWait)]
    assert len(waits) == 2 and {w.pending for w in waits} == {1}
    _check_against_reference(fd, inputs, k, st, "bf16")


def test_strided_rows_with_narrowed_copies():
    """Rows of 1004 bf16 in a tensor of row stride 1010 (8-byte aligned view): 4-byte copies,
    so the register split uses 2-element vectors."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                  DataType.BFloat16))
    x = torch.randn(11, 1010).to(torch.bfloat16)[:, 4:1008]
    params = forced_inner_persistent(fd, [x], "tma_inner_persistent", grid=3)
    assert params.cp_async_bytes == (4,) and params.vector == 2, params.reason
    st, _, p, k = schedule_and_lower(fd, [x], params=params, scheduler=ip)
    _check_against_reference(fd, [x], k, st, "bf16")


@pytest.mark.parametrize("break_it", ["wait one group less", "no epilogue commit",
                                      "no prologue commit"])
def test_a_wrong_group_count_is_caught_by_the_interpreter(break_it):
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 40, 1004, stages=3, grid=2)
    _check_against_reference(fd, inputs, k, st, "bf16")
    epi = _loop(k, K.CB_EPILOGUE)
    if break_it == "wait one group less":
        for s in K.walk(k.body):
            if isinstance(s, K.CpAsyncWait):
                s.pending += 1
    elif break_it == "no epilogue commit":
        epi.body = [s for s in epi.body if not isinstance(s, K.CpAsyncCommit)]
    else:
        j = next(j for j, s in enumerate(k.body) if isinstance(s, K.CpAsyncCommit))
        del k.body[j]
    with pytest.raises(InterpreterError, match="unwritten registers|never waited"):
        interpret(k, st.bindings, inputs)


# Barriers when threads read each other's copies ------------------------------------------
def _row_copied_by_one_thread(buffered: bool):
    """exp of [M, 64] fp32 rows: the slot is copied element by element by threadIdx.x == 0
    (no thread axis), and read by 32 threads two elements each: every read crosses threads."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 64], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    slot = cache_after(f.inputs[0], LoadKind.CpAsync)
    out.split(1, 2)
    out.parallelize(0, PT.GridStride).parallelize(1, PT.TIDx)
    slot.parallelize(0, PT.GridStride)
    inline_at(slot, 1)
    if buffered:
        circular_buffer(slot, 3)
    f.launch_hints["grid_x"] = 2
    return fd, mapping, lower_upto(f)


def test_cross_thread_reads_get_block_barriers():
    fd, mapping, k = _row_copied_by_one_thread(buffered=True)
    xs = torch.randn(7, 64)
    main, epi = _loop(k, K.CB_MAIN_LOOP), _loop(k, K.CB_EPILOGUE)
    kinds = [type(s).__name__ for s in main.body]
    w = kinds.index("CpAsyncWait")
    assert kinds[w + 1] == "BlockSync" and kinds[-1] == "BlockSync"       # RAW and WAR
    assert [type(s).__name__ for s in epi.body[:3]] == ["CpAsyncCommit", "CpAsyncWait",
                                                        "BlockSync"]
    assert any(isinstance(s, K.Comment) and "read across threads" in s.text for s in k.body)
    outs, _ = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    torch.testing.assert_close(outs[0], xs.exp(), rtol=1e-6, atol=1e-6)
    # Without the barrier after the wait a thread reads another's copy before it is visible;
    # without the one ending the iteration a copy overwrites a slot others still read.
    raw = list(main.body)
    del main.body[w + 1]
    with pytest.raises(InterpreterError, match="another thread copied"):
        interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    main.body = raw[:-1]
    with pytest.raises(InterpreterError, match="read with no block barrier since"):
        interpret(k, clone_bindings(fd, mapping, [xs]), [xs])


def test_unbuffered_cp_async_load_in_place():
    fd, mapping, k = _row_copied_by_one_thread(buffered=False)
    loop = next(s for s in k.body if isinstance(s, K.ForLoop) and s.parallel == "GridStride")
    kinds = [type(s).__name__ for s in loop.body if not isinstance(s, K.Comment)]
    assert kinds[:2] == ["BlockSync", "ForLoop"]
    assert kinds[2:5] == ["CpAsyncCommit", "CpAsyncWait", "BlockSync"]
    assert next(s for s in loop.body if isinstance(s, K.CpAsyncWait)).pending == 0
    xs = torch.randn(5, 64)
    outs, _ = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    torch.testing.assert_close(outs[0], xs.exp(), rtol=1e-6, atol=1e-6)


def test_own_copies_need_no_barrier_unbuffered():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 64], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x))
    f, mapping = fd.fusion.clone()
    out = f.outputs[0]
    slot = cache_after(f.inputs[0], LoadKind.CpAsync)
    for t in (out, slot):
        t.split(1, 2)
        t.parallelize(0, PT.GridStride).parallelize(1, PT.TIDx)
    slot.parallelize(2, PT.Vectorize)
    inline_at(slot, 1)
    f.launch_hints["grid_x"] = 2
    k = lower_upto(f)
    assert not any(isinstance(s, K.BlockSync) for s in K.walk(k.body))
    assert [c.bytes for c in _copies(k.body)] == [8]
    xs = torch.randn(5, 64)
    outs, _ = interpret(k, clone_bindings(fd, mapping, [xs]), [xs])
    torch.testing.assert_close(outs[0], xs.exp(), rtol=1e-6, atol=1e-6)


# Verifier rules -----------------------------------------------------------------------------
def test_verifier_rules():
    fd, inputs, st, p, k = lowered("softmax", 9, 1004, grid=2)
    verify(k, after="launch_config")
    copy = _copies(k.body)[0]
    copy.bytes = 4
    with pytest.raises(KernelIRError, match="moves T"):
        verify(k, after="launch_config")
    copy.bytes = 8
    waits = [s for s in K.walk(k.body) if isinstance(s, K.CpAsyncWait)]
    waits[0].pending = -1
    with pytest.raises(KernelIRError, match="non-negative constant"):
        verify(k, after="launch_config")
    for w in waits:
        w.pending = 0
    main = _loop(k, K.CB_MAIN_LOOP)
    main.body = [s for s in main.body if not isinstance(s, K.CpAsyncWait)]
    _loop(k, K.CB_EPILOGUE).body = [s for s in _loop(k, K.CB_EPILOGUE).body
                                    if not isinstance(s, K.CpAsyncWait)]
    with pytest.raises(KernelIRError, match="never waits"):
        verify(k, after="launch_config")


def test_a_cp_async_load_left_as_a_tensor_op_is_refused_by_the_verifier():
    fd = catalogue.define("softmax", "bf16")
    inputs = catalogue.make_inputs("softmax", 9, 1004, "bf16", seed=1)
    params = forced_inner_persistent(fd, inputs, "tma_inner_persistent")
    st = setup(fd, inputs)
    ip.schedule(st.fusion, params)
    k = lower_upto(st.fusion, "vectorize_and_unroll")     # the pass before pipeline_loads
    with pytest.raises(KernelIRError, match="still a TensorOp after pipeline_loads"):
        verify(k, after="pipeline_loads")


# NVRTC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype,M,N,nbytes", [("bf16", 16384, 1004, 8), ("bf16", 7, 1002, 4),
                                              ("fp32", 4096, 1001, 4), ("bf16", 333, 4100, 8)])
def test_cp_async_kernels_compile_clean(name, dtype, M, N, nbytes):
    fd = catalogue.define(name, dtype)
    with options.override(enable=["tma_inner_persistent"]):
        st, _, p, k = schedule_and_lower(fd, empty_inputs(name, M, N, dtype), alignment=16)
    assert p.stages >= 2 and set(p.cp_async_bytes) == {nbytes}, p.reason
    src = generate_cuda(k)
    assert f"pf::cp_async<{nbytes}>(" in src and "pf::cp_async_commit_group();" in src
    assert f"pf::cp_async_wait_group<{p.prefetch}>();" in src
    assert "mbarrier" not in src[src.index('extern "C" __global__'):]
    assert f"__launch_bounds__({k.launch.max_threads}, {p.blocks_per_sm})" in src
    assert k.launch.grid[0] == p.grid
    compile_clean(src)


@pytest.mark.parametrize("n", [10714, 1002])
def test_rows_of_a_view_with_its_size_1_dim_innermost(n):
    """Fuzz case 7:134: the [1, N] view of an [N, 1] tensor (x.t(), defined with stride_order
    [0, 1]) has its size-1 dim innermost in the allocation. A dim of size 1 has no meaningful
    stride, so the rows are read (and copied with cp.async, N * 2 bytes not a multiple of 16)
    along N, in vectors; the copy of 1 x 2 bytes was an internal error."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16, stride_order=[0, 1])
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
    x = torch.randn(n, 1, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).t()
    params = forced_inner_persistent(fd, [x], "tma_inner_persistent")
    assert params.cp_async_inputs == (0,) and params.vector_inputs == (0,), params.reason
    assert params.cp_async_bytes == (params.vector * 2,) and params.vector > 1
    st, _, p, k = schedule_and_lower(fd, [x], params=params, scheduler=ip)
    assert k.vector_widths["T0"] == params.vector
    _check_against_reference(fd, [x], k, st, "bf16")


def test_rows_read_element_wise_keep_register_rows(monkeypatch):
    """The copies are the register split's accesses, not what the row's layout would allow: an
    input no vector loads are given along its rows (here: none, by the vector rule patched)
    would be copied 2 bytes at a time, under cp.async's 4, so the register rows stay (7:134
    lowered 1 x 2-byte copies before the rows were read along N)."""
    monkeypatch.setattr(ip, "vector_inputs", lambda *args: ())
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, [1], keepdim=True)))
    p = _forced(fd, [torch.empty(4, 1002, dtype=torch.bfloat16)], alignment=16)
    assert p.stages == 0 and not p.cp_async_inputs and p.vector == 1
    assert ("register rows instead: input 0: the row split reads it 2 bytes at a time (no "
            "vector loads along its rows), and a cp.async copy moves 4, 8 or 16") in p.reason
