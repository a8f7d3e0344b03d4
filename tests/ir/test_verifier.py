"""The verifier catches broken graphs and domains."""
import pytest

from pyfuser import FusionDefinition
from pyfuser.ir import IterType, MemoryType, ParallelType
from pyfuser.ir.verifier import VerificationError, verify


def _fusion():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.exp(x)
        z = fd.ops.sum(y, [1])
        fd.add_output(z)
    return fd.fusion, x, y, z


def test_valid_fusion_passes():
    f, *_ = _fusion()
    verify(f)  # raises on failure; the cases below show it does


def test_missing_use():
    f, x, y, z = _fusion()
    x.uses.clear()
    with pytest.raises(VerificationError, match="UnaryOp is missing from the uses of its input"):
        verify(f)


def test_definition_not_pointing_back():
    f, x, y, z = _fusion()
    z.definition.outputs[0] = y
    with pytest.raises(VerificationError, match="T1's definition does not point back"):
        verify(f)


def test_dangling_tensor():
    f, x, y, z = _fusion()
    y.definition.detach()
    with pytest.raises(VerificationError, match="T1 is used but is neither an input nor computed"):
        verify(f)


def test_loop_domain_dropping_an_id():
    f, x, y, z = _fusion()
    y.domain.loop = y.domain.loop[:1]
    with pytest.raises(VerificationError, match=r"T1: loop domain does not cover \[iS3\{i1\}\]"):
        verify(f)


def test_output_in_local_memory():
    f, x, y, z = _fusion()
    z.memory_type = MemoryType.Local
    with pytest.raises(VerificationError, match="T2: fusion inputs and outputs live in global"):
        verify(f)


def test_compute_at_out_of_range():
    f, x, y, z = _fusion()
    y.compute_at_pos = 3
    with pytest.raises(VerificationError, match="T1: compute-at position 3 out of range"):
        verify(f)


def test_two_vectorized_axes():
    f, x, y, z = _fusion()
    y.split(1, 4)
    y.loop[1].parallel_type = ParallelType.Vectorize
    y.loop[2].parallel_type = ParallelType.Vectorize
    with pytest.raises(VerificationError, match="T1: more than one vectorized axis"):
        verify(f)


def test_reduction_without_reduction_ids():
    f, x, y, z = _fusion()
    z.domain.logical[1].iter_type = IterType.Iteration
    with pytest.raises(VerificationError, match="T2: a reduction output without reduction IDs"):
        verify(f)


def test_contiguity_length():
    f, x, y, z = _fusion()
    x.domain.contiguity = [True]
    with pytest.raises(VerificationError, match="T0: 1 contiguity flags for 2 allocation IDs"):
        verify(f)
