"""fd.explain over fixed-seed fuzz cases at a GPU run's element budget, on the H200 table.

explain plans a call as execute() would, without a GPU, so it can check the cases the CPU
interpreter cannot run (inputs of millions of elements, the heuristics' large-shape branches).
Any exception but a user error is a bug: explain must plan what execute() runs. Cases it found:
5:79 of the reduction pattern (a late refusal by the transpose schedule, which explain did not
re-plan) and 8:821 (a call with 0 rows, which explain did not specialize as execute() does)."""
import pytest

from fuzz import gen
from fuzz.build import definition_source, materialize
from pyfuser import InputError
from pyfuser.frontend.ops import FusionDefinitionError

GPU_MAX_ELEMENTS = 4 * 1024 * 1024      # tools/gpu_fuzz.sh's budget in the GPU runs
EXPLAIN_SEED = 11
EXPLAIN_COUNT = 150
FOUND = [(5, 79, "reduction"), (8, 821, None)]


def _explain(seed: int, index: int, pattern=None):
    spec = gen.generate(seed, index, max_elements=GPU_MAX_ELEMENTS, pattern=pattern)
    fd, inputs = materialize(spec, "cpu")
    try:
        fd.explain(inputs, device="h200")
    except (InputError, FusionDefinitionError):
        pass                             # the generator's call is wrong: not explain's bug
    except Exception as e:               # noqa: BLE001 - anything else is a pyfuser bug
        pytest.fail(f"explain of fuzz case {seed}:{index} raised {type(e).__name__}: {e}\n"
                    f"{definition_source(spec)}")


@pytest.mark.parametrize("seed,index,pattern", FOUND, ids=[f"{s}:{k}" for s, k, _ in FOUND])
def test_explain_of_cases_it_raised_on(seed, index, pattern):
    _explain(seed, index, pattern)


def test_explain_of_a_fixed_sample_raises_no_internal_error():
    for index in range(EXPLAIN_COUNT):
        _explain(EXPLAIN_SEED, index)
