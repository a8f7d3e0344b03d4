"""Data types of the fusion IR and torch's type-promotion rules restricted to them.

The float8 types (e4m3fn, e5m2) are storage types, as in torch: tensors of them are read,
written, moved and cast, and torch promotes them with no other type, so arithmetic on them is a
definition error (frontend/ops.py) that asks for a cast first. Kernels widen them to float.
"""
from __future__ import annotations

import functools

import enum


class DataType(enum.Enum):
    """Element types a fusion can hold. The value is (name, bytes, category, rank-in-category)."""

    Bool = ("bool", 1, 0, 0)
    # Rank 0 among the floats: torch promotes a float8 type with no other type (promote()).
    Float8_e4m3fn = ("float8_e4m3fn", 1, 2, 0)
    Float8_e5m2 = ("float8_e5m2", 1, 2, 0)
    Int32 = ("int32", 4, 1, 1)
    Int = ("int64", 8, 1, 2)
    Half = ("float16", 2, 2, 1)
    BFloat16 = ("bfloat16", 2, 2, 1)
    Float = ("float32", 4, 2, 2)
    Double = ("float64", 8, 2, 3)

    # Aliases in the spelling nvFuser's users know.
    Int64 = Int
    Float16 = Half
    Float32 = Float
    Float64 = Double

    @property
    def short_name(self) -> str:
        return self.value[0]

    @property
    def ir_name(self) -> str:
        """Spelling in printed IR: T3_l_float, T0_g_bfloat16."""
        return {"float32": "float", "float64": "double", "float16": "half"}.get(self.value[0], self.value[0])

    @property
    def size(self) -> int:
        return self.value[1]

    @property
    def is_floating(self) -> bool:
        return self.value[2] == 2

    @property
    def is_integral(self) -> bool:
        return self.value[2] == 1

    @property
    def is_boolean(self) -> bool:
        return self.value[2] == 0

    @property
    def is_float8(self) -> bool:
        """float8 e4m3fn and e5m2: storage only, computed in float32 inside kernels."""
        return self in (DataType.Float8_e4m3fn, DataType.Float8_e5m2)

    @property
    def is_reduced_float(self) -> bool:
        """16-bit floats: computed in float32 inside kernels."""
        return self in (DataType.Half, DataType.BFloat16)

    def __repr__(self) -> str:
        return f"DataType.{self.name}"

    def __str__(self) -> str:
        return self.short_name


_CATEGORY = {0: "bool", 1: "int", 2: "float"}


class PromotionError(TypeError):
    """Two types torch does not promote together (a float8 type and any other)."""


def promote(a: DataType, b: DataType) -> DataType:
    """torch.promote_types for the types above (bf16 with fp16 gives float32; a float8 type
    promotes only with itself, as in torch)."""
    if a == b:
        return a
    if a.is_float8 or b.is_float8:
        raise PromotionError(f"torch does not promote {a.short_name} and {b.short_name} (no "
                             "float8 type promotes with another type); cast explicitly")
    ca, cb = a.value[2], b.value[2]
    if ca != cb:
        return a if ca > cb else b
    if {a, b} == {DataType.Half, DataType.BFloat16}:
        return DataType.Float
    return a if a.value[3] > b.value[3] else b


def default_scalar_type(value) -> DataType:
    if isinstance(value, bool):
        return DataType.Bool
    if isinstance(value, int):
        return DataType.Int
    if isinstance(value, float):
        return DataType.Double
    raise TypeError(f"unsupported scalar value {value!r} of type {type(value).__name__}")


def result_type(tensor_types: list[DataType], scalar_types: list[DataType]) -> DataType:
    """torch.result_type: tensors decide the type; a scalar only lifts the category.

    torch: float tensor + int scalar -> the tensor's float type; int tensor + float scalar ->
    the default float type (float32); bool tensor + int scalar -> int64.
    """
    if not tensor_types:
        out = scalar_types[0]
        for t in scalar_types[1:]:
            out = promote(out, t)
        return out
    out = tensor_types[0]
    for t in tensor_types[1:]:
        out = promote(out, t)
    for s in scalar_types:
        if s.value[2] > out.value[2]:
            out = DataType.Float if s.is_floating else DataType.Int
    return out


def compute_type(dtype: DataType) -> DataType:
    """The type arithmetic runs in: 16-bit floats compute in float32, as torch does; a float8
    value is read as float32 too (a cast from it, or a copy)."""
    return DataType.Float if dtype.is_reduced_float or dtype.is_float8 else dtype


_TORCH_NAMES = {
    DataType.Bool: "bool",
    DataType.Int32: "int32",
    DataType.Int: "int64",
    DataType.Half: "float16",
    DataType.BFloat16: "bfloat16",
    DataType.Float: "float32",
    DataType.Double: "float64",
    DataType.Float8_e4m3fn: "float8_e4m3fn",
    DataType.Float8_e5m2: "float8_e5m2",
}


def to_torch(dtype: DataType):
    import torch

    return getattr(torch, _TORCH_NAMES[dtype])


def from_torch(torch_dtype) -> DataType:
    name = str(torch_dtype).removeprefix("torch.")
    aliases = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
    name = aliases.get(name, name)
    for dt, n in _TORCH_NAMES.items():
        if n == name:
            return dt
    raise TypeError(f"pyfuser does not support torch dtype {torch_dtype}")


def parse_dtype(spec) -> DataType:
    """DataType from a DataType, a torch dtype or a short name such as 'bf16'."""
    if isinstance(spec, DataType):
        return spec
    if isinstance(spec, str):
        short = {"bf16": DataType.BFloat16, "fp16": DataType.Half, "f16": DataType.Half,
                 "fp32": DataType.Float, "f32": DataType.Float, "fp64": DataType.Double,
                 "f64": DataType.Double, "fp8_e4m3": DataType.Float8_e4m3fn,
                 "e4m3": DataType.Float8_e4m3fn, "fp8_e5m2": DataType.Float8_e5m2,
                 "e5m2": DataType.Float8_e5m2}
        if spec in short:
            return short[spec]
        for dt in DataType:
            if dt.short_name == spec:
                return dt
        raise ValueError(f"unknown dtype {spec!r}; use bf16, fp16, fp32, fp64, e4m3, e5m2 or "
                         "a DataType")
    return from_torch(spec)


@functools.cache
def e4m3fn_overflow_is_nan() -> bool:
    """Whether the installed torch turns a float past e4m3fn's range into NaN (releases before
    2.13: a magnitude above 464, infinity included) rather than saturating it to +-448 (2.13).
    Kernels convert as the torch they run beside does (codegen/device_library.py)."""
    import torch
    return torch.tensor([470.0]).to(torch.float8_e4m3fn).view(torch.uint8).item() == 0x7f
