"""Generated CUDA for the pointwise and reduction schedulers' kernels: what the text says, and that
NVRTC compiles it for sm_90a with no spills, no stack and no ptxas diagnostics, over shapes
(1, 7, 1023, 4097, 16384x8192), dtypes (bf16, fp16, fp32) and layouts (broadcast, sliced,
transposed, misaligned). Heuristics read the H100 table; kernels are lowered with the verifier on.
"""
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from kir_testing import empty_inputs, schedule_and_lower  # noqa: E402

from pyfuser import DataType, FusionDefinition, catalogue  # noqa: E402
from pyfuser.codegen.cuda import generate_cuda  # noqa: E402
from pyfuser.kir import nodes as K  # noqa: E402
from pyfuser.schedule.schedulers import registry  # noqa: E402
from pyfuser.schedule.schedulers.base import SchedulerError, access_width  # noqa: E402

pytest.importorskip("cuda.bindings.nvrtc")
from pyfuser.runtime.nvrtc import compile_to_cubin  # noqa: E402

DTYPES = ["bf16", "fp16", "fp32"]
SHAPES = [(1, 1), (7, 7), (1023, 1023), (4097, 7), (7, 4097)]
KERNEL_FUSIONS = ["gelu_bias", "silu_mul", "row_sum", "col_sum"]
# Every catalogue fusion some scheduler takes (the normalizations once their schedulers exist).
SCHEDULED = [n for n in catalogue.names()
             if registry.choose(catalogue.define(n).fusion).scheduler is not None]
_COMPILED: dict = {}


def compile_checked(source: str, name: str):
    """Compile once per distinct source; assert the ptxas report is clean."""
    mod = _COMPILED.get(source)
    if mod is None:
        mod = _COMPILED[source] = compile_to_cubin(source, name, arch="sm_90a")
    rep = mod.ptxas
    assert rep.function == mod.entry_name
    assert (rep.spill_store_bytes, rep.spill_load_bytes) == (0, 0), rep.summary()
    assert rep.stack_frame_bytes == 0, rep.summary()
    assert rep.warnings == (), rep.warnings
    assert 0 < rep.registers <= 255
    return mod


def build(fd, inputs, name="k", **kw):
    st, sch, params, kernel = schedule_and_lower(fd, inputs, name=name, **kw)
    return st, sch, params, kernel, generate_cuda(kernel)


def _kernel_text(src):
    return src[src.index("typedef"):]


def _check_source(kernel, params, src):
    text = _kernel_text(src)
    assert "#include" not in src                       # NVRTC gets no include path
    lc = kernel.launch
    block = [getattr(b, "value", b) for b in lc.block]
    if None not in block:
        # A static block: __launch_bounds__ is its thread count (and the min blocks asked for).
        assert lc.max_threads == block[0] * block[1] * block[2]
        bounds = f"{lc.max_threads}" + (f", {lc.min_blocks}" if lc.min_blocks else "")
        assert f'extern "C" __global__ void __launch_bounds__({bounds}) k(' in text
    elif lc.max_threads is None:
        assert 'extern "C" __global__ void k(' in text
    vec_loads = re.findall(r"pf::load_global_vec<[^>]*>\(\*reinterpret_cast<pf::Array<[^,]+, (\d+)>",
                           text)
    # Each vector input at its own access width (an fp32 scale beside bf16 data: 4 of 8);
    # the transpose scheduler's tiled inputs too when it loads them with vectors.
    read = list(params.vector_inputs) + list(
        getattr(params, "tiled_inputs", ()) if getattr(params, "vector_loads", False) else ())
    if params.vector > 1 and read:
        widths = {str(access_width(kernel.fusion.inputs[k].dtype, params.vector)) for k in read}
        assert vec_loads and set(vec_loads) == widths
    else:
        assert not vec_loads
    for p in kernel.params:
        if p.kind == "ptr" and p.source[0] == "input":
            assert re.search(rf"const [\w:]+\* __restrict__ {p.name}\b", text)
    return text


def test_plain_kernels_are_scheduled():
    assert set(KERNEL_FUSIONS) <= set(SCHEDULED)


