"""Running one case and judging it: run_case(spec, backend) -> CaseResult.

The case runs with `fd.execute(inputs, options={"enable": ["interpret", "poison_outputs",
"verify_kernel_ir"]})` on CPU tensors (backend "interpret": the generated kernels on the kernel-IR
interpreter) or with `poison_outputs` and `verify_kernel_ir` on CUDA tensors (backend "gpu").
Every output is compared with the float64 reference evaluator
(pyfuser.runtime.reference.evaluate(..., promote_to_double=True)).

Categories (CATEGORIES), in the order they are decided:

- definition_error: the frontend refused the fusion (FusionDefinitionError / ShapeError), or
  check_inputs refused the inputs (InputError). A generator bug, or a frontend limitation:
  both are reported.
- illegal_access: the interpreter raised InterpreterError (out-of-bounds or misaligned access,
  a race, a deadlock, a value from unwritten registers stored); on the GPU, a CUDA error
  out of the launch (or the process died: the runner records that).
- interpreter_limit: the interpreter refused to run the kernel (its thread cap): not a verdict.
- internal_error: any other exception out of fd.execute or out of the frontend (a crash, not
  a refusal), or RunInfo.internal_error set (building the kernel failed, the executor fell
  back to the reference evaluator).
- reference_fallback: RunInfo.kind == "reference" without an internal error (no scheduler
  took the fusion, or its heuristic refused these inputs); the reason is normalized
  (normalize()) so that reasons can be counted.
- wrong: kernels ran but an output has the wrong dtype, shape or strides, NaN/inf in other
  places than the reference, or numbers off by more than the tolerance.
- ill_conditioned: wrong, but the fusion's own dtypes already disagree with float64 there (a
  16-bit overflow the generator should have avoided): a generator bug, not a pyfuser one.
- right: kernels ran (or nothing needed to run: every output empty) and every output matches;
  on the GPU, a second call on new tensors of the same values (the executor's guarded call,
  where it made one) matches too.
- timeout: set by the runner when a case outlives its time limit (a hang).

Compiling (`run_case(..., compile=True)`, the runner's --compile). The interpreter runs the
kernel IR, not the CUDA text, so it cannot see generated code that NVRTC refuses (an overload
the device library lacks, a conversion C++ does not allow). With `compile`, every kernel a case
ran on the interpreter is then compiled with NVRTC for sm_90a, as the executor would on an
H100 (runtime.fusion_kernel.compile_kernel, through the disk cache): a CompileError makes the
case an internal_error carrying the NVRTC log (a `wrong` case stays wrong, with the log in its
message). ptxas reports with spills are no failure but are counted (CaseResult.compiled). On
the GPU backend the executor compiles anyway, so `compiled` only reads the ptxas reports.

Tolerances (tolerance()). Integers and bools must match exactly (the generator only makes them
from values kernels compute bit-for-bit). A floating output must satisfy both

    ||out - ref|| / ||ref|| <= tol   and   max_i |out_i - ref_i| / (|ref_i| + rms(ref)) <= elem_tol

(NaN and inf compared by position first, the norms over finite elements), where

    tol      = max(TOLERANCE[dtype], 4 * max(e_native, e_serial), 2 * e_perturbed,
                   4 * u_narrowest)
    elem_tol = max(8 * tol, 4 * max(elem_native, elem_serial), 2 * elem_perturbed)

- TOLERANCE (pyfuser/testing.py) is the project's bar per output dtype: what the final
  rounding to that dtype plus float32 math costs a well-conditioned fusion.
- e_native: the error of the reference evaluator run in the fusion's own dtypes (16-bit
  intermediates rounded, float32 math and float32 accumulation in torch's order) against
  float64. It measures how the fusion's own roundings are amplified downstream (a bf16 cast
  before an exp, a cancellation), which no per-dtype constant can know. A kernel rounds at
  the same places, so its error is of the same order; 4 is the margin for the places it
  rounds differently (bf16 intermediates kept in float registers, other operation orders).
- e_serial: the error of the same native evaluation with every floating sum accumulated
  serially in float32 (float64 sums in float64; numpy's add.accumulate, left to right), the
  worst order a kernel may use. This is the term that grows with the reduced count n. For recursive summation
  |s_hat - s| <= gamma_(n-1) * sum|x_i| (Higham, gamma_k = k u / (1 - k u), u = 2^-24 for the
  float32 accumulators that pyfuser uses for every reduction, 16-bit ones included); a block
  of p threads, each summing n/p elements serially and then a tree, has the bound with n/p +
  log2 p in place of n-1, so the serial order bounds every kernel order. Relative to the
  result the bound is multiplied by the sum's condition number sum|x_i| / |sum x_i|, which
  depends on the data (about sqrt(n) for zero-mean values, 1 for positive ones): measuring
  the serial sum on the case's own data gives that product without guessing it. Rounding
  errors of a sum behave like a random walk, so the serial error is typically u * n / sqrt(2)
  times the values' scale for zero-mean data (1e-5 relative at n = 65536), small against
  the bf16/fp16 bars and within the fp32 one, but it is what a bf16 output of a long
  reduction with cancellation (a mean subtracted, a variance) needs.
- e_perturbed: the largest error, over PERTURBED_DRAWS draws, of the float64 evaluation in
  which the result of every op that a kernel may round otherwise than torch (transcendental
  functions, divisions, sums, matmuls and scans, in their own dtypes) is multiplied by 1 +- u
  of its dtype, the sign drawn per element from a fixed seed: a first-order model of those
  roundings that does not depend on how torch happens to round them. e_native can be luckily
  small: fuzz 2601:213 is -2 plus the sum of (x^-1/2)^-1/2 over x = [0.5, 1.25] in bf16, a sum
  that cancels to -0.10 from terms of 2; torch's CPU bf16 rsqrt rounds 1/sqrt twice and lands
  1.7e-3 from float64, correctly rounded rsqrts (the kernel's) 3.7e-2. Each draw rounds every
  site by the full u, the largest a rounding can be, and the largest of a few draws comes near
  the worst alignment of signs when few sites matter: hence the margin of 2, not 4. Ops that
  torch and a kernel both round correctly (add, sub, mul, casts) are not perturbed: the native
  evaluation has their roundings exactly.
- u_narrowest: the unit roundoff of the narrowest floating dtype among the tensors an output
  is computed from that the kernel rounds and the reference does not (2^-24 for float32; not
  the inputs, exact in both, nor float8 tensors, which the reference rounds as torch does). A float64 output of a float32 intermediate cannot be
  closer to float64 than that intermediate's rounding, and e_native can be luckily small (one
  value broadcast, which torch's sigmoid rounds correctly and a kernel's 1 / (1 + expf(-x))
  one ulp off: fuzz 20261125:62). It only matters for float64 outputs: the other dtypes' bars
  are far above it.
- elem_tol catches a few wrong elements that the norm would average away (one element off by
  its own size in a 64K tensor moves the norm by ~1/256); rms(ref) in the denominator keeps
  elements near zero after a cancellation from dominating it.
"""
from __future__ import annotations

