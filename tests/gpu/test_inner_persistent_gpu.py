"""Normalization forward and softmax kernels (inner persistent) against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORWARD = ["softmax", "log_softmax", "rmsnorm_fwd", "add_rmsnorm_fwd", "layernorm_fwd"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("shape", [(1, 8), (7, 1000), (3, 1023), (1000, 5120), (4096, 1024),
                                   (33, 12288), (64, 65536)])
def test_forward_bf16(name, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_persistent")


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_forward_other_dtypes(name, dtype):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, 257, 4096, dtype, device="cuda"),
                  scheduler="inner_persistent")


def _softmax_of_strided_rows():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[False, True], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
        fd.add_output(fd.ops.cast(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)),
                                  DataType.BFloat16))
    return fd


def test_noncontiguous_rows():
    fd = _softmax_of_strided_rows()
    x = torch.randn(300, 3000, device="cuda", dtype=torch.bfloat16)[:, 100:2148]
    run_and_check(fd, [x], scheduler="inner_persistent")


def test_row_size_that_forbids_vectors():
    fd = catalogue.define("rmsnorm_fwd")
    ins = catalogue.make_inputs("rmsnorm_fwd", 100, 4099, device="cuda")
    run_and_check(fd, ins, scheduler="inner_persistent")
    assert fd.last_run.heuristics[0].vector == 1


def test_rows_too_long_for_registers_and_clusters_are_looped():
    """131080 elements: too long for one block, and not divisible into a cluster's whole
    vectors. The register rows are refused and the looped variant reads the row once per pass:
    one kernel, right values, no FallbackWarning (before it, a plan without this scheduler)."""
    import warnings
    from pyfuser.runtime.executor import FallbackWarning
    fd = catalogue.define("rmsnorm_fwd")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        run_and_check(fd, catalogue.make_inputs("rmsnorm_fwd", 2, 131080, device="cuda"),
                      scheduler="inner_persistent")
    (p,) = fd.last_run.heuristics
    assert p.looped and "shared memory or a cluster" in p.reason, p


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("shape", [(64, 65536), (3, 131072), (5, 262144), (33, 40960),
                                   (1, 65536)])
def test_long_rows_split_over_a_cluster(name, shape):
    fd = catalogue.define(name)
    inputs = catalogue.make_inputs(name, *shape, device="cuda")
    want = 1
    while shape[1] * 2 > want * 32 * 1024 and want < 8:
        want *= 2
    if name in ("softmax", "log_softmax"):
        # Read twice in all once the max and sum of exp are one pass: the looped variant is
        # chosen over the cluster (measured faster, session 20); the cluster stays forced.
        run_and_check(fd, inputs, scheduler="inner_persistent")
        assert fd.last_run.heuristics[0].looped == (want > 1), fd.last_run.heuristics[0]
        run_and_check(fd, inputs, scheduler="inner_persistent",
                      options={"disable": ["looped_inner_persistent"]})
    else:
        run_and_check(fd, inputs, scheduler="inner_persistent")
    p = fd.last_run.heuristics[0]
    assert p.cluster == want, p


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_long_rows_cluster_other_dtypes(dtype):
    fd = catalogue.define("layernorm_fwd", dtype)
    run_and_check(fd, catalogue.make_inputs("layernorm_fwd", 17, 65536, dtype, device="cuda"),
                  scheduler="inner_persistent")
    assert fd.last_run.heuristics[0].cluster > 1


# TMA circular-buffered variant (forced: the heuristic keeps register rows by default) -------
TMA = {"enable": ["tma_inner_persistent"]}


# "cp.async" is TMA forced on rows the bulk copy refuses: per-thread cp.async copies instead.
FORCED = {"tma": TMA, "ws": {"enable": ["ws_inner_persistent"]}, "cp.async": TMA,
          "tma_tmap": {"enable": ["tma_inner_persistent", "tma_tensor_map"]},
          "ws_tmap": {"enable": ["ws_inner_persistent", "tma_tensor_map"]},
          "ws_pp": {"enable": ["ws_inner_persistent", "ws_pingpong"]},
          "ws_pp_tmap": {"enable": ["ws_inner_persistent", "ws_pingpong", "tma_tensor_map"]}}


def _ran(fd, variant) -> bool:
    """The forced variant ran (stages in use; warp-specialized or not, with one or two compute
    roles, and bulk, tensor-map or cp.async copies, as asked)."""
    p = fd.last_run.heuristics[0]
    return (p.stages >= 2 and p.warp_specialized == variant.startswith("ws")
            and p.compute_roles == (2 if variant.startswith("ws_pp") else 1)
            and bool(p.cp_async_inputs) == (variant == "cp.async")
            and bool(p.tma_inputs) == (variant != "cp.async")
            and p.tensor_map == variant.endswith("_tmap"))


FORWARD_SHAPES = [(1, 8), (7, 1000), (1000, 5120), (4096, 1024), (333, 4096), (2000, 16384)]


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("variant,shape", [(v, s) for v in ("tma", "tma_tmap")
                                           for s in FORWARD_SHAPES]
                         + [(v, s) for v in ("ws", "ws_tmap")
                            for s in FORWARD_SHAPES + [(2000, 12288)]]
                         # (rows of 12288 and 16384 bf16 take 384 threads: three such rows of
                         # threads, two compute roles and the producer, exceed 1024)
                         + [(v, s) for v in ("ws_pp", "ws_pp_tmap") for s in FORWARD_SHAPES[:5]])
def test_forward_forced_tma_variant_bf16(name, variant, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_persistent", options=FORCED[variant])
    assert _ran(fd, variant), fd.last_run.heuristics[0].reason


@pytest.mark.parametrize("name", ["rmsnorm_fwd", "layernorm_fwd", "softmax"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("variant", ["tma", "ws", "tma_tmap", "ws_tmap", "ws_pp"])
def test_forward_forced_tma_variant_other_dtypes(name, dtype, variant):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, 777, 2048, dtype, device="cuda"),
                  scheduler="inner_persistent", options=FORCED[variant])
    assert _ran(fd, variant)


@pytest.mark.parametrize("grid,stages,prefetch", [(1, 2, 1), (3, 4, 1), (5, 3, 2), (132, 4, 3)])
def test_tma_persistent_grids_and_stages(grid, stages, prefetch):
    """Few blocks striding over many row groups: every stage wraps around many times."""
    import dataclasses
    fd = catalogue.define("layernorm_fwd")
    ins = catalogue.make_inputs("layernorm_fwd", 1001, 2048, device="cuda")
    fd.execute(ins, options=TMA)
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=grid, stages=stages,
                            prefetch=prefetch)
    run_and_check(fd, ins, scheduler="inner_persistent", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p


@pytest.mark.parametrize("grid", [1, 3])
@pytest.mark.parametrize("name", ["rmsnorm_fwd", "softmax"])
def test_pingpong_roles_alternate_over_few_blocks(grid, name):
    """Two compute roles taking a block's row groups in turn, over many groups per block: the
    ordered hand-over and every slot's reuse many times."""
    import dataclasses
    fd = catalogue.define(name)
    ins = catalogue.make_inputs(name, 1001, 2048, device="cuda")
    fd.execute(ins, options=FORCED["ws_pp"])
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=grid)
    assert p.compute_roles == 2, p.reason
    run_and_check(fd, ins, scheduler="inner_persistent", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p


@pytest.mark.parametrize("variant", ["tma", "ws", "tma_tmap", "ws_tmap"])
def test_forced_tma_variant_noncontiguous_rows(variant):
    """Rows of a wider tensor (stride 3008 elements: 16-byte multiple) are copied by TMA; with
    stride 3004 (6008 bytes) they cannot be: cp.async copies them (pipelined), or register rows
    run (warp-specialized)."""
    fd = _softmax_of_strided_rows()
    x = torch.randn(300, 3008, device="cuda", dtype=torch.bfloat16)[:, 64:2112]
    run_and_check(fd, [x], scheduler="inner_persistent", options=FORCED[variant])
    assert _ran(fd, variant), fd.last_run.heuristics[0].reason
    x = torch.randn(300, 3004, device="cuda", dtype=torch.bfloat16)[:, 64:2112]
    run_and_check(fd, [x], scheduler="inner_persistent", options=FORCED[variant])
    p = fd.last_run.heuristics[0]
    assert "stride 3004" in p.reason
    if variant.startswith("tma"):    # cp.async copies them instead (8 bytes: the stride is 4-aligned)
        assert _ran(fd, "cp.async") and p.cp_async_bytes == (8,), p.reason
    else:
        assert p.stages == 0


def test_tma_rules_that_fail_keep_register_rows():
    """Rows of 1001 bf16 (2002 bytes) can be copied neither by a bulk copy nor by cp.async
    (2-byte pieces): the forced TMA variant falls back to register rows and says why. Rows
    8-byte aligned cannot be bulk-copied, and cp.async copies them in 8-byte pieces."""
    fd = catalogue.define("rmsnorm_fwd")
    run_and_check(fd, catalogue.make_inputs("rmsnorm_fwd", 50, 1001, device="cuda"),
                  scheduler="inner_persistent", options=TMA)
    assert fd.last_run.heuristics[0].stages == 0 and "2002 bytes" in fd.last_run.heuristics[0].reason
    x, w = catalogue.make_inputs("rmsnorm_fwd", 64, 2052, device="cuda")
    shifted = x.reshape(-1)[4:4 + 64 * 2048].view(64, 2048)
    run_and_check(fd, [shifted, w[:2048]], scheduler="inner_persistent", options=TMA)
    p = fd.last_run.heuristics[0]
    assert _ran(fd, "cp.async") and p.cp_async_bytes == (8,) and "aligned" in p.reason


def test_forced_tma_kernel_refuses_misaligned_input():
    """A forced TMA heuristic applied to rows it cannot copy is refused before launch."""
    fd = catalogue.define("rmsnorm_fwd")
    x, w = catalogue.make_inputs("rmsnorm_fwd", 64, 2056, device="cuda")
    fd.execute([x[:, :2048].contiguous(), w[:2048]], options=TMA)
    p = fd.last_run.heuristics[0]
    assert p.stages >= 2
    # The shared-memory slot, not global memory, is read with vectors: the bulk-copy rule is
    # the one that refuses.
    bad = x.reshape(-1)[4:4 + 64 * 2048].view(64, 2048)
    with pytest.raises(ValueError, match="cannot be copied row by row with TMA"):
        fd.execute([bad, w[:2048]], options={"heuristic": p})


@pytest.mark.parametrize("variant", ["tma_tmap", "ws_tmap"])
@pytest.mark.parametrize("grid,stages", [(1, 2), (7, 4), (132, 3)])
def test_tensor_map_grids_and_stages(variant, grid, stages):
    """Boxes of whole rows over 1001 rows: the last box runs past the tensor (zero-filled,
    still counted in the expected bytes), and few blocks refill every slot many times."""
    import dataclasses
    fd = catalogue.define("layernorm_fwd")
    ins = catalogue.make_inputs("layernorm_fwd", 1001, 2048, device="cuda")
    fd.execute(ins, options=FORCED[variant])
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=grid, stages=stages,
                            prefetch=stages - 1)
    assert p.tensor_map, p.reason
    run_and_check(fd, ins, scheduler="inner_persistent", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p


def test_forced_tensor_map_kernel_refuses_misaligned_input():
    fd = catalogue.define("rmsnorm_fwd")
    x, w = catalogue.make_inputs("rmsnorm_fwd", 64, 2056, device="cuda")
    fd.execute([x[:, :2048].contiguous(), w[:2048]], options=FORCED["tma_tmap"])
    p = fd.last_run.heuristics[0]
    assert p.stages >= 2 and p.tensor_map
    bad = x.reshape(-1)[4:4 + 64 * 2048].view(64, 2048)
    with pytest.raises(ValueError, match="tensor-map boxes of whole rows"):
        fd.execute([bad, w[:2048]], options={"heuristic": p})


# Warp-specialized TMA variant (forced) ----------------------------------------------------
WS = FORCED["ws"]


@pytest.mark.parametrize("grid,stages", [(1, 2), (3, 3), (7, 8), (132, 4)])
def test_ws_persistent_grids_and_stages(grid, stages):
    """Few blocks striding over many row groups: every slot is released and refilled many
    times, so a wrong empty/full parity hangs or reads stale rows."""
    import dataclasses
    fd = catalogue.define("layernorm_fwd")
    ins = catalogue.make_inputs("layernorm_fwd", 1001, 2048, device="cuda")
    fd.execute(ins, options=WS)
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=grid, stages=stages,
                            prefetch=stages - 1)
    run_and_check(fd, ins, scheduler="inner_persistent", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p and p.warp_specialized


# cp.async variant (TMA forced on rows a bulk copy refuses) --------------------------------
CP_ASYNC = FORCED["cp.async"]
# Row bytes not a multiple of 16: 4- or 8-byte copies; odd row counts; one row; long rows.
CP_ASYNC_SHAPES = [(1, 6), (7, 1002), (1000, 1004), (4097, 1012), (333, 4100), (2000, 16388)]


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("shape", CP_ASYNC_SHAPES)
def test_forward_forced_cp_async_variant_bf16(name, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_persistent", options=CP_ASYNC)
    assert _ran(fd, "cp.async"), fd.last_run.heuristics[0].reason


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("dtype,shape", [("fp32", (777, 1001)), ("fp32", (5, 2047)),
                                         ("fp16", (777, 2046))])
def test_forward_forced_cp_async_variant_other_dtypes(name, dtype, shape):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, *shape, dtype, device="cuda"),
                  scheduler="inner_persistent", options=CP_ASYNC)
    assert _ran(fd, "cp.async"), fd.last_run.heuristics[0].reason


