"""The segmenter: a fusion no scheduler takes whole becomes segments that some scheduler takes.

As nvFuser's: when a scheduler takes the whole fusion, it is one segment. Otherwise every tensor
expression starts as a group of its own, and neighbouring groups (a producer and a consumer)
merge while a scheduler accepts the merged group as a fusion (registry.choose, which also
separates roles and refuses reshape cycles). Merges that keep the most bytes out of global
memory go first: the bytes of the tensors between the two groups, their dtype's size times the
extents that are known (1024 for each symbolic one, so that a dim counts for more than a
dtype's size). A merge is illegal when the two groups are also connected through a third one
(the merged group would both feed and read it), and across the output of a BOUNDARY_OPS op
(fd.ops.segment_set). Two groups with reductions that read a tensor in common, neither feeding
the other, are candidates too, ranked by the bytes they share (nvFuser's horizontal merge of
reductions: BatchNorm backward's sum(dy) and sum(dy * x_hat) in one kernel).

What is left:
- groups of library ops (op_support.LIBRARY_OPS) are segments of their own, and so is a
  kernel op with a library implementation (op_support.LIBRARY_FALLBACK_OPS: a scan) that no
  scheduler takes even alone (its segment says why no kernel took it);
- a group no scheduler takes even alone runs in a reference segment, merged with its reference
  neighbours; a group of cheap ops only (broadcast, reshape, casts, ...) that no kernel
  neighbour took joins a reference neighbour rather than launching a kernel of its own.

Input forwarding (as nvFuser's, and further): cheap ops starting at fusion inputs, through
forwarded ops only, are in no group: unary ops (op_support.FORWARDED_UNARY_OPS: casts, neg,
abs, ...), broadcasts, and add / sub / mul (FORWARDED_BINARY_OPS) that read at most one
full-size tensor, the others broadcasts (x_hat = (x - mean[C]) * rstd[C]). Every segment that
reads one recomputes it from the inputs, instead of one segment writing it to global memory and
the others reading it back: amax(|x|) then x * (448 / amax) of a bf16 x reads x twice in bf16
rather than writing and reading an fp32 copy of it. A group is judged (registry.choose) with
the forwarded ops it reads prepended, so the scheduler chosen for a segment accepts it with
them; where forwarding binary ops leaves a reference segment (a scheduler refusing a group
with its copy, where it took the op's own group), the plan forwarding unary ops only is kept if
it is better.
Not forwarded: an op whose result is a fusion output, or is read by a library op (the library
call cannot recompute it); its producers still are. A forwarded op is the one op that may sit
in several segments (`SegmentedFusion.forwarded`).

Input views (as nvFuser's meta-op segments): a reshape of a dense fusion input X, directly or
through forwarded ops, is a segment of kind "view" of its own: the plan reshapes X on the host
(`torch.Tensor.view`: no kernel, no copy) and the segments reading the reshape's result read the
view and apply the forwarded ops to it (they are elementwise, so they commute with the reshape).
So is a permute of an input X (of any layout, no expanded dim) read by matmuls alone
(attention's q @ k^T: the matmul kernel's tensor maps, or cuBLAS, read any strides): the plan
permutes X on the host (`torch.Tensor.permute`) and the matmul's segment declares the view with
X's allocation order and contiguity, its dims renumbered; a permute that other ops read
(element-wise, in the permuted order) stays a transpose kernel's.
GroupNorm's reshape of cast(x) [N, C, H, W] to [N, G, C/G*H*W] had been a pointwise kernel
writing an fp32 copy of x for the statistics and the output to read; it is now x's bytes under
another shape. Forwarding starts again at a view's result. Only where the fusion is segmented:
a scheduler that takes the whole fusion reads the reshape in its kernel. Not a view: a reshape
whose result is a fusion output, or of an input that is not dense in its logical order, nor one
of forwarded ops whose result a gather, a window or a library call reads (they need it stored).

Each segment gets a sub-fusion (`Segment.fusion`), a new Fusion of its expressions whose inputs
are the tensors it reads (the original inputs keep their layout; an intermediate is a new input
of the same dtype and dims, dense in its producer's allocation order, as the plan allocates it)
and whose outputs are the tensors it writes that other segments or the caller read. Extents the
sub-fusion needs but no input tensor of it binds (the size of a reduced dim in a mean's divisor,
the sizes a reshaped intermediate is made of) become integer scalar inputs: the plan passes
their values.

Scheduling decisions here read no shapes: registry.choose is a function of the fusion.

The decision (`SegmentationDecision`): the scheduler that takes the whole fusion, or which
forwarding was kept and the final groups, as expr indices, with each kernel group's scheduler
and why no scheduler takes the whole fusion. A recorded one is replayed without asking every
scheduler and without the search (`segment(..., decisions=...)`, asked first): the executor
keeps them in the disk cache, so that a new process whose kernels are on disk does not search
again before its kernels' disk look-ups (the search builds a sub-fusion and asks every
scheduler for each candidate merge: 50-120 ms for BatchNorm or GroupNorm). A decision is
replayed only where it fits the fusion (the same number of expressions; the whole fusion's
scheduler taking it, asked alone; or the groups a partition of the grouped exprs with kinds
their ops allow, no segment_set crossed, no cycle, every kernel group taken by its recorded
scheduler, asked alone); otherwise the fusion is segmented from scratch.
"""
from __future__ import annotations

