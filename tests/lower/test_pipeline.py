"""The pipeline mechanism (lower/pipeline.py) and the kernel IR it stands on (kir/rewrite.py).

- Every kernel-IR node kind is visited through its declared field roles: a substitution reaches
  every expression of every statement kind, and an undeclared kind is an error everywhere.
- Warp-specialized pipelines over a chain of loops (a persistent tile loop around the buffered
  loop): the stage counter runs across the tiles, with stage counts that wrap across them.
- Ping-pong: two compute roles take the outer iterations in turn through ordered named barriers
  (nested chains, and the inner persistent norm kernels under PYFUSER_ENABLE=ws_pingpong).
- The interpreter catches a broken parity, a missing release, a missing block barrier, a wrong
  role order and a stage counter that restarts per tile; NVRTC compiles every variant cleanly.
"""
import dataclasses
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kir_testing import (InterpreterError, clone_bindings, compile_clean,  # noqa: E402
                         interpret, lower_upto, lowered_inner_persistent, reference)
from pyfuser import FusionDefinition, options  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.ir import LoadKind, ParallelType as PT, WarpSpecialized  # noqa: E402
from pyfuser.ir.dtype import DataType  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.kir.printer import kernel_str  # noqa: E402
from pyfuser.kir.rewrite import (Rewriter, UnknownNodeKind, exprs_of, subexprs,  # noqa: E402
                                 substitute_stmts)
from pyfuser.kir.verifier import KernelIRError  # noqa: E402
from pyfuser.lower import verify  # noqa: E402
from pyfuser.lower.pipeline import MAIN_LOOP  # noqa: E402
from pyfuser.schedule import (cache_after, circular_buffer, inline_at, inline_most,  # noqa: E402
                              parallelize_like, propagate_transforms)

FORWARD = ["rmsnorm_fwd", "layernorm_fwd", "softmax", "log_softmax", "add_rmsnorm_fwd"]
TOL = dict(rtol=1e-5, atol=1e-5)


# Kernel IR through its roles --------------------------------------------------------------------
def _example(cls, var, buf):
    """An instance of statement kind `cls` with `var` in every expression field."""
    kw = {}
    for f in dataclasses.fields(cls):
        role = K.STMT_KINDS[cls][f.name]
        if role == K.BODY:
            kw[f.name] = []
        elif role == K.DEFINES:
            kw[f.name] = K.Var("d")
        elif role == K.OUT:
            kw[f.name] = K.TensorIndex(buf, var)
        elif role == K.EXPR:
            kw[f.name] = K.MBarrierRef(K.MBarriers("b", 2), var) if f.name == "bar" \
                else K.add(var, 1)
        elif role == K.EXPRS:
            kw[f.name] = [K.TensorIndex(buf, var)]
        elif role == K.BUFFER:
            kw[f.name] = buf
        elif role == K.BUFFERS:
            kw[f.name] = (buf, buf)
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        else:
            kw[f.name] = _DATA.get(f.name, 1)
    return cls(**kw)


_DATA = {"dims": ("x",), "op": "sum", "dtype": DataType.Float, "dim": "y", "text": "t",
         "count": 232, "map": K.RowBoxMap(0, 64, 64, 1), "role": K.WarpRole("compute", 232),
         "bars": K.MBarriers("b", 2), "expr": types.SimpleNamespace(op="sum")}


