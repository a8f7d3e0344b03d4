"""pyfuser.testing.rel_error: the comparison every GPU and interpreter test uses."""
import math

import torch

from pyfuser.testing import rel_error

NAN, INF = float("nan"), float("inf")


def test_nan_and_inf_where_the_reference_has_them_compare_equal():
    ref = torch.tensor([NAN, INF, -INF, 2.0], dtype=torch.float64)
    out = torch.tensor([NAN, INF, -INF, 2.0], dtype=torch.float32)
    assert rel_error(out, ref) == 0.0
    assert math.isclose(rel_error(torch.tensor([NAN, INF, -INF, 2.5]), ref), 0.25)


def test_nan_or_inf_anywhere_else_is_an_infinite_error():
    ref = torch.tensor([NAN, 1.0, 2.0], dtype=torch.float64)
    assert rel_error(torch.tensor([NAN, NAN, 2.0]), ref) == INF      # unwritten (poisoned)
    assert rel_error(torch.tensor([1.0, 1.0, 2.0]), ref) == INF      # a number for NaN
    assert rel_error(torch.tensor([INF, 1.0, 2.0]), ref) == INF      # inf for NaN (0/0)
    assert rel_error(torch.tensor([NAN, -INF, 2.0]),
                     torch.tensor([NAN, INF, 2.0], dtype=torch.float64)) == INF