import dataclasses

from ..ir import scalar as S
from ..ir import arith
from ..ir.exprs import (BroadcastOp, GatherOp, LinearOp, LoadKind, LoadStoreOp, MatmulOp,
                        ReductionOp, ReshapeOp, WindowOp)
from ..ir.fusion import Fusion
from ..ir.scalar import Scalar
from ..ir.tensor import MemoryType, TensorDomain, TensorView
from .op_support import (BOUNDARY_OPS, LIBRARY_FALLBACK_OPS, has_library_implementation,
                         is_cheap, is_forwardable, is_forwardable_binary, segment_kind)
from .schedulers import registry

# Stand-in for a symbolic extent when ranking merges by the bytes they save.
_UNKNOWN_EXTENT = 1024


@dataclasses.dataclass(frozen=True, eq=False)
class Segment:
    """One segment of a SegmentedFusion. `exprs`, `inputs` and `outputs` are Vals of the
    original fusion: `inputs` are the tensors and scalar inputs it reads, then the extents the
    sub-fusion takes as scalar inputs (`extent_inputs` of them); `outputs` the tensors it
    writes for later segments or the caller. `fusion` is the sub-fusion (the original fusion
    itself for a whole-fusion segment), with inputs and outputs in the same order."""

    kind: str                     # "kernel", "library", "view" or "reference"
    exprs: tuple
    inputs: tuple
    outputs: tuple
    fusion: Fusion
    scheduler: object | None      # the scheduler module of a kernel segment
    why: str                      # one line: why this scheduler, or why the reference
    choice: object | None = None  # registry.Choice of a kernel segment
    extent_inputs: int = 0

    @property
    def name(self) -> str:
        """The scheduler's name, the library op's, "view" or "reference"."""
        if self.kind == "kernel":
            return self.scheduler.NAME
        if self.kind == "view":
            return "view"
        if self.kind == "library":
            # The frontend's spelling: LinearOp -> "linear", as fd.ops.linear.
            return type(self.exprs[0]).__name__.removesuffix("Op").lower()
        return "reference"


@dataclasses.dataclass(frozen=True)
class SegmentationDecision:
    """What the segmenter decided for a fusion, enough to make the same segments again without
    asking every scheduler (see the module docstring): the scheduler that takes it whole, or
    the merge search's groups."""

    exprs: int                    # how many tensor expressions the fusion has (_tensor_exprs)
    forward_binary: bool          # the forwarding kept (_forwarded's flag)
    groups: tuple                 # per final group, by first expr: (kind, sorted expr indices)
    # Per group, the name of the scheduler a kernel group's choice found (None for the others),
    # so that a replay asks that scheduler alone (registry.choose's `only`); () where unknown.
    schedulers: tuple = ()
    # The scheduler that takes the whole fusion (then no groups), or None.
    whole: str | None = None
    # Why no scheduler takes the whole fusion: the (name, why) pairs of the whole fusion's
    # Choice (its reason told again with a call's excluded schedulers: registry.refusal), or
    # the reason itself where no scheduler was asked (ops no kernel takes).
    refused: tuple = ()
    why: str = ""

    def to_json(self) -> dict:
        return {"exprs": self.exprs, "forward_binary": self.forward_binary,
                "groups": [[kind, list(members)] for kind, members in self.groups],
                "schedulers": list(self.schedulers), "whole": self.whole,
                "refused": [list(pair) for pair in self.refused], "why": self.why}

    @staticmethod
    def from_json(data) -> SegmentationDecision | None:
        """The decision `data` holds, or None where it is not one (a damaged file)."""
        try:
            exprs, forward_binary = data["exprs"], data["forward_binary"]
            groups = tuple((kind, tuple(members)) for kind, members in data["groups"])
            schedulers = tuple(data.get("schedulers", ()))
            whole, why = data.get("whole"), data.get("why", "")
            refused = tuple((name, reason) for name, reason in data.get("refused", ()))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if (type(exprs) is not int or type(forward_binary) is not bool
                or not all(type(kind) is str and all(type(k) is int for k in members)
                           for kind, members in groups)
                or len(schedulers) not in (0, len(groups))
                or not all(n is None or type(n) is str for n in schedulers)
                or not (whole is None or type(whole) is str) or type(why) is not str
                or not all(type(n) is str and type(r) is str for n, r in refused)
                or (whole is not None and groups)):
            return None
        return SegmentationDecision(exprs, forward_binary, groups, schedulers, whole, refused,
                                    why)


@dataclasses.dataclass(frozen=True, eq=False)
class SegmentedFusion:
    fusion: Fusion
    segments: tuple
    why: str                      # why one segment, or why the fusion was segmented
    # The forwarded ops (see the module docstring): recomputed by each segment reading them.
    forwarded: tuple = ()
    # The grouping, to replay; None where one scheduler takes the whole fusion (no search).
    decision: SegmentationDecision | None = None

    def __str__(self) -> str:
        lines = [f"{len(self.segments)} segment{'s' if len(self.segments) != 1 else ''}: "
                 f"{self.why}"]
        for k, s in enumerate(self.segments):
            ins = ", ".join(_val_name(v) for v in s.inputs)
            outs = ", ".join(f"T{v.name}" for v in s.outputs)
            ops = ", ".join(_expr_name(e) for e in s.exprs)
            what = s.kind if s.name == s.kind else f"{s.kind} {s.name}"
            lines.append(f"  segment {k}: {what} ({ins}) -> ({outs}) [{ops}]: {s.why}")
        if self.forwarded:
            lines.append("  forwarded (recomputed by each segment reading them): " + ", ".join(
                f"T{e.outputs[0].name} = {_expr_name(e)}" for e in self.forwarded))
        return "\n".join(lines)