@pytest.mark.parametrize("cls", sorted(K.STMT_KINDS, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_a_substitution_reaches_every_expression_of_every_statement_kind(cls):
    v = K.Var("v")
    buf = K.Buffer("B", DataType.Float, "shared", K.Const(8))
    s = _example(cls, v, buf)
    (new,) = substitute_stmts([s], {v: K.Const(3)})
    used = [e for _, e in exprs_of(s) for e in subexprs(e)]
    left = [e for _, e in exprs_of(new) for e in subexprs(e)]
    assert any(e is v for e in used) == bool(exprs_of(s))
    assert not any(e is v for e in left), f"{cls.__name__} kept {v!r} after the substitution"
    assert new is s if not exprs_of(s) else new is not s     # copied only where changed
    assert kernel_str(K.Kernel("k", None, body=[new]))         # every kind prints


def test_an_undeclared_node_kind_is_an_error_everywhere():
    @dataclasses.dataclass(eq=False, slots=True)
    class Stray(K.Stmt):
        index: K.KExpr

    body = [K.ForLoop(K.Var("i"), K.Const(0), K.Const(4), K.Const(1), [Stray(K.Var("i"))])]
    for visit in (lambda: list(K.walk(body)), lambda: Rewriter().rewrite(body),
                  lambda: kernel_str(K.Kernel("k", None, body=body))):
        with pytest.raises((UnknownNodeKind, TypeError), match="Stray is not a kernel-IR"):
            visit()


def test_nodes_take_no_undeclared_attributes():
    op = K.BlockSync()
    with pytest.raises(AttributeError):
        op.thread_dims = ("x",)


def test_a_node_kind_must_declare_every_field():
    with pytest.raises(TypeError, match="do not name each of its fields"):
        @K.roles(expr=("a",))
        @dataclasses.dataclass(eq=False, slots=True)
        class Half(K.Stmt):
            a: K.KExpr
            b: K.KExpr


# A warp-specialized pipeline over a tile loop and a k loop --------------------------------------
def _tiled_exp(R=4, Kt=3, N=64, stages=2, roles=1, kind=LoadKind.TmaBulk):
    """y = exp(x), x [M, N] fp32 loaded into shared memory by TMA, rows in tiles of Kt steps of R
    rows: [tiles (grid-stride), Kt (serial, the buffered loop), R (TIDy), N (TIDx)]."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, N])
        fd.add_output(fd.ops.exp(x))
    f, mapping = fd.fusion.clone()
    y = f.outputs[0]
    c = cache_after(f.inputs[0], kind)
    y.split(0, R).split(0, Kt)
    propagate_transforms(y)
    y.parallelize(0, PT.GridStride).parallelize(2, PT.TIDy).parallelize(3, PT.TIDx)
    parallelize_like(y)
    c.parallelize(2, PT.Serial).parallelize(3, PT.Bulk)
    inline_most([y], fusion=f)
    inline_at(c, 2)
    circular_buffer(c, stages, kind=WarpSpecialized(PT.TIDy, compute_roles=roles))
    f.launch_hints["grid_x"] = 1
    return fd, f, mapping


def _run_tiled(fd, f, mapping, M, kernel=None):
    k = kernel or lower_upto(f)
    x = torch.randn(M, 64)
    outs, _ = interpret(k, clone_bindings(fd, mapping, [x]), [x])
    torch.testing.assert_close(outs[0], torch.exp(x), **TOL)


def _loops(k, label):
    return [s for s in K.walk(k.body) if isinstance(s, K.ForLoop) and s.label == label]


def test_the_stage_counter_runs_across_the_tile_loop():
    fd, f, mapping = _tiled_exp(stages=2)
    k = lower_upto(f)
    tile_p, k_p = _loops(k, K.WS_PRODUCER_LOOP)
    assert k_p in tile_p.body                        # the producer's own nest: tiles, k steps
    c = f"(({tile_p.var.name} * pf_ws_trips_j2) + {k_p.var.name})"
    wait = next(x for x in K.walk(k_p.body) if isinstance(x, K.MBarrierWait))
    assert repr(wait.bar.index) == f"({c} % 2)" and repr(wait.parity) == f"((({c} / 2) + 1) % 2)"
    tile_c, k_c = _loops(k, K.WS_COMPUTE_LOOP)
    assert k_c in tile_c.body
    full = next(x for x in k_c.body if isinstance(x, K.MBarrierWait))
    cc = f"(({tile_c.var.name} * pf_ws_trips_j2) + {k_c.var.name})"
    assert repr(full.parity) == f"(({cc} / 2) % 2)"
    # No drain per tile: no prologue or epilogue loops, the barriers set up once.
    assert not _loops(k, MAIN_LOOP)
    assert sum(isinstance(x, K.MBarrierInit) for x in K.walk(k.body)) == 4


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("M", [1, 12, 25, 61, 200])
def test_tiled_pipelines_on_the_interpreter(stages, M):
    # 3 k steps a tile: 2 and 4 stages wrap in the middle of tiles.
    _run_tiled(*_tiled_exp(stages=stages), M)


def test_a_counter_restarting_per_tile_is_caught():
    fd, f, mapping = _tiled_exp(stages=2)
    k = lower_upto(f)
    tile_c, k_c = _loops(k, K.WS_COMPUTE_LOOP)
    # The compute role counts k steps only (as a per-tile pipeline would): out of step with the
    # producer after the first tile.
    c = f"(({tile_c.var.name} * pf_ws_trips_j2) + {k_c.var.name})"

    class PerTile(Rewriter):
        def default_expr(self, e):
            if repr(e) == c:
                return k_c.var
            return super().default_expr(e)
    k_c.body[:] = PerTile().rewrite(k_c.body)
    with pytest.raises(InterpreterError, match="deadlock|before a wait|overwrites"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


# Ping-pong ---------------------------------------------------------------------------------------
def _roles(k):
    (split,) = [s for s in k.body if isinstance(s, K.RoleSplit)]
    return split.roles


def test_pingpong_structure():
    fd, f, mapping = _tiled_exp(stages=3, roles=2)
    k = lower_upto(f)
    producer, c0, c1 = _roles(k)
    assert [r.role.name for r in (producer, c0, c1)] == ["producer", "compute 0", "compute 1"]
    # 2 x 4 compute rows of 64 threads, then the producer's 2 rows (one warp group).
    assert (c0.role.barrier, c1.role.barrier) == ((1, 256), (2, 256))
    assert [int(b) if isinstance(b, int) else b.value for b in k.launch.block] == [64, 10, 1]
    for r, rb in enumerate((c0, c1)):
        outer = next(x for x in K.walk(rb.body) if isinstance(x, K.ForLoop)
                     and x.label == K.WS_COMPUTE_LOOP)
        assert (outer.start.value, outer.step.value) == (r, 2)      # alternate tiles
        syncs = [x for x in K.walk(outer.body) if isinstance(x, K.BlockSync)]
        arrives = [x for x in K.walk(outer.body) if isinstance(x, K.NamedBarrierArrive)]
        assert [(x.barrier_id, x.count.value) for x in syncs] == [(3 + r, 512)]
        assert [(x.barrier_id, x.count.value) for x in arrives] == [(3 + 1 - r, 512)]
    # Role 1's rows start at threadIdx.y 4: it indexes from there.
    assert "(threadIdx.y - 4)" in kernel_str(k) and "(threadIdx.y - 4)" not in repr(c0.body)


@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("M", [1, 12, 25, 61, 200])
def test_pingpong_tiles_on_the_interpreter(stages, M):
    _run_tiled(*_tiled_exp(stages=stages, roles=2), M)


def _turn_barriers(k):
    return [x for x in K.walk(k.body) if isinstance(x, (K.BlockSync, K.NamedBarrierArrive))
            and (x.barrier_id or 0) >= 3]


def test_a_wrong_role_order_deadlocks():
    fd, f, mapping = _tiled_exp(stages=3, roles=2)
    k = lower_upto(f)
    for x in _turn_barriers(k):
        if isinstance(x, K.NamedBarrierArrive):
            x.barrier_id = 7 - x.barrier_id       # each role hands the turn to itself
    with pytest.raises(InterpreterError, match="deadlock"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


def test_a_missing_hand_over_deadlocks():
    fd, f, mapping = _tiled_exp(stages=3, roles=2)
    k = lower_upto(f)
    _, c0, _ = _roles(k)
    outer = next(x for x in K.walk(c0.body) if isinstance(x, K.ForLoop))
    outer.body[:] = [s for s in outer.body if not any(
        isinstance(x, K.NamedBarrierArrive) for x in K.walk([s]))]
    with pytest.raises(InterpreterError, match="deadlock"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("M,N", [(1, 64), (37, 64), (100, 128)])
@pytest.mark.parametrize("stages,grid", [(2, 1), (3, 2)])
def test_pingpong_norm_kernels_match_the_reference(name, M, N, stages, grid):
    with options.override(enable=["ws_pingpong"]):
        fd, inputs, st, p, k = lowered_inner_persistent(name, M, N, "fp32", "ws_inner_persistent",
                                                        stages=stages, grid=grid, bdimy=8)
    assert p.compute_roles == 2 and len(_roles(k)) == 3
    outs, it = interpret(k, st.bindings, inputs)
    for o, r in zip(outs, reference(fd, inputs)):
        torch.testing.assert_close(o.double(), r.double(), **TOL)


def test_pingpong_norm_section_and_release():
    with options.override(enable=["ws_pingpong"]):
        fd, inputs, st, p, k = lowered_inner_persistent("rmsnorm_fwd", 100, 64, "fp32",
                                                        "ws_inner_persistent", stages=3, grid=1,
                                                        bdimy=8)
    _, c0, _ = _roles(k)
    order = [type(x).__name__ for x in K.walk(c0.body)
             if isinstance(x, (K.MBarrierWait, K.MBarrierArrive, K.BlockReduce,
                               K.NamedBarrierArrive, K.BlockSync))
             or (isinstance(x, K.TensorOp) and x.out.buffer.memory == "global")]
    # turn wait, full wait, slot released once read into registers, the row's reduction, turn
    # handed on, then the normalized row's stores (overlapping the other role's section).
    assert order[:6] == ["BlockSync", "MBarrierWait", "MBarrierArrive", "BlockReduce",
                         "NamedBarrierArrive", "TensorOp"], order


# Mistakes the interpreter catches ----------------------------------------------------------------
def test_a_broken_full_parity_is_caught():
    fd, f, mapping = _tiled_exp(stages=2)
    k = lower_upto(f)
    _, k_c = _loops(k, K.WS_COMPUTE_LOOP)
    wait = next(x for x in k_c.body if isinstance(x, K.MBarrierWait))
    wait.parity = K.sub(K.Const(1), wait.parity)
    with pytest.raises(InterpreterError, match="deadlock|before a wait"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


def test_a_missing_release_is_caught():
    fd, f, mapping = _tiled_exp(stages=2)
    k = lower_upto(f)
    _, k_c = _loops(k, K.WS_COMPUTE_LOOP)
    k_c.body[:] = [s for s in k_c.body if not isinstance(s, K.MBarrierArrive)]
    with pytest.raises(InterpreterError, match="deadlock"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


def test_a_producer_that_skips_its_wait_for_a_free_slot_is_caught():
    """Without the wait on empty[s], a copy overwrites a slot the compute role has not read
    (or not released): the interpreter's slot check or its deadlock check fires."""
    fd, f, mapping = _tiled_exp(stages=2)
    k = lower_upto(f)
    _, k_p = _loops(k, K.WS_PRODUCER_LOOP)
    k_p.body[:] = [s for s in k_p.body if not any(isinstance(x, K.MBarrierWait)
                                                   for x in K.walk([s]))]
    with pytest.raises(InterpreterError, match="overwrites|deadlock|before a wait"):
        _run_tiled(fd, f, mapping, 61, kernel=k)


def test_a_pipelined_loop_without_its_end_barrier_is_a_war_race():
    # The one-role TMA pipeline: thread 0 refills slot k % S at iteration k + 1; without the
    # block barrier ending iteration k, other threads may still be reading it.
    fd, inputs, st, p, k = lowered_inner_persistent("softmax", 100, 64, "fp32",
                                                    "tma_inner_persistent", stages=2, grid=1)
    (main,) = _loops(k, MAIN_LOOP)
    assert isinstance(main.body[-1], K.BlockSync)
    main.body.pop()
    with pytest.raises(InterpreterError, match="overwrites data the block read with no barrier"):
        interpret(k, st.bindings, inputs)


# Verifier and NVRTC ------------------------------------------------------------------------------
def test_verifier_wants_setmaxnreg_first_in_each_role():
    fd, f, mapping = _tiled_exp(stages=3, roles=2)
    k = lower_upto(f)
    _, _, c1 = _roles(k)
    c1.body.pop(0)
    with pytest.raises(KernelIRError, match="the compute 1 role does not start with setmaxnreg"):
        verify(k)


def test_verifier_refuses_role_statements_outside_a_split():
    fd, f, mapping = _tiled_exp(stages=3)
    k = lower_upto(f)
    _, c = _roles(k)
    k.body.append(c)
    with pytest.raises(KernelIRError, match="outside a role split"):
        verify(k)


def test_verifier_refuses_roles_reducing_in_one_workspace():
    with options.override(enable=["ws_pingpong"]):
        fd, inputs, st, p, k = lowered_inner_persistent("rmsnorm_fwd", 100, 64, "fp32",
                                                        "ws_inner_persistent", stages=3, grid=1,
                                                        bdimy=8)
    reduces = [x for x in K.walk(k.body) if isinstance(x, K.BlockReduce)]
    assert sorted(x.role for x in reduces) == [0, 1]
    assert len({x.workspace_offset for x in reduces}) == 2
    assert k.reduction_workspace == 2 * max(x.workspace_offset for x in reduces)
    for x in reduces:
        x.workspace_offset = 0
    with pytest.raises(KernelIRError, match="reduce in the same block-reduction workspace"):
        verify(k)


@pytest.mark.parametrize("roles", [1, 2])
def test_tiled_kernels_compile(roles):
    fd, f, mapping = _tiled_exp(stages=3, roles=roles)
    src = generate_cuda(lower_upto(f))
    assert ("pf::named_barrier_arrive(" in src) == (roles == 2)
    # Each compute role steps over every other tile (the loop's step printed, not ++).
    assert src.count(" += 2) {") == (2 if roles == 2 else 0)
    compile_clean(src)


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_pingpong_norm_kernels_compile(name, dtype):
    with options.override(enable=["ws_pingpong"]):
        fd, inputs, st, p, k = lowered_inner_persistent(name, 4096, 4096, dtype,
                                                        "ws_inner_persistent")
    assert p.compute_roles == 2
    src = generate_cuda(k)
    assert src.count("pf::named_barrier_arrive(") == 2 and "pf::setmaxnreg_inc<" in src
    assert src.count(" += 2) {") == 2                 # each role steps over the other's groups
    assert "(pf_red_ws_float + " in src or "(pf_red_ws_" in src     # role 1's own workspace
    compile_clean(src)


def test_pingpong_refused_where_three_rows_of_threads_exceed_the_block():
    from kir_testing import empty_inputs, setup
    from pyfuser import catalogue
    from pyfuser.schedule.schedulers import inner_persistent as ip
    fd = catalogue.define("rmsnorm_fwd", "bf16")
    with options.override(enable=["ws_inner_persistent", "ws_pingpong"]):
        st = setup(fd, empty_inputs("rmsnorm_fwd", 2000, 16384))
        p = ip.compute_heuristics(st.fusion, st.info)
        assert not p.warp_specialized and p.stages == 0
        assert "ping-pong takes rows of at most 341 threads" in p.reason
        st = setup(fd, empty_inputs("rmsnorm_fwd", 2000, 4096))
        assert ip.compute_heuristics(st.fusion, st.info).compute_roles == 2
