"""Segmentation decisions in the disk cache (runtime/kernel_cache.py, segmentation entries): a
new process replays the segmenter's decision instead of searching merges again, before its
kernels' disk look-ups. A "new process" is a fresh definition of the fusion and a fresh
executor; the merge search is made to fail where it must not run."""
from __future__ import annotations

import json

import pytest
import torch

from pyfuser import options as opts
from pyfuser.catalogue import CHANNELS_LAST
from pyfuser.frontend.fusion_definition import FusionDefinition
from pyfuser.runtime import device as device_mod
from pyfuser.runtime import executor, kernel_cache
from pyfuser.runtime.executor import FusionExecutorCache, _DiskDecisions, _Target
from pyfuser.runtime.inputs import check_inputs
from pyfuser.runtime.plan import SegmentedPlan
from pyfuser.schedule import segmenter
from pyfuser.schedule.schedulers import registry
from pyfuser.schedule.segmenter import SegmentationDecision, segment
from segment_testing import batchnorm_backward, refuse_full_reductions  # noqa: E402  (tests/runtime)

H100 = device_mod.DEVICE_TABLE["h100"]
OUTER_REFUSED = {"outer_persistent": "the column tiles leave most SMs idle"}


# A disk cache of each test's own (conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_cache")


def batchnorm_inputs(channels_last=False):
    x, dy = (torch.randn(3, 5, 7, 9).bfloat16() for _ in range(2))
    if channels_last:
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    return [x, dy] + [torch.rand(5) + 0.5 for _ in range(3)]


def softmax_then_column_sum() -> FusionDefinition:
    """segment_set on a softmax: a persistent kernel, then a reduction reading its result."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        mx = fd.ops.max(x, [1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(x, mx))
        y = fd.ops.segment_set(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
        fd.add_output(y)
        fd.add_output(fd.ops.sum(y, [0]))
    return fd


def full_sum_between_kernels() -> FusionDefinition:
    """relu, a full sum, a division by it: a reduction kernel then a pointwise one (a reference
    segment between pointwise ones where the reduction scheduler refuses full reductions)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        y = fd.ops.relu(x)
        fd.add_output(y)
        fd.add_output(fd.ops.div(y, fd.ops.sum(y, [0, 1])))
    return fd


class Searches:
    """Counts merge searches (segmenter._Grouping.merge_kernels) and scheduler choices."""

    def __init__(self, monkeypatch):
        self.merges = self.choices = 0
        merge, choose = segmenter._Grouping.merge_kernels, registry.choose

        def counting_merge(grouping):
            self.merges += 1
            return merge(grouping)

        def counting_choose(*a, **kw):
            self.choices += 1
            return choose(*a, **kw)
        monkeypatch.setattr(segmenter._Grouping, "merge_kernels", counting_merge)
        monkeypatch.setattr(registry, "choose", counting_choose)


def segmented(fd, exclude=None):
    """The segmentation a plan on a GPU makes: through the disk cache."""
    return segment(fd.fusion, exclude, _DiskDecisions(fd.fusion, exclude))


def decision_key(fd, exclude=None):
    """The disk key of `fd`'s decision."""
    keyed = _DiskDecisions(fd.fusion, exclude)
    keyed.recorded()
    return keyed.key


def decision_files(cache):
    return sorted(cache.glob("segmentations/*/*.json"))


# A new process -----------------------------------------------------------------------------------
@pytest.mark.parametrize("build, exclude, refuse", [
    (batchnorm_backward, None, False),
    (lambda: batchnorm_backward(CHANNELS_LAST), OUTER_REFUSED, False),
    (softmax_then_column_sum, None, False),
    (full_sum_between_kernels, None, True),
], ids=["batchnorm_bwd_nchw", "batchnorm_bwd_nhwc_outer_refused", "segment_set", "reference"])
def test_a_new_process_replays_the_decision_without_the_merge_search(monkeypatch, isolated_cache,
                                                                     build, exclude, refuse):
    if refuse:
        refuse_full_reductions(monkeypatch)
    first = segmented(build(), exclude)
    assert len(first.segments) > 1 and len(decision_files(isolated_cache)) == 1
    searches = Searches(monkeypatch)
    again = segmented(build(), exclude)
    assert searches.merges == 0
    # No choice of the whole fusion (the decision holds why none takes it), one per kernel
    # (its recorded scheduler alone) or reference group.
    assert searches.choices == sum(s.kind in ("kernel", "reference") for s in again.segments)
    assert str(again) == str(first) and again.decision == first.decision
    assert [(s.kind, s.scheduler) for s in again.segments] == \
        [(s.kind, s.scheduler) for s in first.segments]
    if refuse:
        assert "reference" in [s.kind for s in again.segments]