def _val_name(v) -> str:
    if isinstance(v, TensorView):
        return f"T{v.name}"
    return v.symbol or S.scalar_str(v)


def _expr_name(e) -> str:
    op = getattr(e, "op", None)
    base = type(e).__name__
    return f"{base}.{op.value}" if op is not None and hasattr(op, "value") else base


def _tensor_exprs(fusion) -> list:
    return [e for e in fusion.exprs() if any(isinstance(o, TensorView) for o in e.outputs)]


def segment(fusion, exclude: dict | None = None, decisions=None) -> SegmentedFusion:
    """The segments of `fusion` in topological order (see the module docstring). `exclude`:
    schedulers not to ask (name -> why: their heuristic refused a call's shapes). `decisions`:
    where decisions are kept for this fusion and these excluded schedulers, an object with
    `recorded()` (the SegmentationDecision kept, or None) and `record(decision)`, asked first:
    a recorded decision that fits is replayed (the whole fusion's scheduler asked alone, or
    the groups made again with no scheduler asked of the whole fusion); otherwise the
    decision made here is recorded."""
    exprs = _tensor_exprs(fusion)
    boundaries = [e for e in exprs if isinstance(e, BOUNDARY_OPS)]
    recorded = decisions.recorded() if decisions is not None else None
    if recorded is not None and recorded.whole is not None:
        replayed = _whole_replayed(fusion, exprs, exclude, recorded, boundaries)
        if replayed is not None:
            return replayed
        recorded = None
    found = _replayed(fusion, exprs, exclude, recorded) if recorded is not None else None
    if boundaries:
        why = "segment_set ends a segment at " + ", ".join(
            f"T{e.outputs[0].name}" for e in boundaries)
        refused = ()
    elif found is not None:
        why = registry.refusal(recorded.refused, exclude) if recorded.refused else recorded.why
        refused = recorded.refused
    else:
        choice = registry.choose(fusion, exclude)
        if choice.scheduler is not None:
            if decisions is not None:
                decisions.record(SegmentationDecision(len(exprs), False, (),
                                                      whole=choice.scheduler.NAME))
            return SegmentedFusion(fusion, (_whole(fusion, exprs, "kernel", choice),),
                                   choice.reason)
        why = choice.reason
        refused = choice.rejected
    groups, segs = found or _searched(fusion, exprs, exclude)
    decision = dataclasses.replace(groups.decision(), refused=tuple(refused),
                                   why="" if refused else why)
    if found is None and decisions is not None:
        decisions.record(decision)
    if len(segs) == 1 and segs[0].kind == "reference":
        return SegmentedFusion(fusion, (_whole(fusion, exprs, "reference", None, why),), why,
                               decision=decision)
    forwarded = tuple(e for e in exprs if any(e in s.exprs for s in segs)
                      and groups.index[e] in groups.forwarded)
    return SegmentedFusion(fusion, tuple(segs), why, forwarded, decision)


def _whole_replayed(fusion, exprs, exclude, recorded, boundaries) -> SegmentedFusion | None:
    """The one segment of a fusion `recorded` says a scheduler takes whole, that scheduler
    asked alone; None where it does not fit (another expression count, a segment_set, the
    scheduler refusing now)."""
    if recorded.exprs != len(exprs) or boundaries:
        return None
    choice = registry.choose(fusion, exclude, only=recorded.whole)
    if choice.scheduler is None:
        return None
    return SegmentedFusion(fusion, (_whole(fusion, exprs, "kernel", choice),), choice.reason)


def _searched(fusion, exprs, exclude):
    """The grouping of the merge search and its segments."""
    groups, segs = _grouped(fusion, exprs, exclude, forward_binary=True)
    if groups.forwarded_binary and any(s.kind == "reference" for s in segs):
        # Forwarded ops are recomputed in every group reading them, which a scheduler may
        # refuse where it took the op's group alone (an add of a [M, 1] input before a sum the
        # reduction scheduler cannot replay onto that input): that group is left to the
        # reference. The plan forwarding unary ops only, if it has fewer reference segments
        # or fewer segments. (Only then: segmenting again doubles the cost of a plan, which
        # a new process pays where its decision is not on disk yet.)
        alt_groups, alt = _grouped(fusion, exprs, exclude, forward_binary=False)
        if _plan_cost(alt) < _plan_cost(segs):
            return alt_groups, alt
    return groups, segs


def _grouped(fusion, exprs, exclude, forward_binary: bool):
    groups = _Grouping(fusion, exprs, exclude, forward_binary)
    groups.merge_kernels()
    groups.settle_leftovers()
    return groups, groups.segments()


