"""Running a fusion: input checks, then generated kernels or the reference evaluator."""
from __future__ import annotations

import dataclasses

from .. import options as opts
from .inputs import check_inputs
from .reference import evaluate


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What one execute() ran: tests assert on it so that no fallback goes unnoticed."""

    kind: str                      # "kernels" or "reference"
    schedulers: tuple[str, ...]    # one per kernel, e.g. ("pointwise",)
    num_kernels: int
    reason: str = ""               # why the reference evaluator ran, if it did


class FusionExecutorCache:
    def __init__(self, fusion, name: str = "fusion"):
        self.fusion = fusion
        self.name = name
        self.last_run: RunInfo | None = None

    def run(self, inputs, options=None):
        ctx = opts.override(options) if options is not None else opts.override()
        with ctx:
            bindings = check_inputs(self.fusion, inputs)
            outputs = evaluate(self.fusion, list(inputs), extent_bindings=bindings)
            self.last_run = RunInfo("reference", (), 0, "kernels are not generated yet")
            return outputs