NORMS = [n for n in SCHEDULED if n not in KERNEL_FUSIONS]
# Persistent kernels are specialized on the row length and take longer to compile: the default
# run checks two shapes of each, the slow run all of them.
CASES = ([pytest.param(n, d, SHAPES, id=f"{n}-{d}") for n in KERNEL_FUSIONS for d in DTYPES] +
         [pytest.param(n, d, [(7, 1023), (1023, 4097)], id=f"{n}-{d}") for n in NORMS
          for d in DTYPES] +
         [pytest.param(n, d, SHAPES, id=f"{n}-{d}-all", marks=pytest.mark.slow) for n in NORMS
          for d in ("bf16", "fp32")])


@pytest.mark.parametrize("name,dtype,shapes", CASES)
def test_catalogue_kernels_compile_clean(name, dtype, shapes):
    seen = set()
    for M, N in shapes:
        fd = catalogue.define(name, dtype)
        try:
            st, sch, params, kernel, src = build(fd, empty_inputs(name, M, N, dtype))
        except SchedulerError as e:
            # Columns whose block would read under a sector of each row: a plan of kernels
            # instead (tests/schedule/test_split_normalizations.py).
            assert "under a 32-byte sector" in str(e), (M, N, e)
            continue
        text = _check_source(kernel, params, src)
        ctype = {"bf16": "pf::bf16", "fp16": "pf::half", "fp32": "float"}[dtype]
        assert f"const {ctype}* __restrict__ T0" in text
        if sch.NAME == "reduction":
            assert ("pf::block_allreduce_x" in text) == params.inner
            assert ("pf::block_allreduce_y" in text) == (not params.inner)
        if src in seen:
            continue
        seen.add(src)
        mod = compile_checked(src, "k")
        if sch.NAME not in ("pointwise", "reduction"):
            continue
        ws = kernel.reduction_workspace if any(
            isinstance(s, K.BlockReduce) for s in K.walk(kernel.body)) else 0
        grid = any(isinstance(s, K.GridReduce) for s in K.walk(kernel.body))
        # Static shared memory is the reduction workspace (fp32 accumulators) and the
        # grid reduction's last-block flag, nothing else.
        assert mod.ptxas.static_smem_bytes == 4 * ws + 4 * grid, (params, mod.ptxas.summary())
    assert seen, f"{name}: every shape refused, no kernel checked"


@pytest.mark.parametrize("name,dtype", [(n, d) for n in KERNEL_FUSIONS for d in DTYPES] + [
    pytest.param(n, "bf16", marks=pytest.mark.slow) for n in NORMS])
def test_catalogue_kernels_compile_clean_16384x8192(name, dtype):
    fd = catalogue.define(name, dtype)
    inputs = empty_inputs(name, 16384, 8192, dtype)
    if name == "softmax_dim0":
        # 16384 rows fit a block 2 columns wide: refused, and planned as two kernels.
        from pyfuser.runtime.explain import explain_fusion
        (whole,) = explain_fusion(fd.fusion, inputs, device="h100").segments
        assert "under a 32-byte sector" in whole.refused
        # The split rewrite's own executor offers it to every scheduler: refused again.
        (rewrite,) = whole.again.segments
        assert "under a 32-byte sector" in rewrite.refused
        assert [s.name for s in rewrite.again.segments] == ["reduction", "pointwise"]
        return
    st, sch, params, kernel, src = build(fd, inputs)
    _check_source(kernel, params, src)
    compile_checked(src, "k")


def test_large_reductions_split_over_the_grid_and_compile():
    # The bench shapes: column sums of [16384, 8192] split the rows over blockIdx.y.
    fd = catalogue.define("col_sum", "bf16")
    st, sch, params, kernel, src = build(fd, empty_inputs("col_sum", 16384, 8192))
    assert params.grid_split > 1 and "grid reduction over blockIdx.y" in src
    compile_checked(src, "k")
    fd = catalogue.define("row_sum", "bf16")
    st, sch, params, kernel, src = build(fd, empty_inputs("row_sum", 4, 1 << 20))
    assert params.inner and params.grid_split > 1 and "grid reduction over blockIdx.y" in src
    compile_checked(src, "k")


def test_64_bit_indexing_compiles():
    fd = catalogue.define("silu_mul", "bf16")
    st, sch, params, kernel, src = build(fd, empty_inputs("silu_mul", 7, 4097), index_type="int64")
    assert "typedef long long index_t;" in src
    compile_checked(src, "k")


def _from(tensors, body):
    with FusionDefinition() as fd:
        vs = [fd.from_pytorch(t) for t in tensors]
        fd.add_output(body(fd, *vs))
    return fd