def _replayed(fusion, exprs, exclude, decision: SegmentationDecision):
    """The grouping `decision` records and its segments, or None where it does not fit
    `fusion` (see the module docstring), so that a decision replayed is a valid plan."""
    if decision.exprs != len(exprs):
        return None
    groups = _Grouping(fusion, exprs, exclude, decision.forward_binary)
    if not groups.take(decision.groups, decision.schedulers):
        return None
    segs = groups.segments()
    if any(s.kind == "kernel" and s.scheduler is None for s in segs):
        return None
    return groups, segs


def _plan_cost(segs) -> tuple:
    """Reference segments, then segments: the plan of two segmentations to keep."""
    return sum(s.kind == "reference" for s in segs), len(segs)


def _forwarded(fusion, exprs, forward_binary: bool = True) -> tuple[set, dict]:
    """Indices in `exprs` of the forwarded ops, and the input views: index of the reshape ->
    the fusion input it views (see the module docstring)."""
    reads = {}
    for k, e in enumerate(exprs):
        for i in e.inputs:
            reads.setdefault(i, []).append(e)
    # A tensor a forwarded unary chain may start from -> the segment input it is computed from
    # (a fusion input, or a view's result): what a view may be taken of.
    source = {v: v for v in fusion.inputs if isinstance(v, TensorView)}
    # A tensor forwarded ops may read -> the full-size segment inputs it is computed from (a
    # broadcast's result counts as none: it is no larger than its input, which the broadcast
    # spreads over more elements).
    full = {v: frozenset((v,)) for v in source}
    out, views = set(), {}
    for k, e in enumerate(exprs):          # topological: a chain's producers come first
        tensors = [i for i in e.inputs if isinstance(i, TensorView)]
        if not tensors or not all(i in full for i in tensors):
            continue
        o = e.outputs[0]
        if permutation(e) is not None and e.inputs[0] in fusion.inputs and all(
                isinstance(u, (MatmulOp, LinearOp)) for u in reads.get(o, ())):
            # A permute of an input read by matmuls alone (which read any strides: the
            # kernel's tensor maps, cuBLAS's transposes): the input's memory under the
            # permuted dims, no transpose kernel (any layout: its strides permuted).
            if o not in fusion.outputs and all(i.expanded_extent is None
                                               for i in e.inputs[0].domain.logical):
                views[k] = e.inputs[0]
                source[o] = o
                full[o] = frozenset((o,))
            continue
        if isinstance(e, ReshapeOp):
            if e.inputs[0] not in source:
                continue
            x = source[e.inputs[0]]
            if (x in fusion.inputs and _is_dense_input(x) and o not in fusion.outputs
                    and (e.inputs[0] is x or not any(_needs_stored(u, o)
                                                     for u in reads.get(o, ())))):
                views[k] = x
                source[o] = o
                full[o] = frozenset((o,))
            continue
        if o in fusion.outputs or any(has_library_implementation(u) for u in reads.get(o, ())):
            continue
        # Its consumers may be forwarded too; not those of an op some segment writes (they
        # would read it before the segment writing it ran: forwarded ops are in no group, so
        # the order of segments knows nothing of what they read).
        if is_forwardable(e):
            if e.inputs[0] in source:
                source[o] = source[e.inputs[0]]
            full[o] = full[e.inputs[0]]
        elif isinstance(e, BroadcastOp) and forward_binary:
            full[o] = frozenset()
        elif (forward_binary and is_forwardable_binary(e)
              and len(frozenset().union(*(full[i] for i in tensors))) <= 1):
            # Recomputing it reads at most one full-size tensor, as reading it would.
            full[o] = frozenset().union(*(full[i] for i in tensors))
        else:
            continue
        out.add(k)
    return out, views


def _needs_stored(expr, tv: TensorView) -> bool:
    """Whether `expr` needs `tv` as a tensor in memory, not computed where it is read: a
    window's or a gather's source (read at their own offsets), a library call's operand. The
    readers of a view of cast(x) get the view and cast it themselves, so such a reader keeps
    the reshape a kernel's (fuzz 20261604:833: an index_select of reshape(cast(x)))."""
    if isinstance(expr, (WindowOp, GatherOp)):
        return expr.src is tv
    return has_library_implementation(expr)


def permutation(e) -> list | None:
    """The dims of a permute (a Set LoadStoreOp whose output's logical dims are its root's in
    another order): output dim d is input dim dims[d]; None for any other expr."""
    if not isinstance(e, LoadStoreOp) or e.load_kind != LoadKind.Set:
        return None
    d = e.outputs[0].domain
    if d.root is None or len(d.root) != len(d.logical) or set(d.root) != set(d.logical):
        return None
    dims = [d.root.index(i) for i in d.logical]
    return dims if dims != sorted(dims) else None


def _is_dense_input(x: TensorView) -> bool:
    """Whether every tensor bound to input `x` is dense in x's logical order (so that any
    reshape of it is a view): no stride order, no expanded dim, every dim contiguous."""
    d = x.domain
    if d.allocation is not None and list(d.allocation) != list(d.logical):
        return False
    return all(i.expanded_extent is None and (c is True or (c is None and i.is_broadcast))
               for i, c in zip(d.logical, d.contiguity))


def _chain(tv: TensorView, source: TensorView) -> list:
    """The forwarded unary ops from `source` to `tv`, in order."""
    chain = []
    while tv is not source:
        chain.append(tv.definition)
        tv = tv.definition.inputs[0]
    return chain[::-1]


