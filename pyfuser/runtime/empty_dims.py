"""Calls with dims of size 0 beside elements: the fusion specialized to what has elements.

When every output is empty the executor launches nothing (executor._EmptyPlan). When only some
are, or when a sum over a dim of size 0 reaches an output element, kernels still run, on a
specialization of the fusion for this call's empty dims (one per pattern of them), made here:

- outputs with no elements leave the fusion: they are allocated, nothing computes them. What
  the other outputs need never passes through a tensor with no elements, except through a
  reduction over a dim of size 0 (a broadcast, an expand, a reshape or an element-wise op of an
  empty tensor is empty), so dropping them drops no work the others need;
- a sum over a dim of size 0 (a ReductionOp, or the frontend's squeeze of an expanded dim of
  size 0, SqueezeOp.reduction) is its start value, 0, as torch gives it: it becomes a fill
  (FullOp) of its kept dims, and what it reduced leaves the fusion with it. A max or min there
  has no value: check_inputs refuses those calls (torch raises too). A scatter of no elements
  (an empty index) is what it scatters into: a fill of 0, or a copy of x.

An index into a dim of size 0 is out of range whatever its value, and where the outputs it
feeds have no elements no kernel would check it: `indices_into_nothing` finds those calls, which
the executor runs on the reference evaluator (it raises IndexOutOfRange, as torch does).

Why not a kernel of the whole fusion: its grid follows the dims of size 0 (an empty row dim
gives no block, yet other outputs need threads), and a reduction of no elements would need
loops of no iterations (a persistent one, a row length of 0 that its constant splits cannot
express). The specialization has neither, and is segmented and scheduled as any fusion.

RunInfo says so: its reason starts with what was specialized ("outputs 1, 3 have no elements:
allocated, not computed"; "T5 sums over a dim of size 0: a fill of 0"), then what ran.
"""
from __future__ import annotations

import dataclasses

from ..ir import scalar as S
from ..ir.exprs import FullOp, IndexCheckOp, LoadStoreOp, ReductionOp, ScatterOp, SqueezeOp
from ..ir.tensor import TensorDomain, TensorView
from .inputs import empty_reductions, output_strides
from .rewritten_plan import RewrittenPlan


@dataclasses.dataclass(frozen=True)
class EmptyDims:
    """A call's empty dims as they touch the fusion: the positions of its outputs with no
    elements, and the tensors (by name) that sum over a dim of size 0 and reach an output."""

    empty_outputs: tuple
    empty_sums: tuple

    def __bool__(self) -> bool:
        return bool(self.empty_outputs or self.empty_sums)

    def describe(self) -> str:
        parts = []
        if self.empty_outputs:
            ks = ", ".join(str(k) for k in self.empty_outputs)
            s = "s" if len(self.empty_outputs) > 1 else ""
            parts.append(f"output{s} {ks} ha{'ve' if s else 's'} no elements: allocated, not "
                         "computed")
        if self.empty_sums:
            ts = ", ".join(f"T{n}" for n in self.empty_sums)
            parts.append(f"{ts} sum{'s' if len(self.empty_sums) == 1 else ''} over a dim of "
                         "size 0: a fill of 0 (torch's sum of no elements)")
        return "; ".join(parts)


def empty_dims(fusion, bindings: dict, out_sizes: list) -> EmptyDims:
    """What the call's dims of size 0 change in `fusion` (falsy when nothing: the common case
    costs one scan of the bindings)."""
    if 0 not in bindings.values():
        return EmptyDims((), ())
    empty = tuple(k for k, sz in enumerate(out_sizes) if 0 in sz)
    sums = tuple(sorted({tv.name for _, tv, _, _ in empty_reductions(fusion, bindings)}))
    return EmptyDims(empty, sums)


# Why a call with dims of size 0 runs no kernel (RunInfo's reason, the explanation's summary).
INDEX_INTO_NOTHING = ("an index into a dim of size 0 (out of range whatever its value; the "
                      "reference evaluator raises it)")
NOTHING_TO_LAUNCH = "every output is empty: nothing to launch"