@pytest.mark.parametrize("stride,offset,nbytes", [(3004, 64, 8), (3002, 64, 4), (3008, 4, 8),
                                                  (3010, 2, 4)])
def test_cp_async_noncontiguous_and_misaligned_rows(stride, offset, nbytes):
    """Rows of 2048 bf16 inside wider rows (stride not a multiple of 8 elements) or starting
    8 / 4 bytes past a 16-byte boundary: the copy width follows the strides and the pointer."""
    fd = _softmax_of_strided_rows()
    x = torch.randn(301, stride, device="cuda", dtype=torch.bfloat16)[:, offset:offset + 2048]
    run_and_check(fd, [x], scheduler="inner_persistent", options=CP_ASYNC)
    p = fd.last_run.heuristics[0]
    assert _ran(fd, "cp.async") and p.cp_async_bytes == (nbytes,), p.reason


@pytest.mark.parametrize("grid,stages,prefetch", [(1, 2, 1), (3, 4, 1), (5, 3, 2), (132, 4, 3)])
def test_cp_async_persistent_grids_and_stages(grid, stages, prefetch):
    """Few blocks striding over many row groups: every stage wraps around many times, so a
    wrong group count reads a slot before (or after) its copies land."""
    import dataclasses
    fd = catalogue.define("layernorm_fwd")
    ins = catalogue.make_inputs("layernorm_fwd", 1001, 2044, device="cuda")
    fd.execute(ins, options=CP_ASYNC)
    assert _ran(fd, "cp.async"), fd.last_run.heuristics[0].reason
    p = dataclasses.replace(fd.last_run.heuristics[0], grid=grid, stages=stages,
                            prefetch=prefetch)
    run_and_check(fd, ins, scheduler="inner_persistent", options={"heuristic": p})
    assert fd.last_run.heuristics[0] == p


def test_forced_cp_async_kernel_refuses_misaligned_input():
    """A cp.async heuristic of 8-byte copies applied to rows only 4-byte aligned is refused
    before launch (the vector-width check covers the copy's source)."""
    fd = catalogue.define("rmsnorm_fwd")
    x, w = catalogue.make_inputs("rmsnorm_fwd", 64, 1004, device="cuda")
    fd.execute([x, w], options=CP_ASYNC)
    p = fd.last_run.heuristics[0]
    assert _ran(fd, "cp.async") and p.cp_async_bytes == (8,)
    bad = torch.randn(64 * 1004 + 2, device="cuda", dtype=x.dtype)[2:].view(64, 1004)
    with pytest.raises(ValueError, match="cannot be read with 4-wide vectors"):
        fd.execute([bad, w], options={"heuristic": p})