def test_a_replay_asks_each_kernel_group_the_scheduler_it_recorded_alone(monkeypatch,
                                                                          isolated_cache):
    """The decision records each kernel group's scheduler; a replay asks that one alone (the
    schedulers before it refused the group when it was recorded; the key holds pyfuser's
    source), so a new process pays one can_schedule per segment, not one per scheduler tried.
    One that refuses now makes the replay a miss (test_a_kernel_group_no_scheduler_...)."""
    first = segmented(batchnorm_backward())
    kernels = [s for s in first.segments if s.kind == "kernel"]
    assert first.decision.schedulers.count(None) == len(first.decision.groups) - len(kernels)
    assert sorted(n for n in first.decision.schedulers if n) == sorted(s.name for s in kernels)
    asked = []
    for sched in registry.SCHEDULERS:
        def counting(fusion, _sched=sched, _real=sched.can_schedule):
            asked.append((_sched.NAME, fusion))
            return _real(fusion)
        monkeypatch.setattr(sched, "can_schedule", counting)
    fd = batchnorm_backward()
    again = segmented(fd)
    assert str(again) == str(first)
    of_segments = [name for name, fusion in asked if fusion is not fd.fusion]
    assert of_segments == [s.name for s in again.segments if s.kind == "kernel"]


def test_recorded_schedulers_that_do_not_fit_the_groups_are_a_damaged_decision():
    good = {"exprs": 3, "forward_binary": True, "groups": [["kernel", [0, 1]], ["kernel", [2]]]}
    assert SegmentationDecision.from_json(good).schedulers == ()
    assert SegmentationDecision.from_json(dict(good, schedulers=["reduction", None])) \
        .schedulers == ("reduction", None)
    for bad in (["reduction"], ["reduction", 3], "reduction", [["reduction"], None]):
        assert SegmentationDecision.from_json(dict(good, schedulers=bad)) is None, bad


def test_a_decision_of_unary_forwarding_only_replays_as_made(monkeypatch, isolated_cache):
    """The decision holds the forwarding it was made with: groups made forwarding unary ops only
    (the search keeps them where forwarding binary ops leaves more reference segments) replay
    with x_hat a group's, not recomputed."""
    fd = batchnorm_backward()
    exprs = segmenter._tensor_exprs(fd.fusion)
    groups, segs = segmenter._grouped(fd.fusion, exprs, None, forward_binary=False)
    unary = groups.decision()
    assert not unary.forward_binary and len(segs) == 4
    kernel_cache.store_segmentation(decision_key(fd), unary.to_json())
    searches = Searches(monkeypatch)
    again = segmented(batchnorm_backward())
    assert searches.merges == 0 and again.decision == unary
    ops = lambda seg: [segmenter._expr_name(e) for e in seg.exprs]  # noqa: E731
    assert [(s.name, ops(s)) for s in again.segments] == [(s.name, ops(s)) for s in segs]
    assert len(again.forwarded) < len(segment(batchnorm_backward().fusion).forwarded)