def empty_call(fusion, bindings: dict, out_sizes: list) -> tuple[str, EmptyDims]:
    """What a call's dims of size 0 make of its plan (the executor's and explain's one rule):
    (INDEX_INTO_NOTHING: the reference evaluator runs it; NOTHING_TO_LAUNCH: every output is
    empty; "": kernels run, of the fusion specialized to the EmptyDims where it is truthy)."""
    if 0 in bindings.values() and indices_into_nothing(fusion, bindings):
        return INDEX_INTO_NOTHING, EmptyDims((), ())
    if all(any(s == 0 for s in sz) for sz in out_sizes):
        return NOTHING_TO_LAUNCH, EmptyDims((), ())
    return "", empty_dims(fusion, bindings, out_sizes)


def specialize(fusion, what: EmptyDims):
    """A new fusion computing the outputs of `fusion` that have elements, in their order, with
    each sum over a dim of size 0 a fill of 0; the inputs are the same, in the same positions
    (an input only the dropped parts read stays, unread)."""
    new, _ = fusion.clone_for_rewrite()
    by_name = {t.name: t for t in new.tensors()}
    with new:
        for name in what.empty_sums:
            _fill_with_start_value(new, by_name[name])
    before = new.exprs()
    new.outputs = [o for k, o in enumerate(new.outputs) if k not in what.empty_outputs]
    new.hidden_outputs = set()      # (their positions moved; all are this plan's to return)
    needed = set(new.exprs())
    for e in before:
        if e not in needed:
            e.detach()
    return new


def _fill_with_start_value(fusion, tv: TensorView) -> None:
    """Replace the definition of `tv` (a sum over a dim of size 0) by a fill of 0 over its kept
    dims: a new tensor that takes its place in its consumers and among the outputs."""
    e = tv.definition
    ids = {i: i.clone(fusion=fusion) for i in tv.domain.logical_no_reductions}
    logical = [ids[i] for i in tv.domain.logical_no_reductions]
    alloc = [ids[i] for i in tv.domain.maybe_allocation if i in ids]
    allocation = alloc if alloc != logical else None
    contiguity = [None if i.is_broadcast else True for i in alloc] if allocation else None
    fill = TensorView(TensorDomain(logical, allocation=allocation, contiguity=contiguity),
                      tv.dtype, tv.memory_type)
    assert isinstance(e, (ReductionOp, SqueezeOp, ScatterOp))
    if isinstance(e, ScatterOp) and e.x is not None:
        LoadStoreOp(fill, e.x)          # x, nothing written into it
    else:
        FullOp(fill, e.init if isinstance(e, ReductionOp) else S.as_scalar(0, tv.dtype))
    fusion.replace_uses(tv, fill)
    e.detach()


def indices_into_nothing(fusion, bindings: dict) -> bool:
    """Whether a scatter or an index check (a one-hot's) of this call indexes a dim of size 0
    with an index that has elements: every such index is out of range."""
    def size(s) -> int:
        return int(S.evaluate(s, dict(bindings)))

    def has_elements(tv) -> bool:
        return all(size(i.maybe_expanded_extent) != 0
                   for i in tv.domain.logical_no_reductions)
    for e in fusion.exprs():
        if isinstance(e, ScatterOp):
            out = e.outputs[0]
            if size(out.domain.logical[e.dim].user_extent) == 0 and all(
                    size(i.maybe_expanded_extent) != 0
                    for i in out.domain.root):
                return True
        elif isinstance(e, IndexCheckOp):
            if size(e.extent) == 0 and has_elements(e.index):
                return True
    return False


class SpecializedPlan(RewrittenPlan):
    """A plan for a call with empty dims: the specialized fusion's executor (a
    FusionExecutorCache of its own, made once per pattern of empty dims) computes the outputs
    with elements; the empty ones are allocated here."""

    def __init__(self, fusion, what: EmptyDims, executor, out_sizes, device):
        import torch

        from ..ir.dtype import to_torch
        super().__init__(executor, what.describe(), device)
        self.empty_specs = {k: (tuple(out_sizes[k]), tuple(output_strides(fusion.outputs[k],
                                                                          out_sizes[k])),
                                to_torch(fusion.outputs[k].dtype))
                            for k in what.empty_outputs}
        self.n_outputs = len(fusion.outputs)
        self._torch = torch

    def run(self, inputs):
        computed = iter(self.executor.run(list(inputs), device=self.device))
        empty = self._torch.empty_strided
        out = []
        for k in range(self.n_outputs):
            spec = self.empty_specs.get(k)
            out.append(next(computed) if spec is None else
                       empty(spec[0], spec[1], dtype=spec[2], device=self.device))
        return out
