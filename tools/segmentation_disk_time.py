"""Segmentation time of a new process with its decision in the disk cache (a hit) or not (a
miss), for tools/bench_issue16 cases (CPU):

    PYTHONPATH=. python tools/segmentation_disk_time.py [ROUNDS]

Each round takes a new cache directory and runs two fresh processes per case: the first
segments through the disk cache as execute() does (executor._DiskDecisions: a miss, the merge
search, the decision stored), the second finds the decision and replays it. Each child times
`segment(fusion, exclude, decisions)` after pyfuser.runtime.kernel_cache.source_hash() (which
the kernels' look-ups need in any case; its time is printed apart). Medians over the rounds.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

# (bench_issue16 case, schedulers excluded as execute() excludes them for it)
CASES = [
    ("batchnorm_fwd NCHW", None),
    ("batchnorm_bwd NHWC", {"outer_persistent": "the column tiles leave most SMs idle"}),
    ("groupnorm_fwd [8,320,64,64]", None),
]

_CHILD = """
import json, sys, time
sys.path.insert(0, {tools!r})
import bench_issue16
from pyfuser.runtime import kernel_cache
from pyfuser.runtime.executor import _DiskDecisions
from pyfuser.schedule.segmenter import segment
name, exclude = json.loads(sys.argv[1])
fusion = bench_issue16.CASES[name]("meta")[0].fusion
t0 = time.perf_counter()
kernel_cache.source_hash()
t1 = time.perf_counter()
seg = segment(fusion, exclude, _DiskDecisions(fusion, exclude))
t2 = time.perf_counter()
print(json.dumps([(t1 - t0) * 1e3, (t2 - t1) * 1e3, len(seg.segments)]))
"""


def main(rounds: int) -> int:
    tools = os.path.dirname(os.path.abspath(__file__))
    child = _CHILD.format(tools=tools)
    times = {name: {"miss": [], "hit": [], "source_hash": []} for name, _ in CASES}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, PYFUSER_CACHE_DIR=cache)
            env.pop("PYFUSER_DISABLE_DISK_CACHE", None)
            for name, exclude in CASES:
                for kind in ("miss", "hit"):
                    out = subprocess.run([sys.executable, "-c", child,
                                          json.dumps([name, exclude])], env=env, check=True,
                                         capture_output=True, text=True).stdout
                    source_ms, segment_ms, segments = json.loads(out.splitlines()[-1])
                    times[name][kind].append(segment_ms)
                    times[name]["source_hash"].append(source_ms)
                times[name]["segments"] = segments
    print(f"median of {rounds} rounds, ms | miss (search, store) | hit (replay) | "
          "source_hash() before it")
    for name, exclude in CASES:
        t = times[name]
        label = name + (f" without {', '.join(exclude)}" if exclude else "")
        print(f"{label:50s} {t['segments']} segments | {statistics.median(t['miss']):6.1f} | "
              f"{statistics.median(t['hit']):5.1f} | {statistics.median(t['source_hash']):5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