import dataclasses
import re
import time
import traceback
import warnings

import numpy as np
import torch

from pyfuser.frontend import FusionDefinitionError
from pyfuser.ir.arith import ShapeError
from pyfuser.ir.dtype import from_torch, to_torch
from pyfuser.ir.exprs import (BinaryOp, BinaryOpType, LinearOp, MatmulOp, ReductionOp,
                              ReductionOpType, ScanOp, ScatterOp, UnaryOp, UnaryOpType)
from pyfuser.ir.tensor import TensorView
from pyfuser.runtime.executor import FallbackWarning
from pyfuser.runtime.inputs import InputError, check_inputs, output_strides
from pyfuser.runtime.interpreter import InterpreterError
from pyfuser.runtime.reference import ReferenceEvaluator, evaluate
from pyfuser.testing import TOLERANCE

from .build import materialize

CATEGORIES = ("right", "wrong", "internal_error", "illegal_access", "timeout",
              "reference_fallback", "definition_error", "ill_conditioned", "interpreter_limit")
# Categories that are pyfuser bugs (the CI sample asserts none of these).
FAILURES = ("wrong", "internal_error", "illegal_access", "timeout")

# The CI sample (test_fuzz_sample.py, run_fuzz.py --sample) compiles the kernels of the cases
# whose index is a multiple of this with NVRTC ("Compiling" above): a fixed subset, since
# compiling all of them would double the sample's time on one core.
SAMPLE_COMPILE_EVERY = 4

NATIVE_MARGIN = 4.0
PERTURBED_MARGIN = 2.0
PERTURBED_DRAWS = 4
ELEMENT_FACTOR = 8.0