LAYOUTS = {
    "sliced": lambda dt: torch.empty(1030, 2056, dtype=dt)[3:, 5:2052],
    "transposed": lambda dt: torch.empty(2047, 1027, dtype=dt).t(),
    "expanded": lambda dt: torch.empty(1027, 1, dtype=dt).expand(1027, 2047),
    "row_broadcast": lambda dt: torch.empty(1, 2047, dtype=dt),
}
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_pointwise_layouts_compile_clean(layout, dtype):
    x = LAYOUTS[layout](TORCH[dtype])
    y = torch.empty(x.shape[0] if layout != "row_broadcast" else 1027, x.shape[1],
                    dtype=TORCH[dtype])
    fd = _from([x, y], lambda fd, a, b: fd.ops.mul(fd.ops.sigmoid(a), b))
    # The pointwise scheduler's kernels (the transpose scheduler takes "transposed" by default).
    st, sch, params, kernel, src = build(fd, [x, y], scheduler=registry.by_name("pointwise"))
    assert sch.NAME == "pointwise"
    _check_source(kernel, params, src)
    compile_checked(src, "k")


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_layouts_compile_clean(layout, dim):
    x = LAYOUTS[layout](torch.bfloat16)
    fd = _from([x], lambda fd, a: fd.ops.cast(fd.ops.sum(fd.ops.cast(a, DataType.Float), [dim]),
                                              DataType.BFloat16))
    st, sch, params, kernel, src = build(fd, [x])
    assert sch.NAME == "reduction"
    _check_source(kernel, params, src)
    compile_checked(src, "k")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("dim", [0, 1])
def test_16_bit_reduction_without_casts_compiles_clean(dtype, dim):
    # fd.ops.sum of a 16-bit tensor, no casts written: the kernel accumulates in float (a 16-bit
    # accumulator has no constructor from the double initial value, nor a block workspace name).
    x = torch.empty(1027, 4096, dtype=TORCH[dtype])
    fd = _from([x], lambda fd, a: fd.ops.sum(a, [dim]))
    st, sch, params, kernel, src = build(fd, [x])
    assert sch.NAME == "reduction"
    _check_source(kernel, params, src)
    assert "static_cast<pf::bf16>(0.0)" not in src and "static_cast<pf::half>(0.0)" not in src
    compile_checked(src, "k")


@pytest.mark.parametrize("name", KERNEL_FUSIONS)
def test_misaligned_inputs_compile_without_vector_loads(name):
    fd = catalogue.define(name, "bf16")
    st, sch, params, kernel, src = build(fd, empty_inputs(name, 64, 1024), alignment=2)
    assert params.vector_inputs == ()
    assert "pf::load_global_vec" not in src
    compile_checked(src, "k")


def test_generated_kernel_text_for_a_vectorized_pointwise():
    fd = catalogue.define("silu_mul", "bf16")
    st, sch, params, kernel, src = build(fd, empty_inputs("silu_mul", 256, 1024))
    text = _kernel_text(src)
    assert params.vector == 8 and params.vector_inputs == (0, 1)
    assert text.count("pf::load_global_vec<pf::LoadHint::ReadOnly>") == 2
    assert text.count("pf::store_global_vec(") == 1
    assert "pf::silu(" in text
    assert "pf::bf16* __restrict__ T" in text
    # No 64-bit index math in a 32-bit-indexed kernel.
    assert "typedef int index_t;" in text and "long long" not in text.split("{", 1)[1]


def test_a_product_computed_twice_is_rounded_on_its_own_in_both_copies():
    """A product the kernel computes twice (recomputed for var's x - mean) is printed as
    pf::mul_rn in both copies, so neither is contracted into an FMA with its consumer: the two
    then agree bit for bit, and var of a one-element row is 0 / 0 = NaN (fuzz 20261127:735,
    wrong on the H100 only). Products computed once stay plain, free to contract."""
    from statistic_fusions import var_of_a_recomputed_product
    fd, inputs = var_of_a_recomputed_product(256)
    *_, src = build(fd, inputs)
    text = _kernel_text(src)
    products = re.findall(r"= pf::cast<float>\((pf::mul_rn\(|\(pf::cast<float>\(T\d+\[\w+\]\) \*)",
                          text)
    assert sum(p.startswith("pf::mul_rn") for p in products) == 2, products
    compile_checked(src, "k")
