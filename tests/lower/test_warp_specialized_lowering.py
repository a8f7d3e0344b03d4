"""The warp-specialized TMA variant of the inner persistent scheduler and the warp-specialized
kind of the `pipeline_loads` pass (CPU).

Structure of the lowered kernel (role split on threadIdx.y, setmaxnreg counts, full/empty
mbarrier counts and parities, named barriers in the compute role, launch shape), the
interpreter running producer and compute roles as cooperating groups against the reference
(a wrong parity or a missing release deadlocks there and is reported), the refusals, and
NVRTC compiles for sm_90a with a clean ptxas report (no "setmaxnreg ignored").
"""
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kir_testing import compile_clean  # noqa: E402
from kir_testing import (InterpreterError, empty_inputs, forced_inner_persistent,  # noqa: E402
                         interpret, lowered_inner_persistent, reference, schedule_and_lower,
                         setup)
from pyfuser import catalogue, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.ir import scalar as S  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.kir.verifier import KernelIRError  # noqa: E402
from pyfuser.lower import verify  # noqa: E402
from pyfuser.lower import LoweringError  # noqa: E402
from pyfuser.schedule.schedulers import inner_persistent as ip  # noqa: E402

FORWARD = ["rmsnorm_fwd", "layernorm_fwd", "softmax", "log_softmax", "add_rmsnorm_fwd"]
TOL = dict(rtol=1e-5, atol=1e-5)


def forced_ws(fd, inputs, **changes):
    return forced_inner_persistent(fd, inputs, "ws_inner_persistent", **changes)


def lowered(name, M, N, dtype="bf16", **changes):
    return lowered_inner_persistent(name, M, N, dtype, "ws_inner_persistent", **changes)


def _loop(kernel, label):
    (loop,) = [s for s in K.walk(kernel.body) if isinstance(s, K.ForLoop) and s.label == label]
    return loop


def _split(kernel):
    (split,) = [s for s in kernel.body if isinstance(s, K.RoleSplit)]
    return split