def _whole(fusion, exprs, kind, choice, why: str = "") -> Segment:
    return Segment(kind, tuple(exprs), tuple(fusion.inputs), tuple(fusion.outputs), fusion,
                   choice.scheduler if choice else None, choice.reason if choice else why, choice)


# Grouping ---------------------------------------------------------------------------------------
class _Grouping:
    def __init__(self, fusion, exprs, exclude: dict | None = None, forward_binary: bool = True):
        self.fusion = fusion
        self.exprs = exprs
        self.exclude = exclude
        self.forward_binary = forward_binary
        self.index = {e: k for k, e in enumerate(exprs)}
        self.producer = {}          # tensor -> index of the expr that defines it
        for k, e in enumerate(exprs):
            for o in e.outputs:
                if isinstance(o, TensorView):
                    self.producer[o] = k
        self.outputs = set(fusion.outputs)
        # Forwarded ops are in no group: the groups reading them take copies (`with_forwarded`).
        self.forwarded, views = _forwarded(fusion, exprs, forward_binary)
        self.forwarded_binary = any(not is_forwardable(exprs[k]) for k in self.forwarded)
        # A view's result -> (the fusion input it views, the forwarded ops between them): the
        # segments reading it read the view and apply those ops (_sub_fusion).
        self.view_of = {exprs[k].outputs[0]: (x, _chain(exprs[k].inputs[0], x))
                        for k, x in views.items()}
        for k in self.forwarded:
            for o in exprs[k].outputs:
                self.producer.pop(o, None)
        grouped = [k for k in range(len(exprs)) if k not in self.forwarded]
        # group id -> sorted expr indices; group id -> kind
        self.members: dict[int, list[int]] = {k: [k] for k in grouped}
        self.kind: dict[int, str] = {k: "view" if k in views else segment_kind(exprs[k])
                                     for k in grouped}
        self.group_of = [k if k not in self.forwarded else None for k in range(len(exprs))]
        self._choices: dict = {}    # frozenset of expr indices -> registry.Choice
        # frozenset of expr indices -> the scheduler a replayed decision recorded for the group.
        self._recorded: dict = {}

    # Decisions -----------------------------------------------------------------------------
    def decision(self) -> SegmentationDecision:
        """The grouping as a decision (after segments(), which chose each kernel group's
        scheduler)."""
        groups = sorted(self.members)
        chosen = [self._choices.get(frozenset(self.members[g])) for g in groups]
        return SegmentationDecision(len(self.exprs), self.forward_binary, tuple(
            (self.kind[g], tuple(self.members[g])) for g in groups), tuple(
            c.scheduler.NAME if self.kind[g] == "kernel" and c is not None
            and c.scheduler is not None else None for g, c in zip(groups, chosen)))

    def take(self, groups, schedulers=()) -> bool:
        """Make the groups `groups` (a SegmentationDecision's) where they fit these exprs (see
        the module docstring), with the schedulers it recorded for them; False, the grouping
        then unusable, where they do not."""
        initial = dict(self.kind)       # each grouped expr's kind alone
        members, kind, group_of = {}, {}, [None] * len(self.exprs)
        for what, indices in groups:
            indices = list(indices)
            if (not indices or indices != sorted(set(indices))
                    or any(k not in initial or group_of[k] is not None for k in indices)
                    or not _kind_fits(what, [self.exprs[k] for k in indices],
                                      [initial[k] for k in indices])):
                return False
            members[indices[0]] = indices
            kind[indices[0]] = what
            for k in indices:
                group_of[k] = indices[0]
        if sum(len(m) for m in members.values()) != len(initial):
            return False            # an expr in no group
        self.members, self.kind, self.group_of = members, kind, group_of
        self._recorded = {frozenset(indices): name for (what, indices), name
                          in zip(groups, schedulers) if what == "kernel" and name is not None}
        for k, e in enumerate(self.exprs):
            if isinstance(e, BOUNDARY_OPS) and any(
                    self.group_of[self.index[u]] == self.group_of[k]
                    for o in e.outputs for u in o.uses if u in self.index):
                return False        # a segment_set inside a group
        return self._order(self.edges()) is not None

    # The group DAG -------------------------------------------------------------------------
    def edges(self) -> dict:
        """(producer group, consumer group) -> the tensors between them. A group reading a
        forwarded op reads what that op is computed from (its copy runs in the group): a view's
        result below a forwarded cast is an edge from the view's group (fuzz 20263200:143: the
        view segment ran after its reader)."""
        out: dict = {}
        for k, e in enumerate(self.exprs):
            if k in self.forwarded:
                continue
            for i in self._read_through_forwarded(e):
                a, b = self.group_of[self.producer[i]], self.group_of[k]
                if a != b:
                    ts = out.setdefault((a, b), [])
                    if i not in ts:
                        ts.append(i)
        return out

    def _read_through_forwarded(self, e) -> list:
        """The tensors some group writes that `e` reads, directly or through forwarded ops."""
        out, todo, seen = [], list(e.inputs), set()
        while todo:
            i = todo.pop()
            if not isinstance(i, TensorView) or i in seen:
                continue
            seen.add(i)
            if i in self.producer:
                out.append(i)
                continue
            k = self.index.get(i.definition) if i.definition is not None else None
            if k is not None and k in self.forwarded:
                todo.extend(self.exprs[k].inputs)
        return out

    def _reaches(self, start: int, goal: int, edges, skip_direct: bool) -> bool:
        succ: dict = {}
        for a, b in edges:
            succ.setdefault(a, []).append(b)
        todo = [b for b in succ.get(start, []) if not (skip_direct and b == goal)]
        seen = set()
        while todo:
            g = todo.pop()
            if g == goal:
                return True
            if g in seen:
                continue
            seen.add(g)
            todo.extend(succ.get(g, []))
        return False

    def _legal(self, a: int, b: int, edges) -> bool:
        """Merging a and b (a feeds b) closes no cycle through a third group, and crosses no
        segment boundary."""
        for pair in ((a, b), (b, a)):
            for t in edges.get(pair, ()):
                if isinstance(t.definition, BOUNDARY_OPS):
                    return False
        return not self._reaches(a, b, edges, skip_direct=True) and \
            not self._reaches(b, a, edges, skip_direct=True)

    def _merge(self, a: int, b: int, kind: str) -> None:
        keep, gone = min(a, b), max(a, b)
        self.members[keep] = sorted(self.members[keep] + self.members.pop(gone))
        self.kind.pop(gone)
        self.kind[keep] = kind
        for k in self.members[keep]:
            self.group_of[k] = keep

    def with_forwarded(self, members) -> list:
        """`members` and the forwarded ops they read, directly or through one another, sorted
        (so in topological order)."""
        out = set(members)
        todo = list(members)
        while todo:
            for i in self.exprs[todo.pop()].inputs:
                d = i.definition if isinstance(i, TensorView) else None
                k = self.index.get(d) if d is not None else None
                if k is not None and k in self.forwarded and k not in out:
                    out.add(k)
                    todo.append(k)
        return sorted(out)

    def choice(self, members, sub_fusion=None) -> object:
        """The scheduler choice of the group `members`, asked of `sub_fusion` where the caller
        built the group's sub-fusion already."""
        key = frozenset(members)
        c = self._choices.get(key)
        if c is None:
            if sub_fusion is None:
                sub_fusion = _sub_fusion(
                    self.fusion, [self.exprs[k] for k in self.with_forwarded(members)],
                    self._outputs_of(key), self.view_of).fusion
            # A replayed group asks the scheduler its decision recorded alone: the ones before
            # it refused the group then, and the decision's key holds pyfuser's source.
            c = registry.choose(sub_fusion, self.exclude, only=self._recorded.get(key))
            self._choices[key] = c
        return c

    def _outputs_of(self, members) -> list:
        """Tensors the exprs `members` write that the caller or other exprs read."""
        out = []
        for k in sorted(members):
            for o in self.exprs[k].outputs:
                if not isinstance(o, TensorView) or o in out:
                    continue
                if o in self.outputs or any(self.index.get(u) is not None
                                            and self.index[u] not in members
                                            for u in o.uses):
                    out.append(o)
        return out

    # Merging -------------------------------------------------------------------------------
    def merge_kernels(self) -> None:
        """Greedy: the legal merge of two kernel groups that saves the most bytes and that a
        scheduler accepts, until none is left."""
        while True:
            edges = self.edges()
            cands = []
            for (a, b), ts in edges.items():
                if self.kind[a] == "kernel" and self.kind[b] == "kernel":
                    saved = sum(_bytes(t) for t in ts)
                    cands.append((-saved, min(self.members[a]), min(self.members[b]), a, b))
            cands += self._sibling_reductions(edges)
            cands.sort()
            merged = False
            for *_, a, b in cands:
                if not self._legal(a, b, edges):
                    continue
                if self.choice(self.members[a] + self.members[b]).scheduler is None:
                    continue
                self._merge(a, b, "kernel")
                merged = True
                break
            if not merged:
                return

    def _sibling_reductions(self, edges) -> list:
        """Merge candidates of two kernel groups with reductions, neither feeding the other,
        that read a tensor in common: merged, one kernel reads it once (as nvFuser's horizontal
        merge of reductions). BatchNorm backward's sum(dy) and sum(dy * x_hat) are two
        reduction kernels reading dy otherwise. Ranked with the other merges by the bytes of
        the tensors they share."""
        linked = {frozenset(pair) for pair in edges}
        reads = {}
        for g, members in self.members.items():
            if self.kind[g] != "kernel" or not any(
                    isinstance(self.exprs[k], ReductionOp) for k in members):
                continue
            reads[g] = {i for k in self.with_forwarded(members) for i in self.exprs[k].inputs
                        if isinstance(i, TensorView) and (i in self.fusion.inputs
                                                          or self.producer.get(i) is not None
                                                          and self.group_of[self.producer[i]]
                                                          != g)}
        out = []
        groups = sorted(reads)
        for x, a in enumerate(groups):
            for b in groups[x + 1:]:
                shared = reads[a] & reads[b]
                if shared and frozenset((a, b)) not in linked:
                    saved = sum(_bytes(t) for t in shared)
                    out.append((-saved, min(self.members[a]), min(self.members[b]), a, b))
        return out

    def settle_leftovers(self) -> None:
        """Kernel groups no scheduler takes become reference groups; cheap-op groups join a
        reference neighbour; reference neighbours merge."""
        for g in list(self.members):
            if self.kind[g] == "kernel" and self.choice(self.members[g]).scheduler is None:
                alone = self.members[g]
                self.kind[g] = ("library" if len(alone) == 1
                                and isinstance(self.exprs[alone[0]], LIBRARY_FALLBACK_OPS)
                                else "reference")
        while True:
            edges = self.edges()
            merged = False
            for (a, b) in sorted(edges):
                ka, kb = self.kind[a], self.kind[b]
                if "reference" not in (ka, kb) or {"library", "view"} & {ka, kb}:
                    continue
                other = b if ka == "reference" else a
                if self.kind[other] == "kernel" and not all(
                        is_cheap(self.exprs[k]) for k in self.members[other]):
                    continue
                if not self._legal(a, b, edges):
                    continue
                self._merge(a, b, "reference")
                merged = True
                break
            if not merged:
                return

    # Segments ------------------------------------------------------------------------------
    def _order(self, edges) -> list | None:
        """The groups in topological order, the one of the first expr first among those ready;
        None where they form a cycle (only groups taken from a decision can)."""
        preds: dict = {g: set() for g in self.members}
        for a, b in edges:
            preds[b].add(a)
        order, done = [], set()
        while len(order) < len(self.members):
            ready = sorted((g for g in self.members if g not in done and preds[g] <= done),
                           key=lambda g: self.members[g][0])
            if not ready:
                return None
            order.append(ready[0])
            done.add(ready[0])
        return order

    def segments(self) -> list:
        out = []
        for g in self._order(self.edges()):
            members = self.members[g]
            kind = self.kind[g]
            if kind == "view":
                reshape = self.exprs[members[0]]
                out.append(_view_segment(self.fusion, reshape,
                                         self.view_of[reshape.outputs[0]][0]))
                continue
            exprs = [self.exprs[k] for k in self.with_forwarded(members)]
            sub = _sub_fusion(self.fusion, exprs, self._outputs_of(frozenset(members)),
                              self.view_of)
            if kind == "kernel":
                c = self.choice(members, sub.fusion)
                out.append(dataclasses.replace(sub, kind="kernel", scheduler=c.scheduler,
                                               why=c.reason, choice=c))
            elif kind == "library" and isinstance(exprs[-1], LIBRARY_FALLBACK_OPS):
                why = self.choice(members, sub.fusion).reason
                out.append(dataclasses.replace(sub, kind="library", why=(
                    "a library call, since no kernel takes it (op_support.LIBRARY_FALLBACK_OPS): "
                    + why)))
            elif kind == "library":
                out.append(dataclasses.replace(sub, kind="library",
                                               why="a library call (op_support.LIBRARY_OPS)"))
            else:
                c = self.choice(members, sub.fusion)
                out.append(dataclasses.replace(sub, kind="reference", why=c.reason))
        return out


