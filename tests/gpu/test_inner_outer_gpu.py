"""Norm backward (inner-outer persistent, multi-wave) against float64."""
import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser import catalogue
from pyfuser.testing import run_and_check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("shape", [(1, 1000), (3, 1000), (1000, 1000), (1000, 5120), (4096, 1024),
                                   (16384, 4096), (2048, 16384)])
def test_backward_bf16(name, shape):
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_outer_persistent")


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_backward_other_dtypes(name, dtype):
    fd = catalogue.define(name, dtype)
    run_and_check(fd, catalogue.make_inputs(name, 333, 2048, dtype, device="cuda"),
                  scheduler="inner_outer_persistent")


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("shape", [(4096, 65536), (2048, 131072), (3, 65536)])
def test_backward_long_rows_split_over_a_cluster(name, shape):
    # Rows too long for one block: each row split over a thread-block cluster along
    # blockIdx.y (row reductions through distributed shared memory), in the cooperative grid.
    fd = catalogue.define(name)
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_outer_persistent")
    run = fd.last_run
    (params,) = run.heuristics
    assert params.cluster > 1, params
    assert run.clusters == ((1, params.cluster, 1),), run


def test_backward_repeated_launches_reuse_workspace_and_counter():
    # The grid-sync counter and the workspace are reused launch after launch.
    fd = catalogue.define("rmsnorm_bwd")
    for _ in range(3):
        run_and_check(fd, catalogue.make_inputs("rmsnorm_bwd", 2048, 4096, device="cuda"),
                      scheduler="inner_outer_persistent")


def _item6_fusion(dtype=DataType.Float, sizes=(-1, -1)):
    """Issue 6, item 6: T0 [1, M, N] allocated (i1, b0, i2); T4 = T0 + broadcast(sum(T0, -1));
    T6 = sum(squeeze(T4), 0). `sizes` (M, N) fixed at definition or -1."""
    with FusionDefinition("item6") as fd:
        t0 = fd.define_tensor([1, *sizes], contiguity=[True, None, True], dtype=dtype,
                              stride_order=[1, 2, 0])
        t1 = fd.ops.squeeze(t0, [0])
        t2 = fd.ops.sum(t1, [1])
        t3 = fd.ops.broadcast_in_dim(t2, [1, -1, 1], [1])
        t4 = fd.ops.add(t0, t3)
        fd.add_output(t4)
        t5 = fd.ops.squeeze(t4, [0])
        fd.add_output(fd.ops.sum(t5, [0]))
    return fd


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("M,N,static", [(4096, 4096, False), (4096, 4096, True),
                                        (1000, 1027, False), (4097, 4095, False)])