def test_structure_rmsnorm_4096():
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 4096, 4096, stages=4, bdimy=2)
    assert (p.bdimx, p.bdimy, p.grid) == (128, 2, 132)
    assert [(s, kind) for _, s, _, kind in k.circular_buffers] == [(4, "warp_specialized")]
    roles = k.warp_roles
    assert (roles.compute_extent, roles.producer_extent) == (2, 1)
    assert (roles.compute_threads, roles.producer_threads) == (256, 128)
    # 384 threads: 168 registers each at entry; 40 x 128 + 232 x 256 = 64512 <= 65536.
    assert (roles.producer_registers, roles.compute_registers) == (40, 232)
    assert [int(S.evaluate(b, dict(st.bindings))) for b in k.launch.block] == [128, 3, 1]
    assert (k.launch.max_threads, k.launch.min_blocks) == (384, 1)
    # Barriers: full[s] completes on the producer's one arrival plus the bytes; empty[s] on
    # every compute thread's release.
    inits = [x for x in K.walk(k.body) if isinstance(x, K.MBarrierInit)]
    full = {x.bar.index.value: x.arrivals.value for x in inits if x.bar.bars.name.startswith("pf_full")}
    empty = {x.bar.index.value: x.arrivals.value for x in inits if x.bar.bars.name.startswith("pf_empty")}
    assert full == {s: 1 for s in range(4)} and empty == {s: 256 for s in range(4)}
    split = _split(k)
    assert [rb.role.name for rb in split.roles] == ["producer", "compute"]
    assert repr(split.roles[0].cond) == "(1 < threadIdx.y)" and split.roles[1].cond is None
    producer, compute = split.roles[0].body, split.roles[1].body
    assert isinstance(producer[0], K.SetMaxNReg) and (producer[0].count, producer[0].increase) == (40, False)
    assert isinstance(compute[0], K.SetMaxNReg) and (compute[0].count, compute[0].increase) == (232, True)
    # Producer: one elected thread; for iteration k >= S it first waits for the compute role to
    # release slot k % S (phase k / S - 1 of empty), then issues the copies and arrives on full.
    pl = _loop(k, K.WS_PRODUCER_LOOP)
    kv = pl.var.name
    # The loop's index first (the copies read it), then the guard.
    index_def, guard = pl.body[0], pl.body[1]
    assert isinstance(index_def, K.ScalarDef) and kv in repr(index_def.value)
    assert repr(guard.cond) == f"(3 < {kv})"
    (wait_empty,) = guard.then_body
    assert repr(wait_empty.bar) == f"pf_empty_j11[({kv} % 4)]" or \
        re.fullmatch(rf"pf_empty_\w+\[\({kv} % 4\)\]", repr(wait_empty.bar))
    assert repr(wait_empty.parity) == f"((({kv} / 4) + 1) % 2)"
    loads = [x for x in K.walk(pl.body) if isinstance(x, K.BulkLoad)]
    assert loads and all(repr(x.bar.index) == f"({kv} % 4)" for x in loads)
    assert all("threadIdx" not in repr(x.predicate) for x in loads)
    assert isinstance(pl.body[-1], K.MBarrierArrive) and pl.body[-1].bar.bars.name.startswith("pf_full")
    # Compute: waits on full at parity (k / S) % 2, computes, releases the slot last.
    cl = _loop(k, K.WS_COMPUTE_LOOP)
    cv = cl.var.name
    wait_full = next(s for s in cl.body if isinstance(s, K.MBarrierWait))
    assert repr(wait_full.parity) == f"(({cv} / 4) % 2)"
    assert isinstance(cl.body[-1], K.MBarrierArrive) and cl.body[-1].bar.bars.name.startswith("pf_empty")
    # Synchronization inside the compute role is among the 256 compute threads only.
    reduces = [x for x in K.walk(compute) if isinstance(x, K.BlockReduce)]
    assert reduces and all(x.barrier == (1, 256) for x in reduces)
    assert not any(isinstance(x, K.BlockSync) and x.barrier_id is None for x in K.walk(producer + compute))
    # Around the split: init, fence, block barrier before; block barrier and inval after.
    assert isinstance(k.body[k.body.index(split) + 1], K.BlockSync)
    assert all(isinstance(x, K.MBarrierInval) for x in k.body[-1].then_body)
    src = generate_cuda(k)
    assert "__launch_bounds__(384, 1)" in src
    assert "pf::setmaxnreg_dec<40>();" in src and "pf::setmaxnreg_inc<232>();" in src
    assert "pf::NamedBarrier{1, 256}" in src


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(1, 64), (37, 64), (100, 128)])
@pytest.mark.parametrize("stages,grid", [(2, 1), (3, 2)])
def test_interpreted_ws_kernels_match_the_reference(name, M, N, stages, grid):
    # 16 rows of 16 threads per stage (256 compute threads): several trips around the slots.
    fd, inputs, st, p, k = lowered(name, M, N, "fp32", stages=stages, grid=grid, bdimy=16)
    outs, it = interpret(k, st.bindings, inputs)
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), **TOL)
    for j, _ in enumerate(fd.fusion.outputs):
        buf = next(q.name for q in k.params if q.source == ("output", j))
        counts = [c for (b, _), c in it.writes.items() if b == buf]
        assert set(counts) == {1} and len(counts) == reference(fd, inputs)[j].numel()


@pytest.mark.parametrize("which", ["empty", "full"])
def test_a_wrong_parity_deadlocks_in_the_interpreter(which):
    # 100 rows of 64 in groups of 16 rows: 7 iterations over 2 stages on one block.
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 100, 64, "fp32", stages=2, grid=1, bdimy=16)
    if which == "empty":
        wait = _loop(k, K.WS_PRODUCER_LOOP).body[1].then_body[0]
    else:
        wait = next(s for s in _loop(k, K.WS_COMPUTE_LOOP).body if isinstance(s, K.MBarrierWait))
    wait.parity = K.Const(0)     # right for the first use of each slot only
    with pytest.raises(InterpreterError, match="deadlock"):
        interpret(k, st.bindings, inputs)


def test_a_missing_release_deadlocks_in_the_interpreter():
    fd, inputs, st, p, k = lowered("softmax", 100, 64, "fp32", stages=2, grid=1, bdimy=16)
    cl = _loop(k, K.WS_COMPUTE_LOOP)
    assert isinstance(cl.body[-1], K.MBarrierArrive)
    cl.body.pop()
    with pytest.raises(InterpreterError, match="deadlock"):
        interpret(k, st.bindings, inputs)