def _kind_fits(kind: str, exprs: list, initial: list) -> bool:
    """Whether a group of `exprs`, of kinds `initial` alone, can be of `kind` (as
    merge_kernels and settle_leftovers make groups)."""
    if kind == "kernel":
        return all(k == "kernel" for k in initial)
    if kind == "reference":
        return all(k in ("kernel", "reference") for k in initial)
    if kind == "view":
        return initial == ["view"]
    if kind == "library":
        return initial == ["library"] or (initial == ["kernel"]
                                          and isinstance(exprs[0], LIBRARY_FALLBACK_OPS))
    return False


def _bytes(t: TensorView) -> int:
    n = t.dtype.size
    for i in t.domain.logical_no_reductions:
        if i.is_broadcast:
            continue
        n *= i.extent.value if i.extent.value is not None else _UNKNOWN_EXTENT
    return n


# Sub-fusions ------------------------------------------------------------------------------------
def _sub_fusion(fusion, exprs: list, outputs: list, view_of: dict | None = None) -> Segment:
    """A Segment (kind "kernel", no scheduler yet) whose fusion is a new Fusion computing
    `outputs` from what `exprs` read (see the module docstring). `view_of`: a view's result ->
    (the input it views, the forwarded ops from that input): the sub-fusion reads the view
    (the input's dtype) and applies those ops to it."""
    view_of = view_of or {}
    inside = set(exprs)
    inputs: list = []
    for v in fusion.inputs:         # the fusion's own inputs first, in its order
        if any(v in e.inputs for e in exprs):
            inputs.append(v)
    for e in exprs:
        for i in e.inputs:
            if isinstance(i, TensorView):
                if (i.definition not in inside) and i not in inputs:
                    inputs.append(i)
            elif isinstance(i, Scalar):
                for leaf in S.symbolic_inputs(i):
                    if leaf in fusion.inputs and leaf not in inputs:
                        inputs.append(leaf)
    new, mapping = fusion.clone()
    back = {id(v): k for k, v in mapping.items()}       # id(clone Val) -> id(original Val)
    new_exprs = {mapping[id(e.outputs[0])].definition for e in exprs}
    sub_inputs = []
    for v in inputs:
        nv = mapping[id(v)]
        if isinstance(v, TensorView) and v.definition is not None:
            source, chain = view_of.get(v, (v, ()))
            dims = permutation(v.definition) if v in view_of else None
            if dims is None:
                fresh = _boundary_input(new, nv, source.dtype)
            else:
                # A permute view is its input's memory: the input's allocation order and
                # contiguity, its dims renumbered by the permutation.
                d = source.domain
                order = [dims.index(d.logical.index(i)) for i in d.maybe_allocation]
                fresh = _boundary_input(new, nv, source.dtype, order, list(d.contiguity))
            sub_inputs.append(fresh)
            with new:
                for op in chain:
                    fresh = arith.unary(op.op, fresh, op.outputs[0].dtype)
            for use in list(nv.uses):
                if use in new_exprs:
                    use.replace_input(nv, fresh)
            continue
        sub_inputs.append(nv)
    for tv in [mapping[id(t)] for t in fusion.tensors()]:
        d = tv.definition
        if d is not None and d not in new_exprs:
            d.detach()
    new.inputs = []
    new.outputs = []
    new.input_aliases = {}
    # The whole fusion's in-place outputs are the plan's to write, after its segments: a
    # segment's outputs are all plain (positions in the whole fusion mean nothing here).
    new.output_aliases = {}
    new.hidden_outputs = set()
    for nv in sub_inputs:
        new.add_input(nv)
    for o in outputs:
        new.add_output(mapping[id(o)])
    # Extents no input tensor binds: integer scalar inputs, valued by the plan.
    bound = set()
    for v in new.inputs:
        if isinstance(v, TensorView):
            for i in v.domain.logical:
                for s in (i.extent, i.expanded_extent):
                    if isinstance(s, Scalar) and s.value is None and s.definition is None:
                        bound.add(s)
        else:
            bound.add(v)
    needed: list = []

    def need(x):
        for leaf in S.symbolic_inputs(x):
            if leaf not in bound and leaf not in needed:
                needed.append(leaf)
    for e in new.exprs():
        for i in e.inputs:
            if isinstance(i, Scalar):
                need(i)
    for tv in new.tensors():
        for i in tv.domain.all_ids():
            need(i.extent)
            if i.expanded_extent is not None:
                need(i.expanded_extent)
    extra = []
    if needed:
        originals = {id(x): x for x in _scalars_of(fusion)}
        for x in needed:
            new.add_input(x)
            extra.append(originals[back[id(x)]])
    known = bound | set(needed)
    new.extent_equalities, new.extent_limits = ([
        (a, b, where) for a, b, where in pairs
        if all(x in known for x in S.symbolic_inputs(a) + S.symbolic_inputs(b))]
        for pairs in (new.extent_equalities, new.extent_limits))
    return Segment("kernel", tuple(exprs), tuple(inputs) + tuple(extra), tuple(outputs), new,
                   None, "", None, len(extra))


