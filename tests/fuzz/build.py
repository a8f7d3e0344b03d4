"""A case spec as Python source: the fusion definition (fd.ops calls) and its inputs (explicit
torch code), and a stand-alone repro script around them.

The runner does not interpret specs itself: materialize() executes the very text that
case_source() returns, so a failure's repro script is what ran.
"""
from __future__ import annotations

import textwrap

from .spec import DTYPE_SOURCE, DTYPES

STORAGE_HELPER = '''\
def storage(n, dtype, seed, dist, lo, hi):
    """n values drawn in float64 from a generator seeded with `seed`, then cast to `dtype`."""
    g = torch.Generator().manual_seed(seed)
    if dist == "normal":
        v = torch.randn(n, generator=g, dtype=torch.float64).clamp_(lo, hi)
    elif dist == "uniform":
        v = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
    elif dist == "int":
        v = torch.randint(lo, hi + 1, (n,), generator=g)
    else:
        v = torch.rand(n, generator=g, dtype=torch.float64) < 0.5
    return v.to(dtype)
'''


def _arg(a) -> str:
    if isinstance(a, str):
        return a                      # a value name
    if isinstance(a, float):
        return repr(a)
    return repr(a)


def _kwarg(k, v) -> str:
    if k == "dtype":
        return f"dtype={DTYPE_SOURCE[DTYPES[v]]}"
    return f"{k}={v!r}"


def op_source(op: dict) -> str:
    out = op["out"]
    lhs = ", ".join(out) if isinstance(out, list) else out
    args = [_arg(a) for a in op["args"]]
    kwargs = [_kwarg(k, v) for k, v in op["kwargs"].items()]
    if op["op"] == "define_scalar":
        return f"{lhs} = fd.define_scalar({', '.join(args + kwargs)})"
    if op["op"] == "cat":       # the generator records the tensors as separate arguments
        args = [f"[{', '.join(args[:-1])}]", args[-1]]
    return f"{lhs} = fd.ops.{op['op']}({', '.join(args + kwargs)})"


def inputs_source(spec: dict) -> str:
    """Torch code making each input (`in_<name>`) on DEVICE, and the list `inputs`."""
    lines = []
    for inp in spec["inputs"]:
        name = f"in_{inp['name']}"
        if inp["kind"] == "scalar":
            lines.append(f"{name} = {inp['value']!r}")
            continue
        v = inp["values"]
        torch_dtype = f"torch.{inp['dtype']}"
        lines.append(
            f"{name} = storage({inp['storage']}, {torch_dtype}, {v['seed']}, {v['dist']!r}, "
            f"{v['lo']!r}, {v['hi']!r}).to(DEVICE).as_strided({tuple(inp['sizes'])!r}, "
            f"{tuple(inp['strides'])!r}, {inp['offset']})")
    lines.append("inputs = [" + ", ".join(f"in_{i['name']}" for i in spec["inputs"]) + "]")
    return "\n".join(lines)


def definition_source(spec: dict) -> str:
    """`with FusionDefinition(...) as fd:` defining the inputs, the ops and the outputs."""
    name = "fuzz_" + spec["id"].replace(":", "_")
    body = []
    for inp in spec["inputs"]:
        dt = DTYPE_SOURCE[DTYPES[inp["dtype"]]]
        if inp["kind"] == "scalar":
            body.append(f"{inp['name']} = fd.define_scalar(dtype={dt})")
            continue
        d = inp["define"]
        if d["how"] == "from_pytorch":
            static = ", static_sizes=True" if d.get("static_sizes") else ""
            body.append(f"{inp['name']} = fd.from_pytorch(in_{inp['name']}{static})")
            continue
        args = [f"shape={d['shape']!r}", f"contiguity={d['contiguity']!r}", f"dtype={dt}"]
        if d.get("stride_order") is not None:
            args.append(f"stride_order={d['stride_order']!r}")
        if d.get("expanded") is not None:
            args.append(f"expanded={d['expanded']!r}")
        body.append(f"{inp['name']} = fd.define_tensor({', '.join(args)})")
    body += [op_source(op) for op in spec["ops"]]
    body += [f"fd.add_output({o}, alias_input={i})" for o, i in spec.get("aliases", {}).items()]
    body += [f"fd.add_output({o})" for o in spec["outputs"]]
    return f"with FusionDefinition({name!r}) as fd:\n" + textwrap.indent("\n".join(body), "    ")


def case_source(spec: dict) -> str:
    """Inputs then definition: the part of a repro that the runner executes."""
    return (f"{STORAGE_HELPER}\n\n{inputs_source(spec)}\n\n{definition_source(spec)}\n")


PRELUDE = """\
import torch

from pyfuser import FusionDefinition
from pyfuser.ir.dtype import DataType
"""


def materialize(spec: dict, device: str = "cpu"):
    """(fd, inputs) of a spec, made by executing case_source(spec) with DEVICE = device.
    Frontend errors (FusionDefinitionError and others) propagate."""
    namespace: dict = {"DEVICE": device}
    exec(compile(PRELUDE + case_source(spec), f"<fuzz case {spec['id']}>", "exec"), namespace)
    return namespace["fd"], namespace["inputs"]


