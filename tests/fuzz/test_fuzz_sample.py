"""The fuzzer's CI sample: SAMPLE_COUNT fixed-seed cases on the kernel-IR interpreter.

Each case is one test: it fails on a wrong result, an internal error, an illegal access, and
on a definition error or an ill-conditioned case (the generator's bugs: the sample is fixed,
so these only appear when the generator or the frontend changes). The failure message holds
the case's stand-alone repro script. Every SAMPLE_COMPILE_EVERY-th case (fuzz/check.py) also
compiles its kernels with NVRTC, so that CUDA text NVRTC refuses fails the sample as well.

Cases known to fail (fuzz/known_failures.py KNOWN) are strict xfails: they must still fail in
the same category (a case failing in another category is a new failure and fails the test),
and a fixed case turns the test red until its entry is removed. The constants live in
fuzz/known_failures.py; raise SAMPLE_COUNT as the interpreter gets faster, then regenerate the
list (its docstring says how).
"""
import pytest
import torch

from fuzz import gen
from fuzz.build import repro_script
from fuzz.check import FAILURES, SAMPLE_COMPILE_EVERY, run_case
from fuzz.known_failures import KNOWN, SAMPLE_COUNT, SAMPLE_MAX_ELEMENTS, SAMPLE_SEED
from fuzz.spec import case_id, parse_case_id

# What the sample refuses: pyfuser bugs, and the generator's.
REFUSED = FAILURES + ("definition_error", "ill_conditioned")


class KnownFailure(AssertionError):
    """A known case failed in its known category."""


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # The interpreter makes many small torch calls; extra torch threads only contend.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _param(cid: str):
    known = KNOWN.get(cid)
    if known is None:
        return cid
    return pytest.param(cid, marks=pytest.mark.xfail(strict=True, raises=KnownFailure,
                                                     reason=known))


@pytest.mark.parametrize("cid", [_param(case_id(SAMPLE_SEED, k)) for k in range(SAMPLE_COUNT)])
def test_fuzz_case(cid):
    seed, index = parse_case_id(cid)
    spec = gen.generate(seed, index, SAMPLE_MAX_ELEMENTS)
    compiles = index % SAMPLE_COMPILE_EVERY == 0
    res = run_case(spec, "interpret", compile=compiles)
    if res.category not in REFUSED:
        return
    known = KNOWN.get(cid)
    report = (f"fuzz case {cid} ({res.pattern}, {res.scheduler or 'no scheduler'}): "
              f"{res.category}: {res.message}\n\n"
              + repro_script(spec, "interpret", res.tolerances(), summary=res.message[:600],
                              compile=compiles))
    if known is not None and known.split(":")[0] == res.category:
        raise KnownFailure(report)
    if known is not None:
        report = f"known to fail as {known!r}, now fails as {res.category}\n" + report
    raise AssertionError(report)