def _view_segment(fusion, reshape, source: TensorView) -> Segment:
    """The "view" segment of `reshape` (or of a permute), whose input is fusion input `source`
    or forwarded ops of it: a sub-fusion reshaping `source` itself (the result has source's
    dtype), which the plan runs as a view of source's memory."""
    seg = _sub_fusion(fusion, [reshape], [reshape.outputs[0]],
                      {reshape.inputs[0]: (source, ())} if reshape.inputs[0] is not source
                      else {})
    seg.fusion.outputs[0].dtype = source.dtype      # a reshape keeps its input's dtype
    why = (f"a reshape of input T{source.name}, which is dense" if isinstance(reshape, ReshapeOp)
           else f"a permute {permutation(reshape)} of input T{source.name}, read by matmuls alone")
    return dataclasses.replace(seg, kind="view", inputs=(source,) + seg.inputs[1:],
                               why=f"{why}: a view of its memory, no kernel")


def _scalars_of(fusion) -> list:
    """The symbolic scalars `fusion`'s tensors and expressions depend on."""
    out = []
    for tv in fusion.tensors():
        for i in tv.domain.all_ids():
            out += S.symbolic_inputs(i.extent)
            if i.expanded_extent is not None:
                out += S.symbolic_inputs(i.expanded_extent)
    for e in fusion.exprs():
        for i in e.inputs:
            if isinstance(i, Scalar):
                out += S.symbolic_inputs(i)
    return out


def _boundary_input(new: Fusion, tv: TensorView, dtype, order: list | None = None,
                    contiguity: list | None = None) -> TensorView:
    """A new input of `new` of `dtype` standing for intermediate `tv` (tv's dtype, or a viewed
    input's): its dims (without reduction IDs) with the same extents, dense in tv's allocation
    order, as the plan allocates it; or a permute view's layout: `order` (positions of its
    logical dims, outermost first) and `contiguity` (per position), its input's."""
    ids = {i: i.clone(fusion=new) for i in tv.domain.logical_no_reductions}
    logical = [ids[i] for i in tv.domain.logical_no_reductions]
    alloc = ([logical[d] for d in order] if order is not None else
             [ids[i] for i in tv.domain.maybe_allocation if i in ids])
    allocation = alloc if alloc != logical else None
    if contiguity is None:
        contiguity = [None if i.is_broadcast else True for i in alloc]
    with new:
        return TensorView(TensorDomain(logical, allocation=allocation, contiguity=contiguity),
                          dtype, MemoryType.Global)
