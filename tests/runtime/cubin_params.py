"""Read a kernel's parameter offsets and sizes out of a cubin, without a driver.

Why: the driver reports them (cuFuncGetParamInfo) only on a GPU machine, but the layout the
compiler chose is the ground truth that ParamLayout and LoadedKernel must agree with, so CPU
tests read it from the cubin: ELF section ``.nv.info.<kernel>`` holds one EIATTR_KPARAM_INFO
record per parameter (format EIFMT_SVAL: u8 format, u8 attribute, u16 length, payload
{u32 index, u16 ordinal, u16 offset, u32 flags with the size in bits 18..31}).
"""

from __future__ import annotations

import struct

_EIFMT_SVAL = 0x04
_EIATTR_KPARAM_INFO = 0x17


def _sections(cubin: bytes) -> dict[str, tuple[int, int]]:
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_offset = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_offset + offset
        return cubin[start : cubin.index(b"\0", start)].decode()

    return {name(h[0]): (h[4], h[5]) for h in headers}


def kernel_params(cubin: bytes, symbol: str) -> list[tuple[int, int]]:
    """[(offset, size)] of each parameter of ``symbol``, in declaration order."""
    offset, size = _sections(cubin)[f".nv.info.{symbol}"]
    params, cursor, end = {}, offset, offset + size
    while cursor < end:
        fmt, attribute = cubin[cursor], cubin[cursor + 1]
        if fmt == _EIFMT_SVAL:
            (length,) = struct.unpack_from("<H", cubin, cursor + 2)
            payload = cubin[cursor + 4 : cursor + 4 + length]
            cursor += 4 + length
        else:  # the other formats carry at most 2 bytes inline; records stay 4-byte aligned
            payload = b""
            cursor += 4
        if attribute == _EIATTR_KPARAM_INFO:
            _, ordinal, param_offset, flags = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (param_offset, (flags >> 18) & 0x3FFF)
    return [params[i] for i in sorted(params)]
