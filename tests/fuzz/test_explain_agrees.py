"""explain against execute on fixed-seed fuzz cases: the kernels explain names (each refused
segment followed to the plan that replaces it) are the kernels the interpreter run launched, in
order, on the same device table. A plan explain shows but execute does not run is a bug of
either. Cases it found: 3214:151 (a split normalization: its executor names its kernels
<name>_split_...; explain gave the fusion's own name) and 3214:172 (a call specialized to its
empty outputs: <name>_nonempty_...)."""
import warnings

import pytest

from fuzz import gen
from fuzz.build import definition_source, materialize
from pyfuser import InputError
from pyfuser.frontend.ops import FusionDefinitionError

SEED, COUNT, PATTERN = 3214, 80, "normalization"
FOUND = [(3214, 151, "normalization"), (3214, 172, "normalization")]
OPTIONS = {"enable": ["interpret"], "device": "h100-4sm"}


def _agree(seed: int, index: int, pattern) -> bool:
    """Whether the case ran as kernels (False: the generator's call is wrong, or a plan of
    no kernels), asserting explain named them."""
    spec = gen.generate(seed, index, max_elements=65536, pattern=pattern)
    fd, inputs = materialize(spec, "cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fd.execute(inputs, options=OPTIONS)
    except (InputError, FusionDefinitionError):
        return False
    if fd.last_run.kind != "kernels" or not fd.last_run.kernel_names:
        return False
    said = [k.name for k in fd.explain(inputs, device=OPTIONS["device"]).kernels_run]
    assert tuple(said) == tuple(fd.last_run.kernel_names), (
        f"fuzz case {seed}:{index}: explain {said}, ran {fd.last_run.kernel_names}\n"
        f"{definition_source(spec)}")
    return True


@pytest.mark.parametrize("seed,index,pattern", FOUND, ids=[f"{s}:{k}" for s, k, _ in FOUND])
def test_explain_names_the_kernels_of_cases_it_missed(seed, index, pattern):
    assert _agree(seed, index, pattern)


def test_explain_names_the_kernels_a_fixed_sample_runs():
    ran = sum(_agree(SEED, index, PATTERN) for index in range(COUNT))
    assert ran >= COUNT // 2, f"only {ran} of {COUNT} cases ran as kernels"
