"""A call planned on a rewrite of the fusion: another executor (FusionExecutorCache) of the
rewritten fusion runs it, and its RunInfo is told with what was rewritten in front. The
executor makes these for matmuls of one row made reductions (schedule/few_row_matmuls.py); the
plans of calls with empty dims (empty_dims.SpecializedPlan) add their empty outputs."""
from __future__ import annotations

import dataclasses


class RewrittenPlan:
    """`executor` runs the rewritten fusion (the same inputs and outputs, in the same
    positions); `what` says what was rewritten (RunInfo.reason's prefix)."""

    def __init__(self, executor, what: str, device):
        self.executor = executor
        self.what = what
        self.device = device
        self._info_of = self._info = None
        # The rewrite's own plan, bound at the first run: the executor that made this plan
        # runs it only for calls of one signature, which are the rewrite's too, so later calls
        # skip the rewrite's executor's key and look-up (host time, runtime/plan.py likewise).
        self._bound = None

    @property
    def run_info(self):
        # Read after every call: the inner executor's RunInfo, with what was rewritten
        # prefixed, is made once per RunInfo it returns, not per call.
        info = self.executor.last_run
        if info is None:
            return None
        if self._info_of is not info:
            self._info_of = info
            self._info = dataclasses.replace(info, reason=f"{self.what}; {info.reason}")
        return self._info

    def run(self, inputs):
        # (no device: the inputs' is the call's.) Every output of the rewritten fusion, hidden
        # ones included: the calling executor writes its in-place outputs and drops those.
        plan = self._bound
        if plan is None:
            plan = self._bound = self.executor.plan_for(inputs)
        outputs = plan.run(inputs)
        self.executor.last_run = plan.run_info
        return outputs
