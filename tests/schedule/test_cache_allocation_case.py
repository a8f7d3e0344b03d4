"""The allocation-domain case of issue 3, item 6, exactly as written there.

T0: logical (b0{1}, i1{4096}, i2{4096}), allocation (i1, b0, i2), contiguity (t, n, t).
C = cache_after(T0) in shared memory inherits that allocation. Then on C: split i1 by 2 (inner)
-> (i1o{2048}, i1i{2}); split i1o by 132 (inner) -> (i1oo{16}, i1oi{132}), i1oi on BIDy; split
i1oo by 2 (inner) -> (i1ooo{8}, i1ooi{2}); loop (i1oi{132}, i1ooo{8}, i1ooi{2}, i1i{2}, b0{1},
i2{4096}); compute-at position 2. C's allocation must be (i1ooi{2}, i1i{2}, b0{1}, i2{4096}), and
no allocation lowering can see names i1.
"""
import pytest

from pyfuser import DataType, FusionDefinition
from pyfuser.ir import MemoryType, ParallelType
from pyfuser.ir.printer import tv_transforms_str
from pyfuser.ir.verifier import verify
from pyfuser.schedule import cache_after, inline_at, parallelize_like, propagate_transforms


def _define():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([1, 4096, 4096], contiguity=[True, None, True],
                              dtype=DataType.Float, stride_order=[1, 2, 0])
        fd.add_output(fd.ops.exp(t0))
    return fd, t0


def _schedule(memory_type=MemoryType.Shared, i2_first=False):
    fd, t0 = _define()
    b0_t, i1_t, i2_t = t0.logical
    assert t0.domain.allocation == [i1_t, b0_t, i2_t]
    assert t0.domain.contiguity == [True, None, True]

    c = cache_after(t0, memory_type=memory_type)
    b0, i1, i2 = c.logical
    assert c.memory_type == memory_type
    assert c.domain.allocation == [i1, b0, i2]          # inherited, in C's own IDs
    assert c.domain.contiguity == [True, None, True]

    c.split(1, 2)                                       # (b0, i1o, i1i, i2)
    i1o, i1i = c.loop[1], c.loop[2]
    c.split(1, 132)                                     # (b0, i1oo, i1oi, i1i, i2)
    i1oo, i1oi = c.loop[1], c.loop[2]
    c.split(1, 2)                                       # (b0, i1ooo, i1ooi, i1oi, i1i, i2)
    i1ooo, i1ooi = c.loop[1], c.loop[2]
    assert [x.const_extent for x in (i1o, i1i, i1oo, i1oi, i1ooo, i1ooi)] == [2048, 2, 16, 132,
                                                                               8, 2]
    if i2_first:
        c.reorder([3, 1, 5, 2, 4, 0])
        assert c.loop == [i1oi, i1ooo, i2, i1ooi, i1i, b0]
    else:
        c.reorder([3, 1, 2, 4, 0, 5])
        assert c.loop == [i1oi, i1ooo, i1ooi, i1i, b0, i2]
    assert [x.const_extent for x in c.loop] == ([132, 8, 4096, 2, 2, 1] if i2_first
                                                else [132, 8, 2, 2, 1, 4096])
    c.parallelize(0, ParallelType.BIDy)

    # Before inlining, every loop ID is allocated, ordered as T0's allocation orders their origins.
    assert c.allocation_domain == [i1oi, i1ooo, i1ooi, i1i, b0, i2]

    propagate_transforms(c)
    parallelize_like(c)
    inline_at(c, 2)
    assert c.compute_at_pos == 2
    return fd, t0, c, dict(b0=b0, i1=i1, i2=i2, i1o=i1o, i1i=i1i, i1oo=i1oo, i1oi=i1oi,
                           i1ooo=i1ooo, i1ooi=i1ooi)


def _check_no_stale_ids(fd, c, ids):
    stale = {ids["i1"], ids["i1o"], ids["i1oo"]}
    for tv in fd.fusion.tensors():
        alloc = tv.allocation_domain
        assert not stale & set(alloc), f"T{tv.name} allocation {alloc} names a split ID"
        if tv.memory_type != MemoryType.Global:
            assert all(i in tv.loop for i in alloc), f"T{tv.name}: {alloc} vs loop {tv.loop}"
    alloc_line = next(ln for ln in tv_transforms_str(c).splitlines() if "allocation domain" in ln)
    assert repr(ids["i1"]) not in alloc_line and repr(ids["i1ooi"]) in alloc_line


def test_issue_case_shared_memory():
    fd, t0, c, ids = _schedule()
    expected = [ids["i1ooi"], ids["i1i"], ids["b0"], ids["i2"]]
    assert c.allocation_domain == expected
    assert all(a is b for a, b in zip(c.allocation_domain, expected))
    assert [x.const_extent for x in c.allocation_domain] == [2, 2, 1, 4096]
    assert c.allocation_contiguity == [True, True, None, True]
    _check_no_stale_ids(fd, c, ids)
    # The consumer shares C's two outer loops, and got the BIDy binding.
    out = fd.fusion.outputs[0]
    assert out.max_producer_pos == 2
    assert out.loop[0].parallel_type == ParallelType.BIDy
    assert [x.const_extent for x in out.loop] == [132, 8, 2, 2, 1, 4096]
    # The input keeps its global allocation of logical IDs.
    assert t0.allocation_domain == [t0.logical[1], t0.logical[0], t0.logical[2]]
    verify(fd.fusion)


def test_issue_case_in_registers():
    fd, t0, c, ids = _schedule(MemoryType.Local)
    assert c.allocation_domain == [ids["i1ooi"], ids["i1i"], ids["b0"], ids["i2"]]
    _check_no_stale_ids(fd, c, ids)


def test_allocation_keeps_input_order_not_loop_order():
    # The loop puts i2 between the pieces of i1; the allocation still follows T0's order
    # (pieces of i1, then b0, then i2).
    fd, t0, c, ids = _schedule(i2_first=True)
    assert c.allocation_domain == [ids["i1ooi"], ids["i1i"], ids["b0"], ids["i2"]]
    _check_no_stale_ids(fd, c, ids)


@pytest.mark.parametrize("pos, expected", [
    (0, ["i1oi", "i1ooo", "i1ooi", "i1i", "b0", "i2"]),
    (1, ["i1ooo", "i1ooi", "i1i", "b0", "i2"]),
    (3, ["i1i", "b0", "i2"]),
])
def test_other_compute_at_positions(pos, expected):
    fd, t0 = _define()
    c = cache_after(t0, memory_type=MemoryType.Shared)
    b0, i1, i2 = c.logical
    c.split(1, 2)
    c.split(1, 132)
    c.split(1, 2)
    c.reorder([3, 1, 2, 4, 0, 5])
    i1oi, i1ooo, i1ooi, i1i = c.loop[:4]
    names = dict(b0=b0, i2=i2, i1oi=i1oi, i1ooo=i1ooo, i1ooi=i1ooi, i1i=i1i)
    propagate_transforms(c)
    inline_at(c, pos)
    assert c.allocation_domain == [names[n] for n in expected]
