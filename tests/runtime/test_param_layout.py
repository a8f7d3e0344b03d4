"""ParamLayout packing, and its agreement with the parameters ptxas records in the cubin."""

import struct

import pytest

from cubin_params import kernel_params
from pyfuser.runtime.launch import ParamLayout, natural_alignment, packing_offsets
from pyfuser.runtime.nvrtc import compile_to_cubin

TMAP = bytes(range(128))


def test_tensor_map_is_64_byte_aligned_in_the_buffer():
    layout = ParamLayout(["ptr", "i32", "tmap", "f32"])
    assert layout.offsets == (0, 8, 64, 192)
    assert layout.sizes == (8, 4, 128, 4)
    assert layout.size == 196


@pytest.mark.parametrize(
    "kinds, offsets, size",
    [
        ([], (), 0),
        (["f32"], (0,), 4),
        (["i32", "i64"], (0, 8), 16),
        (["i32", "f32", "f64"], (0, 4, 8), 16),
        (["tmap", "ptr"], (0, 128), 136),
        (["i32", "tmap", "tmap", "i32"], (0, 64, 192, 320), 324),
    ],
)
def test_offsets_follow_natural_alignment(kinds, offsets, size):
    layout = ParamLayout(kinds)
    assert (layout.offsets, layout.size) == (offsets, size)
    assert packing_offsets(layout.sizes) == (offsets, size), "launch packs the same way"


def test_pack_places_every_value():
    layout = ParamLayout(["ptr", "i32", "tmap", "f32", "i64", "f64"])
    data = layout.pack([0x7F00_1234_5678, -5, TMAP, 1.5, -(2**40), 0.25])
    assert len(data) == layout.size
    assert struct.unpack_from("<Q", data, 0)[0] == 0x7F00_1234_5678
    assert struct.unpack_from("<i", data, 8)[0] == -5
    assert data[64:192] == TMAP
    assert struct.unpack_from("<f", data, 192)[0] == 1.5
    assert struct.unpack_from("<q", data, 200)[0] == -(2**40)
    assert struct.unpack_from("<d", data, 208)[0] == 0.25
    assert data[12:64] == bytes(52), "padding is zero"


def test_pack_into_a_buffer():
    layout = ParamLayout(["ptr", "f32"])
    buffer = bytearray(layout.size)
    layout.pack_into(buffer, [1, 2.0])
    assert bytes(buffer) == layout.pack([1, 2.0])


@pytest.mark.parametrize("value", [b"", bytes(127), bytes(129)])
def test_wrong_sized_tensor_map_is_refused(value):
    with pytest.raises(ValueError, match="128 bytes"):
        ParamLayout(["ptr", "tmap"]).pack([0, value])


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown parameter kinds"):
        ParamLayout(["ptr", "u8"])


def test_natural_alignment_rule():
    assert [natural_alignment(s) for s in (1, 2, 4, 8, 12, 16, 24, 32, 128)] == [
        1, 2, 4, 8, 4, 16, 8, 16, 64
    ]


# ---------------------------------------------------------------------------------------------
# Against the compiler: parameter records in the cubin (no GPU needed)
# ---------------------------------------------------------------------------------------------

_C_TYPES = {
    "ptr": "float*",
    "i64": "long long",
    "i32": "int",
    "f32": "float",
    "f64": "double",
    "tmap": "const __grid_constant__ CUtensorMap",
}


def _kernel_params(kinds, arch="sm_90a"):
    pytest.importorskip("cuda.bindings.nvrtc")
    signature = ", ".join(f"{_C_TYPES[k]} p{i}" for i, k in enumerate(kinds))
    source = (
        "struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };\n"
        f'extern "C" __global__ void k({signature}) {{}}\n'
    )
    module = compile_to_cubin(source, "k", arch=arch)
    return kernel_params(module.cubin, "k")


@pytest.mark.parametrize(
    "kinds",
    [
        ["ptr", "i32", "f32", "i64", "f64"],
        ["i32", "f64", "i32", "ptr", "f32"],
        ["ptr", "i32", "tmap", "f32"],
        ["tmap", "ptr", "tmap", "i64"],
    ],
)
def test_sizes_and_order_match_the_cubin(kinds):
    layout = ParamLayout(kinds)
    params = _kernel_params(kinds)
    assert [size for _, size in params] == list(layout.sizes)


def test_without_tensor_maps_the_offsets_match_the_cubin():
    kinds = ["i32", "f64", "i32", "ptr", "f32", "i64"]
    assert [offset for offset, _ in _kernel_params(kinds)] == list(ParamLayout(kinds).offsets)


def test_on_sm90_the_cubin_puts_a_tensor_map_at_48_not_64():
    """Why launches pass one pointer per parameter (kernelParams) and never the packed buffer
    itself (extra/CU_LAUNCH_PARAM_BUFFER_POINTER): the sm_90 parameter bank starts at 0x210,
    and ptxas aligns the 64-byte-aligned CUtensorMap within the bank, i.e. at bank offset 576,
    parameter offset 48. On sm_100 the bank starts at 0x380 (a multiple of 64): offset 64."""
    kinds = ["ptr", "i32", "tmap", "f32"]
    assert _kernel_params(kinds, "sm_90a") == [(0, 8), (8, 4), (48, 128), (176, 4)]
    assert _kernel_params(kinds, "sm_100a") == [(0, 8), (8, 4), (64, 128), (192, 4)]
    assert ParamLayout(kinds).offsets == (0, 8, 64, 192)
