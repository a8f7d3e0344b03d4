"""The fusion IR printer: the text a compiler engineer reads."""
from pyfuser import DataType, FusionDefinition
from pyfuser.ir import MemoryType, ParallelType
from pyfuser.ir.printer import tv_str, tv_transforms_str
from pyfuser.schedule import cache_after, circular_buffer, inline_at, inline_most
from pyfuser.ir import LoadKind


def _softmax_like():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        s = fd.ops.sum(xf, [1])
        fd.add_output(fd.ops.cast(s, DataType.Half))
    return fd, x, xf, s


def test_tensor_text_has_names_memory_dtype_and_domains():
    fd, x, xf, s = _softmax_like()
    assert tv_str(x) == "T0_g_bfloat16[iS0{i0}, iS1{i1}]"
    assert tv_str(xf) == "T1_l_float[iS2{i0}, iS3{i1}]"
    assert tv_str(s) == "T2_l_float[iS4{i0}, rS5{i1}]"
    assert tv_str(fd.fusion.outputs[0]) == "T3_g_half[iS6{i0}]"


def test_fusion_text():
    fd, *_ = _softmax_like()
    text = str(fd.fusion)
    assert text.splitlines()[:4] == ["Inputs:", "  T0_g_bfloat16[iS0{i0}, iS1{i1}]", "Outputs:",
                                     "  T3_g_half[iS6{i0}]"]
    assert ("T1_l_float[iS2{i0}, iS3{i1}]\n   = cast<float>( T0_g_bfloat16[iS0{i0}, iS1{i1}] );"
            in text)
    assert ("T2_l_float[iS4{i0}, rS5{i1}]\n   = reduction( T1_l_float[iS2{i0}, iS3{i1}], "
            "op = sum, initial value = 0.0 );") in text
    assert text.index("cast<float>") < text.index("reduction(") < text.index("cast<half>")
    assert "%kernel_math {" in text and text.rstrip().endswith("} // %kernel_math")


def test_compute_at_and_produce_positions_printed():
    fd, x, xf, s = _softmax_like()
    inline_most(fusion=fd.fusion)
    # The cast is computed inside the reduction's loops; the reduction inside the row loop.
    assert tv_str(xf) == "T1_l_float[iS2{i0}, iS3{i1}] ca_pos( 2 )"
    assert tv_str(s) == "T2_l_float[iS4{i0}, rS5{i1}] ca_pos( 1 ) produce_pos( 2 )"
    assert "T3_g_half[iS6{i0}] produce_pos( 1 )" in str(fd.fusion)


def test_paper_example_form_with_ca_pos():
    with FusionDefinition() as fd:
        a = fd.define_tensor([-1, -1])
        b = fd.ops.exp(a)
        c = fd.ops.neg(b)
        d = fd.ops.sum(c, [1])
        fd.add_output(d)
    inline_at(b, 1)
    assert tv_str(c) == "T2_l_float[iS4{i0}, iS5{i1}] produce_pos( 1 )"
    assert tv_str(b) == "T1_l_float[iS2{i0}, iS3{i1}] ca_pos( 1 )"
    assert tv_str(d) == "T3_g_float[iS6{i0}, rS7{i1}]"


def test_broadcast_expanded_and_static_extents():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 1, -1], expanded=[False, True, False])
        fd.add_output(fd.ops.exp(x))
    assert tv_str(x) == "T0_g_float[iS0{8}, bS1{1 ex i0}, iS2{i1}]"


def test_transforms_text_and_circular_buffer():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], stride_order=[0, 1])
        fd.add_output(fd.ops.exp(x))
    c = cache_after(x, LoadKind.TmaBulk)
    c.split(0, 4)
    c.parallelize(0, ParallelType.BIDx)
    circular_buffer(c, 3)
    assert c.memory_type == MemoryType.Shared
    text = tv_transforms_str(c)
    assert text.splitlines() == [
        "T2_s_float",
        "  logical domain : (iS4{i0}, iS5{i1})",
        "  allocation domain : (iS5{i1}, iBIDx6{ceilDiv(i0, 4)}, iS7{4}) contiguity: ttt",
        "  Split: iS4{i0} by 4 (inner) -> iBIDx6{ceilDiv(i0, 4)}, iS7{4}",
        "  loop domain : (iBIDx6{ceilDiv(i0, 4)}, iS7{4}, iS5{i1})",
    ]
    assert tv_str(c).endswith("circular_buffer( stages=3, prefetch=2, PipelinedBuffer )")
    tx = tv_transforms_str(x)
    assert "allocation domain : (iS1{i1}, iS0{i0}) contiguity: tt" in tx
    assert "set( T0_g_float[iS0{i0}, iS1{i1}], load = tma.1d )" in str(fd.fusion)