def test_register_split_that_cannot_fit_is_refused_before_codegen():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    inputs = empty_inputs("rmsnorm_fwd", 4096, 4096)
    p = forced_ws(fd, inputs, bdimy=2, producer_registers=40, compute_registers=248)  # 40*128+248*256
    with pytest.raises(Exception, match="registers"):
        schedule_and_lower(fd, inputs, params=p, scheduler=ip)
    # Below the entry count (168 for 384 threads) setmaxnreg.inc would shrink, not grow.
    p = forced_ws(fd, inputs, bdimy=2, producer_registers=40, compute_registers=160)
    with pytest.raises(LoweringError, match="entry register count 168"):
        schedule_and_lower(fd, inputs, params=p, scheduler=ip)


def test_choice_reasons():
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    # Rows of 1001 bf16 (2002 bytes) cannot be bulk-copied: registers, with the reason.
    inputs = empty_inputs("rmsnorm_fwd", 64, 1001)
    with options.override(enable=["ws_inner_persistent"]):
        st = setup(fd, inputs)
        p = ip.compute_heuristics(st.fusion, st.info)
    assert not p.warp_specialized and p.stages == 0
    assert "warp-specialized TMA forced on but not possible: input 0" in p.reason
    assert "register rows instead" in p.reason
    # 40 bf16: 5 vectors as 2 threads x 3, 384 rows of compute threads.
    inputs = empty_inputs("rmsnorm_fwd", 64, 40)
    p = forced_ws(fd, inputs)
    assert (p.bdimx, p.bdimy) == (2, 384)
    # 5120 bf16: 640 vectors re-split as 128 threads x 5 to make whole warp groups.
    inputs = empty_inputs("rmsnorm_fwd", 64, 5120)
    p = forced_ws(fd, inputs)
    assert (p.bdimx, p.persistent_batch, p.bdimy) == (128, 5, 4)     # 512 compute threads
    p = forced_ws(fd, empty_inputs("rmsnorm_fwd", 64, 1024))
    assert (p.bdimx, p.bdimy) == (128, 6)                              # 768 for 2 KB rows
    assert "producer warp group" in p.describe()


def test_verifier_rejects_a_block_barrier_inside_a_role():
    fd, inputs, st, p, k = lowered("softmax", 64, 1024)
    cl = _loop(k, K.WS_COMPUTE_LOOP)
    cl.body.insert(1, K.BlockSync())
    with pytest.raises(KernelIRError, match="__syncthreads inside the compute role"):
        verify(k, after="launch_config")


def test_verifier_rejects_a_grid_barrier_inside_a_role():
    """A grid sync (or a cluster/grid reduction) in one role waits for the other role's threads,
    which never come: rejected even though the role split is not an ordinary predicate."""
    fd, inputs, st, p, k = lowered("softmax", 64, 1024)
    cl = _loop(k, K.WS_COMPUTE_LOOP)
    cl.body.insert(1, K.GridSync(None))
    with pytest.raises(KernelIRError, match="GridSync inside the compute role"):
        verify(k, after="launch_config")


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(16384, 1024), (16384, 4096), (4096, 5120), (4096, 12288),
                                 (16384, 16384)])
def test_ws_kernels_compile_clean(name, M, N):
    fd = catalogue.define(name, "bf16")
    inputs = empty_inputs(name, M, N)
    with options.override(enable=["ws_inner_persistent"]):
        st, _, p, k = schedule_and_lower(fd, inputs, alignment=16)
    assert p.warp_specialized, p.reason
    src = generate_cuda(k)
    roles = k.warp_roles
    assert f"__launch_bounds__({roles.compute_threads + roles.producer_threads}, 1)" in src
    assert f"pf::setmaxnreg_inc<{roles.compute_registers}>();" in src
    rep = compile_clean(src)
    # ptxas gives the entry count 65536 / threads (at most 255) that setmaxnreg moves.
    threads = roles.compute_threads + roles.producer_threads
    assert rep.registers == min(255, 65536 // threads) // 8 * 8, rep.summary()


def test_register_split_stays_within_the_blocks_entry_pool():
    """640 threads enter with 96 registers each (61440, not 65536): compute may grow to 104,
    not the 112 the whole register file would allow (that split hung on the H100)."""
    fd, inputs, st, p, k = lowered("rmsnorm_fwd", 4096, 4096, bdimy=4, stages=4)
    r = k.warp_roles
    assert (r.compute_threads, r.producer_threads) == (512, 128)
    assert (r.producer_registers, r.compute_registers) == (40, 104)
    assert 40 * 128 + 104 * 512 <= 96 * 640 < 40 * 128 + 112 * 512
