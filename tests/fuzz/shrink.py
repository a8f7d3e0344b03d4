"""Shrinking a failing case to a smaller one that fails the same way.

shrink(spec, still_fails) tries, in order, while `still_fails(candidate)` holds:
1. dropping outputs (one at a time, keeping at least one);
2. bypassing ops: an op's output replaced by one of its tensor operands of the same rank and
   dtype (an elementwise op, a cast, a set), so that the chain gets shorter;
each followed by removing the ops and inputs no output needs. Every candidate is a whole spec
(inputs and their values unchanged), so the result is still a stand-alone repro.
"""
from __future__ import annotations

import copy

from .spec import value_names


def prune(spec: dict) -> dict:
    """The spec without ops and inputs that no output needs."""
    needed = set(spec["outputs"])
    keep = []
    for op in reversed(spec["ops"]):
        outs = op["out"] if isinstance(op["out"], list) else [op["out"]]
        if needed.intersection(outs):
            keep.append(op)
            needed.update(a for a in op["args"] if isinstance(a, str))
            for v in op["kwargs"].values():
                if isinstance(v, str) and v in value_names(spec):
                    needed.add(v)
    out = dict(spec)
    out["ops"] = keep[::-1]
    out["inputs"] = [i for i in spec["inputs"] if i["name"] in needed]
    return out


def _rename_uses(spec: dict, old: str, new: str) -> dict:
    out = copy.deepcopy(spec)
    for op in out["ops"]:
        op["args"] = [new if a == old else a for a in op["args"]]
    out["outputs"] = [new if o == old else o for o in out["outputs"]]
    if len(set(out["outputs"])) != len(out["outputs"]):
        return None
    return out


def shrink(spec: dict, still_fails, budget: int = 40) -> dict:
    """A smaller spec for which still_fails(spec) holds (spec itself if nothing smaller
    does), trying at most `budget` candidates."""
    tries = 0
    best = prune(spec)

    def attempt(candidate) -> bool:
        nonlocal tries, best
        if candidate is None or tries >= budget:
            return False
        tries += 1
        candidate = prune(candidate)
        if still_fails(candidate):
            best = candidate
            return True
        return False

    k = 0
    while len(best["outputs"]) > 1 and k < len(best["outputs"]) and tries < budget:
        cand = dict(best)
        cand["outputs"] = best["outputs"][:k] + best["outputs"][k + 1:]
        if not attempt(cand):
            k += 1
    inputs = {i["name"] for i in best["inputs"]}
    changed = True
    while changed and tries < budget:
        changed = False
        for op in list(reversed(best["ops"])):
            if isinstance(op["out"], list) or op["op"] == "define_scalar":
                continue
            operands = [a for a in op["args"] if isinstance(a, str)]
            for a in operands:
                if a == op["out"] or (a in inputs and op["out"] in best["outputs"]):
                    continue            # an input cannot be an output
                if attempt(_rename_uses(best, op["out"], a)):
                    changed = True
                    break
            if changed or tries >= budget:
                break
    return best
