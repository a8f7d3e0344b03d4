"""In-place outputs (fd.add_output(t, alias_input=x)): writing them into their inputs' storage.

Every plan (kernels, interpreter, reference, and the segments of a plan) computes all of the
fusion's outputs into tensors of their own; then `write_aliased_outputs` copies each in-place
output into its input and drops the hidden ones from what execute returns. Copying after the
whole plan has run is always correct: no read of the input can come after its write. It costs
one more read and write of each in-place output (an AdamW step updating p, m and v: three
extra copies over the step's own traffic).

A kernel could store into the input directly where that is safe: the output has the input's
shape, strides and dtype, and the input's elements are read only by the thread that writes the
same element, before it writes it (a pointwise kernel reading p[i] and writing p'[i] in one
thread). A read of the input by any other thread or element (a broadcast, a reduction, a
reshape or permute of it, a persistent row read again after the write, a second kernel of the
plan) would see the new value. The executor does not do that yet.
"""
from __future__ import annotations

import torch


def write_aliased_outputs(fusion, inputs, outputs: list) -> list:
    """Copy each in-place output of `fusion` into its input (`outputs`: one tensor per
    fusion.outputs entry, as plans compute them) and return the outputs execute returns."""
    aliases = fusion.output_aliases
    targets = [inputs[i] for i in aliases.values()]
    # An output that is a view of an input about to be overwritten (the reference evaluator
    # returns an input's set as the input itself) keeps the values it was computed with. A
    # tensor's first element lies in the storage it views, and storages do not overlap (one
    # address space for the CPU and every GPU): a range test per output, without making a
    # storage object for each (host time of every call).
    spans = []
    for t in targets:
        storage = t.untyped_storage()
        start = storage.data_ptr()
        spans.append((start, start + storage.nbytes()))
    for k, o in enumerate(outputs):
        if isinstance(o, torch.Tensor):
            p = o.data_ptr()
            for lo, hi in spans:
                if lo <= p < hi and o.numel():
                    outputs = list(outputs)
                    outputs[k] = o.clone()
                    break
    # One call for all of them (on a GPU, one launch where their layouts allow it): a
    # BatchNorm's running mean and variance, an optimizer's parameter and states. Under
    # no_grad only where autograd would refuse an in-place write (2-3 us a call otherwise).
    sources = [outputs[o] for o in aliases]
    if any(t.requires_grad for t in targets):
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)
    else:
        torch._foreach_copy_(targets, sources)
    return [x for k, x in enumerate(outputs) if k not in fusion.hidden_outputs]