def test_a_fusion_one_scheduler_takes_whole_replays_that_scheduler_alone(monkeypatch,
                                                                          isolated_cache):
    """The decision of a one-kernel fusion is its scheduler: a new process asks it alone (not
    every scheduler before it); one that refuses now is asked no more than that, the fusion
    then chosen for afresh and the decision written again."""
    first = segmented(batchnorm_backward(CHANNELS_LAST))
    assert [s.name for s in first.segments] == ["outer_persistent"] and first.decision is None
    files = decision_files(isolated_cache)
    assert len(files) == 1 and json.loads(files[0].read_text())["decision"]["whole"] == \
        "outer_persistent"
    asked = []
    for sched in registry.SCHEDULERS:
        def counting(fusion, _sched=sched, _real=sched.can_schedule):
            asked.append(_sched.NAME)
            return _real(fusion)
        monkeypatch.setattr(sched, "can_schedule", counting)
    again = segmented(batchnorm_backward(CHANNELS_LAST))
    assert asked == ["outer_persistent"] and str(again) == str(first)
    from pyfuser.schedule.schedulers import outer_persistent
    monkeypatch.setattr(outer_persistent, "can_schedule", lambda fusion: (False, "refused now"))
    asked.clear()
    fresh = segmented(batchnorm_backward(CHANNELS_LAST))
    assert "outer_persistent" not in [s.name for s in fresh.segments]
    assert len(asked) > 1 and json.loads(decision_files(isolated_cache)[0].read_text())[
        "decision"]["whole"] != "outer_persistent"


def test_both_executor_call_sites_use_the_disk(monkeypatch, isolated_cache):
    """execute()'s first plan (_make_plan) and its plan without a refused scheduler
    (_plan_without) segment through the disk cache: a new executor over a new definition
    searches no merge."""
    monkeypatch.setattr(executor, "_requested_device", lambda *a: torch.device("cuda", 0))
    monkeypatch.setattr(device_mod, "get_device_properties", lambda *_: H100)

    def plans():
        nchw, nhwc = batchnorm_backward(), batchnorm_backward(CHANNELS_LAST)
        ins, ins_cl = batchnorm_inputs(), batchnorm_inputs(channels_last=True)
        first = FusionExecutorCache(nchw.fusion, name="bn")._make_plan(ins, opts.current())
        without = FusionExecutorCache(nhwc.fusion, name="bn_cl")._plan_without(
            OUTER_REFUSED, ins_cl, check_inputs(nhwc.fusion, ins_cl),
            _Target(H100, torch.device("cuda", 0)), opts.current())
        return first, without

    fresh = plans()
    assert all(isinstance(p, SegmentedPlan) for p in fresh)
    assert len(decision_files(isolated_cache)) == 2
    searches = Searches(monkeypatch)
    again = plans()
    assert searches.merges == 0
    assert [str(p.segmented) for p in again] == [str(p.segmented) for p in fresh]


def test_the_split_plan_after_a_refusal_uses_the_disk(monkeypatch, isolated_cache):
    """The softmax of a transposed [4096, 8192], its outer persistent heuristic refused: the
    executor segments the fusion without it, then the split one (split_normalizations), both
    through the disk cache: a new executor over a new definition searches no merge."""
    from pyfuser.runtime.rewritten_plan import RewrittenPlan
    from pyfuser.schedule import split_normalizations
    monkeypatch.setattr(executor, "_requested_device", lambda *a: torch.device("cuda", 0))
    monkeypatch.setattr(device_mod, "get_device_properties", lambda *_: H100)
    x = torch.empty(8192, 4096, dtype=torch.bfloat16).t()
    refused = {"outer_persistent": "under a 32-byte sector"}

    def plan():
        with FusionDefinition("st") as fd:
            xf = fd.ops.cast(fd.from_pytorch(x), torch.float32)
            e = fd.ops.exp(fd.ops.sub(xf, fd.ops.max(xf, [1], keepdim=True)))
            fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
        return FusionExecutorCache(fd.fusion, name="st")._plan_without(
            refused, [x], check_inputs(fd.fusion, [x]), _Target(H100, torch.device("cuda", 0)),
            opts.current())

    fresh = plan()
    assert isinstance(fresh, RewrittenPlan) and fresh.what == split_normalizations.DESCRIPTION
    assert len(decision_files(isolated_cache)) == 2      # the fusion's and the split's
    searches = Searches(monkeypatch)
    again = plan()
    assert isinstance(again, RewrittenPlan)
    assert searches.merges == 0