@pytest.mark.parametrize("layout", ["permuted", "contiguous"])
def test_issue_item6_fusion_with_permuted_broadcast_input(dtype, M, N, static, layout):
    import warnings

    from pyfuser.runtime.executor import FallbackWarning
    from pyfuser.runtime.inputs import check_inputs
    from pyfuser.runtime.reference import evaluate
    from pyfuser.testing import TOLERANCE, rel_error

    fd = _item6_fusion(dtype, (M, N) if static else (-1, -1))
    torch.manual_seed(M + N)
    tdt = {DataType.Float: torch.float32, DataType.BFloat16: torch.bfloat16}[dtype]
    if layout == "permuted":
        # allocation (i1, b0, i2): the size-1 dim lies between the others in memory
        x = torch.randn(M, 1, N, device="cuda").to(tdt).permute(1, 0, 2)
    else:
        x = torch.randn(1, M, N, device="cuda").to(tdt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        if dtype == DataType.Float:
            t4, t6 = run_and_check(fd, [x], scheduler="inner_outer_persistent")
        else:
            t4, t6 = fd.execute([x], options={"enable": ["poison_outputs"]})
    run = fd.last_run
    assert (run.kind, run.schedulers, run.num_kernels) == ("kernels", ("inner_outer_persistent",),
                                                           1), run
    tol = TOLERANCE[dtype]
    xd = x.double()
    r4 = xd + xd.sum(2, keepdim=True)
    assert rel_error(t4, r4) <= tol
    # T6 against the float64 column sums of the T4 the kernel wrote: T6's own error only.
    assert rel_error(t6, t4.double().squeeze(0).sum(0)) <= tol
    if dtype == DataType.Float:
        assert rel_error(t6, r4.squeeze(0).sum(0)) <= tol
    else:
        # bf16 rounds T2 and T4 before T6 sums them: compare with the evaluator at the
        # fusion's own precision (float64 of x alone can differ by more than 1e-2 when the
        # row sums nearly cancel over the column).
        (_, ref6) = evaluate(fd.fusion, [x], extent_bindings=check_inputs(fd.fusion, [x]))
        assert rel_error(t6, ref6) <= tol


VARIANT_SHAPES = [(1, 1024), (3, 2048), (1000, 4096), (4096, 1024), (2048, 8192), (333, 2048),
                  (16384, 4096)]


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("shape", VARIANT_SHAPES)
@pytest.mark.parametrize("variant", ["warp-specialized", "multi-wave"])
def test_forced_variant(name, shape, variant):
    """Both variants forced (PYFUSER_ENABLE / DISABLE=ws_normalization per call): right against
    float64, one cooperative kernel, the variant asked for, and for multi-wave on these rows
    (row bytes a multiple of 16, N <= 8192) the TMA circular buffer."""
    fd = catalogue.define(name)
    key = "enable" if variant == "warp-specialized" else "disable"
    run_and_check(fd, catalogue.make_inputs(name, *shape, device="cuda"),
                  scheduler="inner_outer_persistent", options={key: ["ws_normalization"]})
    (p,) = fd.last_run.heuristics
    assert p.variant == variant, p.reason
    assert p.stages >= 2 and p.tma_inputs == (0, 1), p.reason
    if variant == "warp-specialized":
        assert p.compute_rows * p.bdimx in (256, 384)


def _strided_rows(name):
    """Catalogue fusion `name` with its [M, N] inputs defined with strided rows (contiguity
    False on the row dim): slices of wider tensors are accepted."""
    with FusionDefinition(f"{name}_strided") as fd:
        define = fd.define_tensor

        def strided(shape, contiguity=None, dtype=DataType.Float, **kw):
            if len(shape) == 2 and shape[1] == -1:
                contiguity = [False, True]
            return define(shape, contiguity=contiguity, dtype=dtype, **kw)
        fd.define_tensor = strided
        catalogue.get(name).build(fd, DataType.BFloat16, 1e-6)
    return fd


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "layernorm_bwd"])
@pytest.mark.parametrize("variant", ["warp-specialized", "multi-wave"])
def test_forced_variant_noncontiguous_rows(name, variant):
    """x and dy as row slices of wider tensors (row stride 2N + 8 elements, a multiple of 16
    bytes): bulk copies take them; right against float64 in both variants."""
    M, N = 777, 2048
    ins = catalogue.make_inputs(name, M, N, device="cuda")
    wide = [torch.randn(M, 2 * N + 8, device="cuda").to(ins[0].dtype)[:, 8:N + 8]
            for _ in range(2)]
    wide[0].copy_(ins[0]), wide[1].copy_(ins[1])
    assert not wide[0].is_contiguous()
    key = "enable" if variant == "warp-specialized" else "disable"
    fd = _strided_rows(name)
    run_and_check(fd, [wide[0], wide[1], *ins[2:]], scheduler="inner_outer_persistent",
                  options={key: ["ws_normalization"]})
    (p,) = fd.last_run.heuristics
    assert p.variant == variant and p.stages >= 2, p.reason


def test_forced_warp_specialized_on_rows_it_cannot_take_runs_multi_wave_and_says_why():
    name = "rmsnorm_bwd"
    fd = catalogue.define(name)
    # 1004 bf16 = 2008 bytes per row: not a multiple of 16, no bulk copy.
    run_and_check(fd, catalogue.make_inputs(name, 515, 1004, device="cuda"),
                  scheduler="inner_outer_persistent", options={"enable": ["ws_normalization"]})
    (p,) = fd.last_run.heuristics
    assert p.variant == "multi-wave" and p.stages == 0
    assert "warp-specialized forced on but not possible" in p.reason