CHECK_SOURCE = '''\
def check(fd, outputs, refs, tolerances):
    """Each output against the float64 reference: dtype, shape, strides (dense in the output's
    allocation order, stride 0 along expanded dims), NaN/inf positions, then ||out - ref|| /
    ||ref|| (and the largest element error) against the fuzzer's tolerance."""
    from pyfuser.runtime.inputs import output_strides
    ok = True
    for k, (o, r, (dtype, tol, elem_tol)) in enumerate(zip(outputs, refs, tolerances)):
        problems = []
        want = output_strides(fd.fusion.outputs[k], list(r.shape))
        in_input = k in fd.fusion.hidden_outputs
        if not in_input and o.shape == r.shape and any(
                s != w for s, w, n in zip(o.stride(), want, r.shape) if n > 1):
            problems.append(f"strides {tuple(o.stride())}, expected {tuple(want)}")
        o = o.cpu()
        r = r.cpu()
        if str(o.dtype).removeprefix("torch.") != dtype:
            problems.append(f"dtype {o.dtype}, expected {dtype}")
        if o.shape != r.shape:
            problems.append(f"shape {tuple(o.shape)}, expected {tuple(r.shape)}")
        else:
            od, rd = o.double(), r.double()
            if tol is None:                           # integers and bools: exact
                bad = int((od != rd).sum())
                if bad:
                    problems.append(f"{bad} of {od.numel()} elements differ")
            else:
                nan = od.isnan() != rd.isnan()
                inf = (od.isinf() | rd.isinf()) & (od != rd) & ~(od.isnan() | rd.isnan())
                if nan.any() or inf.any():
                    problems.append(f"NaN/inf positions differ at {int(nan.sum() + inf.sum())} "
                                    "elements")
                fin = od.isfinite() & rd.isfinite()
                d, rf = (od - rd)[fin], rd[fin]
                err = (d.norm() / rf.norm()).item() if rf.norm() > 0 else d.norm().item()
                scale = rf.abs() + (rf.pow(2).mean().sqrt() if rf.numel() else 0)
                elem = (d.abs() / scale.clamp_min(1e-30)).max().item() if d.numel() else 0.0
                if err > tol or elem > elem_tol:
                    problems.append(f"relative error {err:.3e} (tolerance {tol:.1e}), largest "
                                    f"element error {elem:.3e} (tolerance {elem_tol:.1e})")
        print(f"output {k}:", "; ".join(problems) or "ok")
        ok = ok and not problems
    return ok
'''


def repro_script(spec: dict, backend: str = "interpret", tolerances=None,
                 summary: str = "", compile: bool = False) -> str:
    """A stand-alone script: the case, executed as the fuzzer did, then checked against the
    float64 reference with the tolerances the fuzzer used (`tolerances`: one (dtype name,
    norm tolerance or None for exact, element tolerance) per output). `compile`: the
    interpreted kernels are then compiled with NVRTC, as the fuzzer's --compile does (a
    CompileError ends the script)."""
    from .check import execute_options
    device = "cuda" if backend == "gpu" else "cpu"
    options = execute_options(spec, backend)
    head = (f'"""pyfuser fuzz case {spec["id"]} (pattern {spec["pattern"]}), backend '
            f'{backend}.\n' + (textwrap.fill(summary, 96) + "\n" if summary else "") +
            f"Regenerate: python tests/fuzz/run_fuzz.py --case {spec['id']} "
            f"--max-elements {spec['max_elements']} --backend {backend}\n"
            'Run: PYTHONPATH=<pyfuser checkout> python <this file>\n"""\n')
    tol_line = f"TOLERANCES = {tolerances!r}\n" if tolerances is not None else "TOLERANCES = None\n"
    compile_lines = ""
    if compile and backend != "gpu":
        compile_lines = ("\nfrom pyfuser.runtime.fusion_kernel import compile_kernel  # noqa: E402\n\n"
                         "for fk in fd.kernels(last_run=True):   # NVRTC must accept the CUDA too\n"
                         "    compile_kernel(fk)\n")
    tail = f'''
originals = [x.clone() if hasattr(x, "clone") else x for x in inputs]
outputs = fd.execute(inputs, options={options!r})
print(fd.last_run)
{compile_lines}
from pyfuser.runtime.inputs import check_inputs  # noqa: E402
from pyfuser.runtime.reference import evaluate  # noqa: E402

# In-place outputs execute does not return are judged in the inputs they were written into.
returned = iter(outputs)
outputs = [inputs[fd.fusion.output_aliases[k]] if k in fd.fusion.hidden_outputs
           else next(returned) for k in range(len(fd.fusion.outputs))]
refs = evaluate(fd.fusion, originals, promote_to_double=True,
                extent_bindings=check_inputs(fd.fusion, originals), all_outputs=True)
{tol_line}if TOLERANCES is not None:
    raise SystemExit(0 if check(fd, outputs, refs, TOLERANCES) else 1)
'''
    return (head + PRELUDE + f'\nDEVICE = "{device}"\n\n' + case_source(spec) + "\n"
            + CHECK_SOURCE + tail)