def test_the_interpreter_and_explain_keep_no_decision(isolated_cache):
    """The interpreter's kernels are not on disk, nor are its segmentations; explain segments
    afresh (and writes nothing where it is asked for a plan)."""
    fd = batchnorm_backward()
    fd.execute(batchnorm_inputs(), options={"enable": ["interpret"]})
    assert fd.last_run.backend == "interpreter" and len(fd.last_run.segments) == 2
    batchnorm_backward().explain(batchnorm_inputs(), device="h100")
    assert not isolated_cache.exists() or not decision_files(isolated_cache)


# Keys ---------------------------------------------------------------------------------------------
def test_other_excluded_schedulers_miss_and_their_reasons_do_not(monkeypatch, isolated_cache):
    nhwc = lambda: batchnorm_backward(CHANNELS_LAST)  # noqa: E731
    segmented(nhwc(), OUTER_REFUSED)
    searches = Searches(monkeypatch)
    again = segmented(nhwc(), {"outer_persistent": "another call's reason"})
    assert searches.merges == 0 and "another call's reason" in again.why
    segmented(nhwc(), {**OUTER_REFUSED, "inner_outer_persistent": "refused"})
    assert searches.merges > 0 and len(decision_files(isolated_cache)) == 2


def test_a_changed_pyfuser_source_or_scheduler_list_misses(monkeypatch, isolated_cache):
    segmented(batchnorm_backward())
    searches = Searches(monkeypatch)
    monkeypatch.setattr(kernel_cache, "source_hash", lambda: "0" * 64)
    segmented(batchnorm_backward())
    assert searches.merges > 0 and len(decision_files(isolated_cache)) == 2
    monkeypatch.setattr(registry, "SCHEDULERS", [s for s in registry.SCHEDULERS
                                                 if s.NAME != "scan"])
    merges = searches.merges
    segmented(batchnorm_backward())
    assert searches.merges > merges and len(decision_files(isolated_cache)) == 3


def test_a_changed_fusion_misses(monkeypatch, isolated_cache):
    segmented(batchnorm_backward())
    searches = Searches(monkeypatch)
    segmented(batchnorm_backward(scale=0.02))
    assert searches.merges > 0 and len(decision_files(isolated_cache)) == 2


