"""Checks the GPU tests and the benchmark share: run a fusion, compare with float64."""
from __future__ import annotations

from .ir.dtype import DataType, from_torch

# ||out - ref|| / ||ref|| allowed per output dtype (the bars).
TOLERANCE = {
    DataType.BFloat16: 1e-2, DataType.Half: 2e-3, DataType.Float: 1e-4, DataType.Double: 1e-10,
    DataType.Int: 0.0, DataType.Int32: 0.0, DataType.Bool: 0.0,
    # Their unit roundoff: a kernel's float32 value and the float64 one round to float8 alike
    # but where they straddle a rounding boundary (one element one ulp apart).
    DataType.Float8_e4m3fn: 2.0 ** -4, DataType.Float8_e5m2: 2.0 ** -3,
}


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 over the finite elements. NaN and +-inf must sit
    exactly where the reference has them (var of one element is NaN, as torch gives it): a
    NaN or inf anywhere else (an unwritten, poisoned element), or a number where the
    reference has none, gives inf."""
    import torch

    o, r = out.double(), ref.double().to(out.device)
    if o.shape != r.shape:
        raise AssertionError(f"shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    inf = o.isinf()
    if (not torch.equal(o.isnan(), r.isnan()) or not torch.equal(inf, r.isinf())
            or not torch.equal(o[inf], r[inf])):
        return float("inf")
    finite = o.isfinite()
    o, r = o[finite], r[finite]
    denom = r.norm().item()
    diff = (o - r).norm().item()
    return diff / denom if denom > 0 else diff


def run_and_check(fd, inputs, *, scheduler: str | tuple | None = None, kernels: int = 1,
                  options: dict | None = None, segments: tuple | None = None):
    """Execute with poisoned outputs, compare every output with the float64 reference evaluator,
    and check what ran (scheduler names, number of kernels, no reference fallback; with
    `segments`, the (kind, name) of each segment of the plan: ("kernel", "pointwise"),
    ("reference", "reference"), ...)."""
    from .runtime.inputs import check_inputs
    from .runtime.reference import evaluate

    opts = {"enable": ["poison_outputs"]}
    if options:
        for k, v in options.items():
            opts[k] = list(opts.get(k, [])) + list(v) if k in ("enable", "disable", "dump") else v
    aliases = fd.fusion.output_aliases
    # In-place outputs overwrite inputs: the reference reads the inputs as they were.
    before = [x.clone() if k in aliases.values() else x for k, x in enumerate(inputs)]
    outs = fd.execute(inputs, options=opts)
    run = fd.last_run
    if kernels:
        assert run.kind == "kernels", f"expected generated kernels, ran {run}"
        assert run.num_kernels == kernels, f"expected {kernels} kernel(s), ran {run}"
        if scheduler is not None:
            want = (scheduler,) if isinstance(scheduler, str) else tuple(scheduler)
            assert run.schedulers == want, f"expected schedulers {want}, ran {run.schedulers}"
    if segments is not None:
        ran = tuple((s.kind, s.name) for s in run.segments)
        assert ran == tuple(segments), f"expected segments {tuple(segments)}, ran {ran}"
    # Random ops without a seed: the reference draws with the seed and offset execute drew.
    before = fd.complete_inputs(before, rng_state=fd.last_rng_state, record=False)
    bindings = check_inputs(fd.fusion, before)
    every = evaluate(fd.fusion, before, promote_to_double=True, extent_bindings=bindings,
                     all_outputs=True)
    refs = [r for k, r in enumerate(every) if k not in fd.fusion.hidden_outputs]
    assert len(outs) == len(refs), f"{len(outs)} outputs returned, {len(refs)} expected"
    for k, i in aliases.items():
        tol = TOLERANCE[from_torch(inputs[i].dtype)]
        err = rel_error(inputs[i], every[k])
        assert err <= tol, (f"input {i} updated in place by output {k}: relative error "
                            f"{err:.3e} > {tol:.0e}; ran {run}")
    for k, (o, r) in enumerate(zip(outs, refs)):
        tol = TOLERANCE[from_torch(o.dtype)]
        err = rel_error(o, r)
        assert err <= tol, (f"output {k} ({o.dtype}, shape {tuple(o.shape)}): relative error "
                            f"{err:.3e} > {tol:.0e}; ran {run}")
    return outs