@dataclasses.dataclass
class CaseResult:
    id: str
    pattern: str
    category: str
    scheduler: str = ""        # the scheduler registry.choose picked ("" when none)
    signature: str = ""        # the normalized one-line reason (groups failures and fallbacks)
    message: str = ""          # the full reason, error message or comparison details
    seconds: float = 0.0
    backend: str = ""
    outputs: list = dataclasses.field(default_factory=list)   # per output: dtype, tol, error
    run: str = ""              # repr(fd.last_run)
    traceback: str = ""
    # Kernels compiled with NVRTC (module docstring, "Compiling"): {"kernels": n, "seconds":
    # NVRTC time, "spills": [ptxas summary of each kernel that spills], "slow": [each kernel
    # over SLOW_COMPILE_SECONDS]}; empty when nothing was compiled.
    compiled: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CaseResult:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def tolerances(self):
        """(dtype, tol, elem_tol) per output, as a repro script's TOLERANCES."""
        return [(o["dtype"], o["tol"], o["elem_tol"]) for o in self.outputs] or None


_NORMALIZE = [
    (re.compile(r" at [A-Za-z_][\w.]*=-?\d.*$"), ""),      # where an interpreter error happened
    (re.compile(r"\b[a-zA-Z]+\d+(?=\{)"), "ID"),          # iter domain names: iS37{i2}
    (re.compile(r"\bT\d+"), "T#"),                       # tensor names
    (re.compile(r"\b[ib]\d+\b"), "i#"),                  # extent symbols
    (re.compile(r"\bfuzz_\d+_\d+\w*"), "fuzz_#"),        # fusion and kernel names
    (re.compile(r"0x[0-9a-f]+"), "#"),
    (re.compile(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b"), "#"),   # numbers
    (re.compile(r"\(([#, ]+)\)"), "(#)"),                # tuples of numbers
    (re.compile(r"\[([#, ]+)\]"), "[#]"),
    (re.compile(r"\s+"), " "),
]


# Scheduler refusals that only say "this fusion is not my kind" (no reductions for a reduction
# scheduler, ...): left out of a fallback's signature, which keeps the refusals that matter.
GENERIC_REFUSALS = (
    "no reductions", "the fusion has reductions",
    "needs both row and column reductions of the same rows",
    "no reduction result is broadcast back over the row (a plain reduction)",
    "no reduction result is broadcast back over the reduced dims",
    "is broadcast back to the reduced shape (a normalization)",
    "reductions that are neither row nor column reductions of a 2D domain",
)


def fallback_signature(choice) -> str:
    """A short, countable reason for 'no scheduler takes the whole fusion': the refusals of
    the schedulers whose kind of fusion this is."""
    kept = [(n, w) for n, w in choice.rejected if not any(g in w for g in GENERIC_REFUSALS)]
    return "no scheduler: " + "; ".join(f"{n}: {normalize(w)}" for n, w in (kept or choice.rejected))


# The first error NVRTC reports, in a CompileError's log ("k.cu(12): error: ...").
_NVRTC_ERROR = re.compile(r"\.cu\(\d+\): (?:catastrophic )?error: (.*)")


def error_signature(message: str) -> str:
    """normalize(message), where a CompileError's generic first line ("NVRTC failed to compile
    kernel ...") is followed by NVRTC's first error, so that compile failures group by cause
    (an ambiguous overload, a missing conversion) rather than by scheduler only."""
    sig = normalize(message)
    if "CompileError: NVRTC failed" not in sig:
        return sig
    m = _NVRTC_ERROR.search(message)
    if m is None:
        return sig
    head = sig[:sig.index("CompileError: ") + len("CompileError: ")]
    return normalize(f"{head}NVRTC: {m.group(1)})")


def normalize(message: str, limit: int = 240) -> str:
    """A message with names and numbers replaced by placeholders, so that messages from the
    same cause compare equal."""
    text = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, repl in _NORMALIZE:
        text = pattern.sub(repl, text)
    return text[:limit]


# Tolerances --------------------------------------------------------------------------------------
class _SerialSumEvaluator(ReferenceEvaluator):
    """The reference evaluator in the fusion's own dtypes, with floating sums accumulated
    serially left to right in float32, float64 sums in float64 (the kernels' accumulators: the
    worst summation order a kernel may use). A float64 sum that cancels (sum(cat([x, -x])),
    fuzz 20263006:736) is as far from the float64 reference in any other order."""

    def _reduce(self, e, x, od):
        if e.op != ReductionOpType.Sum or not od.is_floating_point:
            return super()._reduce(e, x, od)
        out = e.outputs[0]
        root = out.domain.maybe_root
        if out.domain.root is not None and out.domain.logical != out.domain.root:
            return super()._reduce(e, x, od)
        dims = [k for k, i in enumerate(root) if i.is_reduction]
        if not dims:
            return super()._reduce(e, x, od)
        kept = [k for k in range(x.dim()) if k not in dims]
        wide = od == torch.float64
        acc_t, acc_np = (torch.float64, np.float64) if wide else (torch.float32, np.float32)
        xp = x.to(acc_t).permute(kept + dims)
        lead = xp.shape[:len(kept)]
        flat = xp.reshape(*lead, -1).numpy()
        if flat.shape[-1] == 0:
            acc = np.zeros(flat.shape[:-1], dtype=acc_np)
        else:
            acc = np.add.accumulate(flat, axis=-1, dtype=acc_np)[..., -1]
        return torch.from_numpy(np.ascontiguousarray(acc)).reshape(lead).to(od)


class _PerturbedEvaluator(ReferenceEvaluator):
    """The float64 reference with the result of each op that a kernel may round otherwise than
    torch multiplied by 1 +- u of its dtype, the sign drawn per element from a fixed seed
    (module docstring, e_perturbed)."""

    # Correctly rounded in torch and in a kernel alike (add, sub, mul, casts, selections, data
    # movement): the native evaluation already has their roundings, bit for bit.
    _ROUNDED_UNARY = (UnaryOpType.Exp, UnaryOpType.Exp2, UnaryOpType.Log, UnaryOpType.Sqrt,
                      UnaryOpType.Rsqrt, UnaryOpType.Reciprocal, UnaryOpType.Tanh,
                      UnaryOpType.Sigmoid, UnaryOpType.Erf, UnaryOpType.Silu,
                      UnaryOpType.GeluTanh, UnaryOpType.GeluErf)
    # A division may be a multiplication by a reciprocal (runtime option
    # shared_divisor_quotients); pow is exp2(y log2 x).
    _ROUNDED_BINARY = (BinaryOpType.Div, BinaryOpType.Pow)

    def __init__(self, fusion, seed: int = 0):
        super().__init__(fusion, promote_to_double=True)
        self._generator = torch.Generator().manual_seed(seed)

    def _rounds(self, e) -> bool:
        if isinstance(e, UnaryOp):
            return e.op in self._ROUNDED_UNARY
        if isinstance(e, BinaryOp):
            return e.op in self._ROUNDED_BINARY
        if isinstance(e, ReductionOp):                   # in another order
            return e.op == ReductionOpType.Sum
        return isinstance(e, (MatmulOp, LinearOp, ScanOp, ScatterOp))

    def _eval(self, e, env) -> None:
        super()._eval(e, env)
        if not self._rounds(e):
            return
        for o in e.outputs:
            x = env.get(o)
            if not (isinstance(o, TensorView) and o.dtype.is_floating and not o.dtype.is_float8
                    and isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
                continue
            sign = torch.randint(0, 2, x.shape, generator=self._generator).to(x.dtype) * 2 - 1
            env[o] = x * (1 + _unit_roundoff(o.dtype) * sign)


def _compare(o: torch.Tensor, r: torch.Tensor) -> dict:
    """Norm-relative and element errors of `o` against `r` over finite elements, and the
    count of NaN/inf positions that differ."""
    od, rd = o.detach().double().cpu(), r.detach().double().cpu()
    nan = od.isnan() != rd.isnan()
    inf = (od.isinf() | rd.isinf()) & (od != rd) & ~(od.isnan() | rd.isnan())
    fin = od.isfinite() & rd.isfinite()
    d, rf = (od - rd)[fin], rd[fin]
    rnorm = rf.norm().item() if rf.numel() else 0.0
    dnorm = d.norm().item() if d.numel() else 0.0
    err = dnorm / rnorm if rnorm > 0 else dnorm
    if d.numel():
        scale = rf.abs() + rf.pow(2).mean().sqrt()
        elem = (d.abs() / scale.clamp_min(1e-30)).max().item()
    else:
        elem = 0.0
    unwritten = int((od.isnan() & ~rd.isnan()).sum())
    return {"err": err, "elem": elem, "positions": int(nan.sum() + inf.sum()),
            "unwritten": unwritten}


def tolerance(dtype, measured: list, narrowest=None, perturbed: dict | None = None) -> tuple:
    """(tol, elem_tol) of a floating output of `dtype` computed from tensors whose narrowest
    floating dtype is `narrowest`, given the errors (_compare's dicts, None where a measure
    could not run) of the native and serial evaluations (`measured`) and the largest of the
    perturbed ones (module docstring: how and why); None, None for integers and bools."""
    if not dtype.is_floating:
        return None, None
    measured = [m for m in measured if m]
    pert_err, pert_elem = (perturbed["err"], perturbed["elem"]) if perturbed else (0.0, 0.0)
    roundoff = _unit_roundoff(narrowest) if narrowest is not None else 0.0
    tol = max(TOLERANCE[dtype], NATIVE_MARGIN * max([m["err"] for m in measured] + [0.0]),
              PERTURBED_MARGIN * pert_err, NATIVE_MARGIN * roundoff)
    elem = NATIVE_MARGIN * max([m["elem"] for m in measured] + [0.0])
    return tol, max(ELEMENT_FACTOR * tol, elem, PERTURBED_MARGIN * pert_elem)


def _unit_roundoff(dtype) -> float:
    return float(torch.finfo(to_torch(dtype)).eps) / 2


def _narrowest_float_upstream(fusion, out):
    """The floating dtype of fewest mantissa bits among `out` and the tensors it is computed
    from that the kernel rounds and the float64 reference does not; None when there is none.
    Inputs are exact in both (a bf16 or float8 input's values are the reference's), and a
    float8 tensor computed in the fusion is rounded by the reference too (as torch converts):
    neither loosens the bar."""
    seen, stack, best = set(), [out], None
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        rounded = t.definition is not None and not t.dtype.is_float8
        if rounded and t.dtype.is_floating and (
                best is None or _unit_roundoff(t.dtype) > _unit_roundoff(best)):
            best = t.dtype
        stack.extend(fusion.producers(t))
    return best


def _has_float_sum(fusion) -> bool:
    return any(isinstance(e, ReductionOp) and e.op == ReductionOpType.Sum
               and e.outputs[0].dtype.is_floating for e in fusion.exprs())


def expectations(fd, inputs) -> list[dict]:
    """Per output: the float64 reference and its tolerances (with what they were made of)."""
    cpu_inputs = [x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs]
    bindings = check_inputs(fd.fusion, cpu_inputs)
    # Every entry of fusion.outputs, in-place ones included (nothing written into the inputs).
    refs = evaluate(fd.fusion, cpu_inputs, promote_to_double=True, extent_bindings=bindings,
                    all_outputs=True)
    try:
        natives = evaluate(fd.fusion, cpu_inputs, extent_bindings=bindings, all_outputs=True)
    except Exception:                     # a torch op without this dtype on the CPU: no term
        natives = [None] * len(refs)
    serials = [None] * len(refs)
    if _has_float_sum(fd.fusion):
        try:
            serials = _SerialSumEvaluator(fd.fusion).run(cpu_inputs, bindings)
        except Exception:                 # as above: the bar keeps its other terms
            pass
    try:
        draws = [_PerturbedEvaluator(fd.fusion, seed).run(cpu_inputs, bindings)
                 for seed in range(PERTURBED_DRAWS)]
    except Exception:                     # as above
        draws = [[None] * len(refs)]
    out = []
    for k, (o, r, nat, ser) in enumerate(zip(fd.fusion.outputs, refs, natives, serials)):
        n, s = (_compare(x, r) if x is not None and o.dtype.is_floating else None
                for x in (nat, ser))
        p = None
        if o.dtype.is_floating:
            ps = [_compare(d[k], r) for d in draws if d[k] is not None]
            p = {key: max(c[key] for c in ps) for key in ("err", "elem")} if ps else None
        tol, elem_tol = tolerance(o.dtype, [n, s], _narrowest_float_upstream(fd.fusion, o), p)
        out.append({"ref": r, "dtype": str(o.dtype), "tol": tol, "elem_tol": elem_tol,
                    "native_err": n and n["err"], "serial_err": s and s["err"],
                    "perturbed_err": p and p["err"],
                    "native_positions": n["positions"] if n else 0})
    return out


def all_outputs(fd, inputs, returned) -> list:
    """One tensor per entry of fd.fusion.outputs after execute: the returned outputs, and for an
    in-place output that execute does not return, the input it was written into."""
    fusion = fd.fusion
    returned = iter(returned)
    return [inputs[fusion.output_aliases[k]] if k in fusion.hidden_outputs else next(returned)
            for k in range(len(fusion.outputs))]


def judge(fd, outs, expect) -> tuple[str, list, str]:
    """(category among right / wrong / ill_conditioned, per-output details, message). `outs`:
    one tensor per entry of fd.fusion.outputs (all_outputs)."""
    details, problems, ill = [], [], False
    for k, (o, e) in enumerate(zip(outs, expect)):
        v = fd.fusion.outputs[k]
        r = e["ref"]
        info = {key: e[key] for key in ("dtype", "tol", "elem_tol", "native_err", "serial_err")}
        bad = []
        if from_torch(o.dtype) != v.dtype:
            bad.append(f"dtype {str(o.dtype).removeprefix('torch.')}, expected {e['dtype']}")
        if tuple(o.shape) != tuple(r.shape):
            bad.append(f"shape {tuple(o.shape)}, expected {tuple(r.shape)}")
        else:
            want = output_strides(v, list(r.shape))
            in_input = k in fd.fusion.hidden_outputs      # the input's storage and strides
            if not in_input and any(s != w for s, w, n in zip(o.stride(), want, r.shape)
                                    if n > 1):
                bad.append(f"strides {tuple(o.stride())}, expected {tuple(want)}")
            if e["tol"] is None:
                diff = int((o.detach().cpu().double() != r.double()).sum()) if r.numel() else 0
                info["mismatches"] = diff
                if diff:
                    bad.append(f"{diff} of {r.numel()} elements differ (exact dtype)")
            else:
                c = _compare(o, r)
                info.update(err=c["err"], elem=c["elem"], positions=c["positions"])
                if c["unwritten"]:
                    bad.append(f"{c['unwritten']} of {r.numel()} elements unwritten (NaN where "
                               "the reference is finite)")
                if c["positions"] > c["unwritten"]:
                    bad.append(f"NaN/inf positions differ at {c['positions'] - c['unwritten']} "
                               f"of {r.numel()} elements")
                if c["err"] > e["tol"] or c["elem"] > e["elem_tol"]:
                    bad.append(f"relative error {c['err']:.3e} (tolerance {e['tol']:.1e}), "
                               f"largest element error {c['elem']:.3e} (tolerance "
                               f"{e['elem_tol']:.1e})")
                if bad and e["native_positions"]:
                    ill = True
        info["problems"] = bad
        info["expanded"] = any(i.is_broadcast and i.expanded_extent is not None
                               for i in v.domain.logical_no_reductions)
        details.append(info)
        if bad:
            problems.append(f"output {k} ({e['dtype']}, shape {tuple(r.shape)}): " + "; ".join(bad))
    if not problems:
        return "right", details, ""
    return ("ill_conditioned" if ill else "wrong"), details, " | ".join(problems)


def _wrong_signature(details) -> str:
    """What went wrong, without the numbers: which kinds of problems, on which dtypes (and
    whether the output has expanded broadcast dims, a common factor)."""
    kinds = []
    for d in details:
        for p in d["problems"]:
            kind = p.split(" ")[0]
            if p.startswith("NaN"):
                kind = "nan/inf positions"
            elif "unwritten" in p:
                kind = "unwritten elements"
            elif p.startswith("relative error") or "elements differ" in p:
                kind = "values"
            kinds.append(f"{kind} ({d['dtype']}{', expanded dims' if d.get('expanded') else ''})")
    return "wrong " + ", ".join(sorted(set(kinds)))


# Running -----------------------------------------------------------------------------------------
# What a kernel's bad access looks like once the driver reports it (torch's RuntimeError or
# cuda-bindings' error names); such an error also leaves the process's CUDA context unusable.
_ILLEGAL = re.compile(r"illegal (memory )?access|illegal address|misaligned address|unspecified "
                      r"launch failure|ILLEGAL_ADDRESS|MISALIGNED_ADDRESS|LAUNCH_FAILED|"
                      r"ILLEGAL_INSTRUCTION|hardware stack error|HARDWARE_STACK_ERROR", re.IGNORECASE)
_CUDA = re.compile(r"CUDA|cuda", re.IGNORECASE)


def _context_alive() -> bool:
    """Whether CUDA still works in this process after an error."""
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:                     # any failure means the context is gone
        return False


def _gpu_error(res, t0, e, where: str):
    """The result for an exception on the GPU backend: an illegal access when the driver says
    so, else an internal error; `run` says "context lost" when CUDA no longer works here."""
    text = f"{type(e).__name__}: {e}"
    lost = not _context_alive()
    if lost:
        res.run = "context lost"
    category = "illegal_access" if (_ILLEGAL.search(text) or (lost and _CUDA.search(text))) \
        else "internal_error"
    return _done(res, t0, category, f"{where}{text}", traceback.format_exc())


def execute_options(spec: dict, backend: str) -> dict:
    """fd.execute's options for a case: the backend's, plus the features the spec forces."""
    forced = spec.get("options", {})
    # verify_kernel_ir: a kernel IR a pass left wrong fails there (an internal error naming the
    # pass), not only where its kernel computes a wrong number; it costs no measurable time.
    enable = (["poison_outputs", "verify_kernel_ir"] if backend == "gpu"
              else ["interpret", "poison_outputs", "verify_kernel_ir"])
    out = {"enable": enable + list(forced.get("enable", []))}
    if forced.get("disable"):
        out["disable"] = list(forced["disable"])
    return out


# A kernel whose NVRTC compile takes longer is listed in the summary (a user's first call waits
# for it; ptxas took 125 s on a ping-pong epilogue with powf inline, fuzz case 20263601:1).
SLOW_COMPILE_SECONDS = 20.0


def compile_kernels(fd) -> tuple[dict, str]:
    """Compile with NVRTC every kernel the last execute() ran that is not compiled yet (module
    docstring, "Compiling"). Returns (CaseResult.compiled, the first CompileError as "Type:
    message", or "")."""
    from pyfuser.runtime.fusion_kernel import compile_kernel
    from pyfuser.runtime.nvrtc import CompileError
    info = {"kernels": 0, "seconds": 0.0, "spills": [], "slow": []}
    error = ""
    for fk in fd.kernels(last_run=True):
        if fk.module is None:
            t = time.perf_counter()
            try:
                compile_kernel(fk)
            except CompileError as e:
                error = error or f"CompileError: {e}"
                continue
            finally:
                seconds = time.perf_counter() - t
                info["seconds"] = round(info["seconds"] + seconds, 3)
                if seconds > SLOW_COMPILE_SECONDS:
                    info["slow"].append(f"{fk.name}: {seconds:.0f} s of NVRTC")
        info["kernels"] += 1
        if fk.module.ptxas.has_spills:
            info["spills"].append(fk.module.ptxas.summary())
    return info, error


def run_case(spec: dict, backend: str = "interpret", compile: bool = False) -> CaseResult:
    """Run and judge one case (module docstring). On the GPU, a CUDA error is returned as an
    illegal_access result whose `run` field says "context lost". `compile`: also compile the
    interpreted kernels with NVRTC (module docstring, "Compiling")."""
    from pyfuser.schedule.logsumexp import fuse_logsumexp
    from pyfuser.schedule.schedulers import registry

    device = "cuda" if backend == "gpu" else "cpu"
    res = CaseResult(spec["id"], spec["pattern"], "right", backend=backend)
    t0 = time.perf_counter()
    try:
        try:
            fd, inputs = materialize(spec, device)
        except (FusionDefinitionError, ShapeError) as e:
            return _done(res, t0, "definition_error", f"{type(e).__name__}: {e}")
        except Exception as e:            # the frontend crashed instead of refusing: a bug
            return _done(res, t0, "internal_error", f"frontend: {type(e).__name__}: {e}",
                         traceback.format_exc())
        choice = None
        try:
            # As the executor plans it: on the one-pass logsumexp rewrite of the fusion.
            choice = registry.choose(fuse_logsumexp(fd.fusion))
            res.scheduler = choice.scheduler.NAME if choice.scheduler is not None else ""
        except Exception as e:            # a scheduler's can_schedule crashed: a bug
            return _done(res, t0, "internal_error", f"registry.choose: {type(e).__name__}: {e}",
                         traceback.format_exc())
        options = execute_options(spec, backend)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FallbackWarning)
                outs = fd.execute(inputs, options=options)
                if backend == "gpu":
                    torch.cuda.synchronize()
        except InputError as e:
            return _done(res, t0, "definition_error", f"InputError: {e}")
        except InterpreterError as e:
            if "too many to interpret" in str(e):
                return _done(res, t0, "interpreter_limit", f"{e}")
            return _done(res, t0, "illegal_access", f"InterpreterError: {e}",
                         traceback.format_exc())
        except Exception as e:            # anything else out of execute is pyfuser's
            if backend == "gpu":
                return _gpu_error(res, t0, e, "execute: ")
            return _done(res, t0, "internal_error", f"execute: {type(e).__name__}: {e}",
                         traceback.format_exc())
        run = fd.last_run
        res.run = repr(run)
        # The reference runs on CPU copies made like the inputs (same values and layouts),
        # made again where execute wrote in-place outputs into the inputs.
        outs = all_outputs(fd, inputs, outs)
        fresh = backend == "gpu" or bool(fd.fusion.output_aliases)
        cpu_inputs = materialize(spec, "cpu")[1] if fresh else inputs
        try:
            expect = expectations(fd, cpu_inputs)
        except Exception as e:            # noqa: BLE001 - the oracle itself failed: a pyfuser bug
            return _done(res, t0, "internal_error", f"reference evaluator: {type(e).__name__}: "
                         f"{e}", traceback.format_exc())
        try:
            category, details, message = judge(fd, outs, expect)
        except Exception as e:            # on the GPU, a late CUDA error surfaces here
            if backend == "gpu":
                return _gpu_error(res, t0, e, "reading the outputs: ")
            raise
        res.outputs = details
        compile_error = ""
        if run.kind == "kernels" and (compile or backend == "gpu"):
            res.compiled, compile_error = compile_kernels(fd)
        if compile_error:
            # Worded as the executor words a compile failure on the GPU, so that both backends
            # group it alike.
            what = f"internal error in the {res.scheduler} scheduler's kernel ({compile_error})"
            if category == "wrong":
                message += f" | and {what}"
            else:
                return _done(res, t0, "internal_error", what)
        if run.kind == "reference":
            if run.internal_error:
                return _done(res, t0, "internal_error", run.reason, run.traceback)
            # The reference evaluator's own outputs are judged too (a mismatch there is an
            # evaluator bug): it shows in the message.
            extra = f" (its outputs: {message})" if category != "right" else ""
            if choice is not None and choice.scheduler is None:
                res.signature = fallback_signature(choice)
                return _done(res, t0, "reference_fallback", run.reason + extra,
                             keep_signature=True)
            res.signature = normalize(run.reason)
            return _done(res, t0, "reference_fallback", run.reason + extra, keep_signature=True)
        if (category == "right" and backend == "gpu" and fd._no_rng
                and fd._executor.guarded_call is not None):
            # A second call with the first's signature and options takes the guarded call
            # (runtime/call_guard.py): it must be as right on inputs of its own.
            category, details, message = _second_call(fd, spec, options, expect)
            if category != "right":
                message = f"second call (guarded): {message}"
        if category == "right":
            return _done(res, t0, "right", "")
        res.signature = f"{res.scheduler}: " + _wrong_signature(details)
        return _done(res, t0, category, message, keep_signature=True)
    except Exception as e:                # a bug of the checker: reported, not raised
        return _done(res, t0, "internal_error", f"fuzz checker: {type(e).__name__}: {e}",
                     traceback.format_exc())


def _second_call(fd, spec: dict, options: dict, expect) -> tuple:
    """judge()'s verdict on a second execute of the case, on new tensors of the same values
    and layouts, with the same options (one Options object: the guarded call serves it)."""
    inputs = materialize(spec, "cuda")[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        outs = fd.execute(inputs, options=options)
    torch.cuda.synchronize()
    return judge(fd, all_outputs(fd, inputs, outs), expect)


def _done(res: CaseResult, t0: float, category: str, message: str, tb: str = "",
          keep_signature: bool = False) -> CaseResult:
    res.category = category
    res.message = message
    res.traceback = tb
    if not keep_signature:
        res.signature = error_signature(message)
    res.seconds = round(time.perf_counter() - t0, 3)
    return res