# Damaged, foreign and stale files ----------------------------------------------------------------
@pytest.mark.parametrize("damage", [
    lambda data: data[:len(data) // 2],                                  # truncated
    lambda data: b"\xff\xfe" + data,                                     # not UTF-8
    lambda data: b"[1, 2, 3]",                                           # not an entry
    lambda data: json.dumps({"key": "0" * 64, "decision": json.loads(data)["decision"]}).encode(),
    lambda data: json.dumps({"key": json.loads(data)["key"], "decision": {"groups": 3}}).encode(),
    lambda data: data.replace(b'"kernel"', b'"sideways"', 1),            # no such kind
], ids=["truncated", "not_utf8", "not_an_entry", "another_key", "not_a_decision", "bad_kind"])
def test_a_damaged_or_foreign_file_is_a_miss_and_is_overwritten(monkeypatch, isolated_cache,
                                                                damage):
    fresh = segmented(batchnorm_backward())
    (path,) = decision_files(isolated_cache)
    good = path.read_bytes()
    path.write_bytes(damage(good))
    searches = Searches(monkeypatch)
    again = segmented(batchnorm_backward())
    assert searches.merges > 0 and str(again) == str(fresh)
    assert path.read_bytes() == good


def _recorded_as(isolated_cache, change):
    """Rewrite the one decision file's decision with `change(decision JSON)`."""
    (path,) = decision_files(isolated_cache)
    entry = json.loads(path.read_text())
    change(entry["decision"])
    path.write_text(json.dumps(entry))
    return path


def _cycle(decision):
    """BatchNorm backward's sum(dy) with the subtraction of its broadcast (exprs 1 and 4), and
    the scaling and broadcast between them (2, 3) in another group: each feeds the other."""
    assert decision["exprs"] == 20
    decision["groups"] = [["kernel", [1, 4]], ["kernel", [2, 3]], ["kernel", [10, 11, 12, 13]],
                          ["kernel", [14, 15, 16, 17, 18, 19]]]


@pytest.mark.parametrize("change", [
    lambda d: d.update(exprs=d["exprs"] + 1),                       # another number of exprs
    lambda d: d["groups"][0][1].append(10 ** 6),                    # an index out of range
    lambda d: d["groups"][0][1].append(-1),                         # a negative index
    lambda d: d["groups"].pop(),                                    # exprs in no group
    lambda d: d["groups"][1][1].extend(d["groups"][0][1]),          # exprs in two groups
    lambda d: d["groups"][0][1].reverse(),                          # indices not sorted
    lambda d: d["groups"].append(["kernel", []]),                   # an empty group
    lambda d: d["groups"][0].__setitem__(0, "view"),                # a view of no reshape
    lambda d: d["groups"][0].__setitem__(0, "library"),             # a library group of kernels
    _cycle,                                                         # a cycle between groups
    lambda d: d.update(groups=[["kernel", sorted(i for _, g in d["groups"] for i in g)]]),
], ids=["expr_count", "out_of_range", "negative", "missing", "twice", "unsorted", "empty",
        "view", "library", "cycle", "one_kernel_no_scheduler_takes"])
def test_a_decision_that_no_longer_fits_is_a_miss_never_a_wrong_plan(monkeypatch, isolated_cache,
                                                                     change):
    fresh = segmented(batchnorm_backward())
    path = _recorded_as(isolated_cache, change)
    searches = Searches(monkeypatch)
    again = segmented(batchnorm_backward())
    assert searches.merges > 0 and str(again) == str(fresh)
    assert SegmentationDecision.from_json(json.loads(path.read_text())["decision"]) == \
        fresh.decision


def test_a_kernel_group_no_scheduler_takes_any_more_is_a_miss(monkeypatch, isolated_cache):
    """The decision is keyed on pyfuser's source, so only a scheduler changed in this process
    (a test's, a user's) refuses a group it took: the segmentation is searched again, and
    the group runs elsewhere."""
    fresh = segmented(full_sum_between_kernels())
    assert [s.name for s in fresh.segments] == ["reduction", "pointwise"]
    refuse_full_reductions(monkeypatch)
    searches = Searches(monkeypatch)
    again = segmented(full_sum_between_kernels())
    assert searches.merges > 0
    assert [s.name for s in again.segments] == ["pointwise", "reference", "pointwise"]
    assert str(again) == str(segment(full_sum_between_kernels().fusion))


def test_a_group_across_a_segment_set_is_a_miss(monkeypatch, isolated_cache):
    fresh = segmented(softmax_then_column_sum())
    _recorded_as(isolated_cache, lambda d: d.update(
        groups=[["reference", sorted(i for _, g in d["groups"] for i in g)]]))
    searches = Searches(monkeypatch)
    again = segmented(softmax_then_column_sum())
    assert searches.merges > 0 and str(again) == str(fresh)


# Switches and bounds -----------------------------------------------------------------------------
def test_the_disk_cache_off_writes_and_reads_nothing(monkeypatch, isolated_cache):
    segmented(batchnorm_backward())
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    searches = Searches(monkeypatch)
    segmented(batchnorm_backward())
    assert searches.merges > 0
    (path,) = decision_files(isolated_cache)
    path.unlink()
    segmented(batchnorm_backward())
    assert not decision_files(isolated_cache)


def test_decisions_count_toward_the_bound_and_are_evicted_oldest_first(monkeypatch,
                                                                       isolated_cache):
    import os
    keys = [f"{i:02d}" + "a" * 62 for i in range(3)]
    decision = {"exprs": 1, "forward_binary": True, "groups": [["kernel", [0]]]}
    for t, key in enumerate(keys):
        kernel_cache.store_segmentation(key, decision)
        os.utime(kernel_cache.segmentation_path(key), ns=(t * 10**9, t * 10**9))
    size = kernel_cache.segmentation_path(keys[0]).stat().st_size     # each one: this size
    monkeypatch.setenv("PYFUSER_CACHE_MAX_MB", str(2.5 * size / (1 << 20)))
    assert kernel_cache.load_segmentation(keys[0]) == decision     # used: now the most recent
    kernel_cache.store_segmentation(keys[1], decision)             # written: the most recent
    alive = [k for k in keys if kernel_cache.segmentation_path(k).exists()]
    assert alive == keys[:2]
