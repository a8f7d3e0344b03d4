"""The case spec: one generated fusion and its inputs as plain JSON data.

A spec is a dict (json.dumps / json.loads keep it unchanged):

    {
      "id": "7:123",                 # "<seed>:<index>": the generator's input
      "seed": 7, "index": 123,
      "pattern": "layernorm_fwd",    # which generator made it (fuzz/gen.py PATTERNS)
      "max_elements": 65536,         # the size budget it was generated under
      "inputs": [                    # fusion inputs, in order
        {"name": "t0", "kind": "tensor", "dtype": "bfloat16",
         "sizes": [33, 100], "strides": [1, 40], "offset": 3, "storage": 4003,
         "values": {"dist": "normal", "lo": -4.0, "hi": 4.0, "seed": 912},
         "define": {"how": "define_tensor", "shape": [-1, -1], "contiguity": [False, True],
                    "stride_order": [0, 1], "expanded": None}},
        {"name": "s0", "kind": "scalar", "dtype": "float32", "value": 0.5},
      ],
      "ops": [                       # fd.ops calls, in order
        {"out": "v0", "op": "cast", "args": ["t0"], "kwargs": {"dtype": "float32"}},
        {"out": ["v1", "v2"], "op": "var_mean", "args": ["v0", [1]],
         "kwargs": {"correction": 0, "keepdim": True}},
        {"out": "v3", "op": "define_scalar", "args": [], "kwargs": {"value": 2.0}},
        ...
      ],
      "outputs": ["v5", "v2"],
      "options": {"enable": ["tma_inner_persistent"]},   # features forced (fd.execute options)
      "tags": {...},                 # what the case covers (coverage statistics only)
    }

Inputs are materialized as `storage.as_strided(sizes, strides, offset)` over a 1-D storage of
`storage` elements drawn from `values` (a torch.Generator seeded with values.seed), so every
layout (permuted, padded, offset, stride 0) is one explicit line of torch code.
`define.how` is "define_tensor" (the keyword arguments given) or "from_pytorch" (the fusion
input is defined from the materialized tensor; "static_sizes" may be set).

In "args", a string names a value (an input or an earlier op's output); numbers, booleans and
lists are literal. In "kwargs", "dtype" is a dtype name (DTYPES); other values are literal.
"""
from __future__ import annotations

import json

from pyfuser.ir.dtype import DataType

# Spec dtype names -> pyfuser data types (the names are torch's).
DTYPES = {
    "bool": DataType.Bool, "int32": DataType.Int32, "int64": DataType.Int,
    "float16": DataType.Half, "bfloat16": DataType.BFloat16, "float32": DataType.Float,
    "float64": DataType.Double, "float8_e4m3fn": DataType.Float8_e4m3fn,
    "float8_e5m2": DataType.Float8_e5m2,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# How a DataType is spelled in generated Python (the repro scripts).
DTYPE_SOURCE = {
    DataType.Bool: "DataType.Bool", DataType.Int32: "DataType.Int32", DataType.Int: "DataType.Int",
    DataType.Half: "DataType.Half", DataType.BFloat16: "DataType.BFloat16",
    DataType.Float: "DataType.Float", DataType.Double: "DataType.Double",
    DataType.Float8_e4m3fn: "DataType.Float8_e4m3fn", DataType.Float8_e5m2: "DataType.Float8_e5m2",
}


def case_id(seed: int, index: int) -> str:
    return f"{seed}:{index}"


def parse_case_id(text: str) -> tuple[int, int]:
    seed, index = text.split(":")
    return int(seed), int(index)


def dumps(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)


def loads(text: str) -> dict:
    return json.loads(text)


def value_names(spec: dict) -> set:
    """Every name a spec defines (inputs and op outputs)."""
    names = {i["name"] for i in spec["inputs"]}
    for op in spec["ops"]:
        out = op["out"]
        names.update(out if isinstance(out, list) else [out])
    return names
