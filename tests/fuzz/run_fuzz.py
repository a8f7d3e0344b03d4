"""The fuzzer's runner: generate cases, run them in worker processes, summarize, write repros.

Usage (from the repository root):

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py [--backend interpret|gpu] [--seed S]
        [--count N | --long] [--start I] [--jobs J] [--out DIR] [--max-elements E]
        [--pattern NAME] [--timeout SECONDS] [--chunk K] [--sanitize N] [--shrink]
        [--compile | --no-compile | --compile-every K]
    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --case 7:123 [--case ...]   # run and explain
    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --print-repro 7:123          # the script only
    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --sample --jobs 2 \
        --known-failures tests/fuzz/known_failures.py      # the CI sample's known failures

Cases are (seed, index) for index in [start, start + count): --count defaults to 50 (a CI-sized
run), --long to 5000. `--backend interpret` (the default) runs the generated kernels on CPU
tensors with the kernel-IR interpreter; `--backend gpu` runs them on the GPU with poisoned
outputs. Sizes are capped at --max-elements elements per tensor (65536 by default).

Compiling. The interpreter runs kernel IR, not CUDA text: `--compile` also compiles each
interpreted kernel with NVRTC for sm_90a (fuzz/check.py, "Compiling"), so generated code that
NVRTC refuses is an internal_error on the CPU too. It costs 0.1-1 s of NVRTC per new kernel
(the disk cache, PYFUSER_CACHE_DIR, keeps what compiled), so it is on by default for --long
runs only; `--compile-every K` compiles the cases whose index is a multiple of K, and
`--sample` compiles every SAMPLE_COMPILE_EVERY-th case as the CI sample does
(test_fuzz_sample.py). The summary counts the kernels compiled and those ptxas spills in.

Workers. Cases run in subprocesses (`--jobs`, default 1 for the interpreter, 8 on the GPU),
in chunks of `--chunk` cases. A worker announces each case before running it, so when it
dies (a crash, a CUDA error that poisons its context, a case over `--timeout` seconds: killed)
that case is recorded (illegal_access, internal_error or timeout) and a new worker resumes
the chunk after it: one crash is one result, not the end of the run. `--jobs 0` runs cases in
this process (no isolation, for debugging).

compute-sanitizer. `--sanitize N` (GPU) then reruns N cases, each in its own process under
`compute-sanitizer --tool memcheck`: the failures first, then a random sample of the others;
an error the sanitizer reports is an illegal access, written to sanitizer.jsonl and the summary.

Output (--out DIR, default fuzz-<backend>-<seed>), at most a handful of files so that a GPU
machine's output folder can carry them back:
- results.jsonl: one line per case (fuzz/check.py CaseResult: category, scheduler, the
  normalized signature, the message, per-output errors and tolerances, seconds).
- summary.txt (also printed): a line per category, the reference fallbacks counted by
  normalized reason, and the failures grouped by (category, scheduler, signature) with their
  case ids.
- failures.md: every failure group, then every failing case with its message, what ran, the
  traceback tail and its stand-alone repro script (with `--shrink`, the group's first case
  shrunk by fuzz/shrink.py first).
- repro/<id>.py: each failing case's repro script (`python repro/7_123.py` reruns it and
  exits 1 while it fails); --no-repro-files leaves them out.

On the GPU machine (device tool), one call of at most 10 minutes, e.g.:

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --backend gpu --count 1500 --jobs 8 \
        --sanitize 40 --no-repro-files --out $OUT/fuzz

and --start 1500, 3000, ... in later calls for a --long run (NVRTC compiles each new kernel:
about 1-2 s of a worker's time per case).

Reading the summary: `right` ran kernels and matched the float64 reference; `wrong`,
`internal_error`, `illegal_access` and `timeout` are pyfuser bugs; `reference_fallback` is
what pyfuser does not take yet (counted by reason); `definition_error` and `ill_conditioned`
are the generator's (or the frontend's) problems; `interpreter_limit` cases were too big to
interpret (no verdict).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))          # tests/: makes `fuzz` importable

from fuzz import gen
from fuzz.build import repro_script
from fuzz.spec import case_id, parse_case_id

PROTOCOL = "@@FUZZ "
DEFAULT_COUNT = 50
LONG_COUNT = 5000
# A worker exits with this code after a CUDA error (its context is lost).
EXIT_CONTEXT_LOST = 3
# Test hook: a worker aborts (as a crashing kernel would kill it) when it reaches this case.
CRASH_ENV = "PYFUSER_FUZZ_CRASH_CASE"


# Worker --------------------------------------------------------------------------------------
def worker(args) -> int:
    """Run the cases of --cases, announcing each on stdout before and after (PROTOCOL lines)."""
    import torch

    from fuzz.check import run_case
    # Workers are the parallelism: torch's own threads only contend with them (the
    # interpreter's small torch calls ran 10x slower with 2 threads on a busy 2-core machine).
    torch.set_num_threads(1)
    for cid in args.cases.split(","):
        seed, index = parse_case_id(cid)
        print(f"{PROTOCOL}START {cid}", flush=True)
        if os.environ.get(CRASH_ENV) == cid:
            os.abort()
        spec = gen.generate(seed, index, args.max_elements, args.pattern)
        res = run_case(spec, args.backend, compile=_compiles(args, index))
        print(f"{PROTOCOL}RESULT {json.dumps(res.to_dict())}", flush=True)
        if res.run == "context lost":
            return EXIT_CONTEXT_LOST
    return 0


def _compiles(args, index: int) -> bool:
    """Whether case `index` compiles its interpreted kernels with NVRTC (--compile-every)."""
    return args.compile_every > 0 and index % args.compile_every == 0


def _worker_command(args, cases: list[str], sanitize: bool = False) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--backend", args.backend,
           "--max-elements", str(args.max_elements), "--compile-every", str(args.compile_every),
           "--cases", ",".join(cases)]
    if args.pattern:
        cmd += ["--pattern", args.pattern]
    if sanitize:
        # Host API errors are left out: cuda-bindings probes the driver for entry points it may
        # not have (cuGetProcAddress_v2 answering "invalid argument", some 34 per process), which
        # memcheck reports as API errors; the kernels' own accesses are what this run checks.
        cmd = [args.sanitizer, "--tool", "memcheck", "--report-api-errors", "no",
               "--error-exitcode", "99"] + cmd
    return cmd


def _dead_result(cid: str, args, category: str, message: str) -> dict:
    from fuzz.check import CaseResult, normalize
    seed, index = parse_case_id(cid)
    try:
        pattern = gen.generate(seed, index, args.max_elements, args.pattern)["pattern"]
    except Exception:                     # the record of a dead worker must not fail too
        pattern = "?"
    res = CaseResult(cid, pattern, category, signature=normalize(message), message=message,
                     backend=args.backend, seconds=args.timeout if category == "timeout" else 0)
    return res.to_dict()


def run_chunk(args, cases: list[str], emit) -> None:
    """Run `cases` in worker processes, restarting after each death, calling emit(result
    dict) for every case."""
    todo = list(cases)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    while todo:
        proc = subprocess.Popen(_worker_command(args, todo), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        lines: queue.Queue = queue.Queue()
        err_tail: collections.deque = collections.deque(maxlen=40)

        def pump(stream, sink, at_end=None):
            for line in stream:
                sink(line)
            if at_end is not None:
                at_end(None)
        threading.Thread(target=pump, args=(proc.stdout, lines.put, lines.put), daemon=True).start()
        threading.Thread(target=pump, args=(proc.stderr, err_tail.append), daemon=True).start()
        current, started = None, time.monotonic()
        timed_out = False
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if current is not None and time.monotonic() - started > args.timeout:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                continue
            if line is None:
                break
            if not line.startswith(PROTOCOL):
                continue
            kind, _, payload = line[len(PROTOCOL):].rstrip("\n").partition(" ")
            if kind == "START":
                current, started = payload, time.monotonic()
            elif kind == "RESULT":
                res = json.loads(payload)
                emit(res)
                todo.remove(res["id"])
                current = None
        rc = proc.wait()
        if not todo:
            return
        if current is None and rc == EXIT_CONTEXT_LOST:
            continue                   # it reported its case, then left: a fresh worker goes on
        if current is None:
            current = todo[0]          # died before announcing: blame the next case
        if timed_out:
            emit(_dead_result(current, args, "timeout",
                              f"timeout: no result after {args.timeout} s (killed)"))
        else:
            tail = "".join(err_tail)[-2000:]
            category = "illegal_access" if args.backend == "gpu" else "internal_error"
            emit(_dead_result(current, args, category,
                              f"worker died (exit status {rc}) while running the case; "
                              f"stderr tail: {tail.strip()[-600:]}"))
        todo.remove(current)


def run_all(args, ids: list[str]) -> list[dict]:
    results: list[dict] = []
    lock = threading.Lock()
    done = [0]
    t0 = time.monotonic()

    def emit(res: dict) -> None:
        with lock:
            results.append(res)
            done[0] += 1
            if not args.quiet:
                print(f"[{done[0]:5}/{len(ids)} {time.monotonic() - t0:7.0f}s] {res['id']:>10} "
                      f"{res['pattern']:<14} {res['category']:<18} {res['scheduler']:<22} "
                      f"{res['seconds']:7.2f}s {res['signature'][:90]}", flush=True)

    if args.jobs == 0:
        import torch

        from fuzz.check import run_case
        torch.set_num_threads(1)
        for cid in ids:
            seed, index = parse_case_id(cid)
            emit(run_case(gen.generate(seed, index, args.max_elements, args.pattern),
                          args.backend, compile=_compiles(args, index)).to_dict())
        return results
    chunks: queue.Queue = queue.Queue()
    for k in range(0, len(ids), args.chunk):
        chunks.put(ids[k:k + args.chunk])

    def loop():
        while True:
            try:
                chunk = chunks.get_nowait()
            except queue.Empty:
                return
            run_chunk(args, chunk, emit)
    threads = [threading.Thread(target=loop) for _ in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = {cid: k for k, cid in enumerate(ids)}
    results.sort(key=lambda r: order.get(r["id"], 0))
    return results


# Sanitizer -----------------------------------------------------------------------------------
def sanitize(args, results: list[dict]) -> list[dict]:
    """Rerun up to args.sanitize cases under compute-sanitizer memcheck, one process each."""
    from fuzz.check import FAILURES
    failing = [r["id"] for r in results if r["category"] in FAILURES]
    others = [r["id"] for r in results if r["category"] == "right"]
    random.Random(args.seed).shuffle(others)
    picked = (failing + others)[:args.sanitize]
    out: list[dict] = []
    lock = threading.Lock()
    work: queue.Queue = queue.Queue()
    for cid in picked:
        work.put(cid)

    def loop():
        while True:
            try:
                cid = work.get_nowait()
            except queue.Empty:
                return
            t = time.monotonic()
            try:
                p = subprocess.run(_worker_command(args, [cid], sanitize=True), capture_output=True,
                                   text=True, timeout=max(args.timeout, 300))
                text, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                text, rc = f"timeout: {e}", -1
            # memcheck's report lines start with "========="; its closing "ERROR SUMMARY: N
            # errors" line is the count, not an error.
            errors = [ln for ln in text.splitlines() if ln.startswith("=========") and
                      ("Invalid" in ln or "Error" in ln or "error" in ln)
                      and "ERROR SUMMARY" not in ln]
            summary = next((ln for ln in text.splitlines() if "ERROR SUMMARY" in ln), "")
            rec = {"id": cid, "rc": rc, "summary": summary.strip("= "),
                   "errors": errors[:20], "seconds": round(time.monotonic() - t, 1)}
            with lock:
                out.append(rec)
                print(f"[sanitizer] {cid}: {rec['summary'] or 'rc ' + str(rc)}", flush=True)
    # One case per process (an error is that case's), as many processes at once as workers:
    # most of a sanitized case's time is the process start under the sanitizer.
    threads = [threading.Thread(target=loop) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# Reports -------------------------------------------------------------------------------------
def summarize(args, results: list[dict], seconds: float, sanitizer=None) -> str:
    from fuzz.check import CATEGORIES, FAILURES, SLOW_COMPILE_SECONDS
    cats = collections.Counter(r["category"] for r in results)
    lines = [f"pyfuser fuzz: backend {args.backend}, seed {args.seed}, {len(results)} cases "
             f"({args.start}..{args.start + len(results) - 1}), max_elements "
             f"{args.max_elements}, {seconds:.0f} s"]
    for c in CATEGORIES:
        lines.append(f"  {c:<20} {cats.get(c, 0):6}")
    sched = collections.Counter(r["scheduler"] or "(none)" for r in results
                                if r["category"] not in ("definition_error",))
    lines.append("chosen scheduler: " + ", ".join(f"{k} {v}" for k, v in sched.most_common()))
    variants = collections.Counter()
    for r in results:
        if r["run"].startswith("RunInfo(kind='kernels'"):
            for name, pattern in VARIANTS:
                if re.search(pattern, r["run"]):
                    variants[(name, r["category"])] += 1
    if variants:
        lines.append("kernel variants that ran (category: cases): " + "; ".join(
            f"{name} " + ", ".join(f"{c} {variants[(name, c)]}" for c in CATEGORIES
                                  if variants[(name, c)]) for name, _ in VARIANTS
            if any(variants[(name, c)] for c in CATEGORIES)))
    compiled = [r for r in results if r.get("compiled")]
    if compiled:
        kernels = sum(r["compiled"]["kernels"] for r in compiled)
        nvrtc_s = sum(r["compiled"]["seconds"] for r in compiled)
        spilled = [(r["id"], s) for r in compiled for s in r["compiled"]["spills"]]
        lines.append(f"compiled with NVRTC: {kernels} kernels of {len(compiled)} cases "
                     f"({nvrtc_s:.0f} s of NVRTC); ptxas spills in {len(spilled)} kernels"
                     + "".join(f"\n  {cid}: {s}" for cid, s in spilled[:12])
                     + ("\n  ..." if len(spilled) > 12 else ""))
        slow = [(r["id"], s) for r in compiled for s in r["compiled"].get("slow", ())]
        if slow:
            lines.append(f"NVRTC over {SLOW_COMPILE_SECONDS:.0f} s: {len(slow)} kernels"
                         + "".join(f"\n  {cid}: {s}" for cid, s in slow[:12]))
    fallbacks = collections.Counter(r["signature"] for r in results
                                    if r["category"] == "reference_fallback")
    if fallbacks:
        lines.append("reference fallbacks by reason:")
        lines += [f"  {n:5}  {reason}" for reason, n in fallbacks.most_common()]
    for title, which in (("failures", FAILURES), ("generator/frontend problems",
                                                  ("definition_error", "ill_conditioned"))):
        groups = _groups(results, which)
        if groups:
            lines.append(f"{title} by group (category | scheduler | signature):")
            for (cat, sch, sig), members in groups:
                ids = " ".join(m["id"] for m in members[:12]) + (" ..." if len(members) > 12 else "")
                lines.append(f"  {len(members):5}  {cat} | {sch or '-'} | {sig}\n         {ids}")
    if sanitizer is not None:
        bad = [s for s in sanitizer if s["errors"] or (s["summary"] and not
                                                         s["summary"].startswith("ERROR SUMMARY: 0"))]
        lines.append(f"compute-sanitizer memcheck: {len(sanitizer)} cases, {len(bad)} with errors")
        for s in bad:
            lines.append(f"  {s['id']}: {s['summary']}; " + " / ".join(s["errors"][:3]))
    return "\n".join(lines)


# Heuristic fields (in RunInfo's repr) that mark a kernel variant.
VARIANTS = (
    ("tma rows", r"stages=[1-9].*tma_inputs=\(\d"), ("cp.async rows", r"cp_async_inputs=\(\d"),
    ("warp-specialized", r"warp_specialized=True"), ("tensor-map boxes", r"tensor_map=True"),
    ("cluster", r"cluster=[2-9]"), ("chained scan", r"chain=[2-9]|chain=\d\d"),
    ("grid-split reduction", r"grid_split=[2-9]"),
    ("vectorized", r"vector=(2|4|8|16)"),
)


def _groups(results, categories):
    groups = collections.defaultdict(list)
    for r in results:
        if r["category"] in categories:
            groups[(r["category"], r["scheduler"], r["signature"])].append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _repro(args, res: dict) -> str:
    from fuzz.check import CaseResult
    seed, index = parse_case_id(res["id"])
    spec = gen.generate(seed, index, args.max_elements, args.pattern)
    cr = CaseResult.from_dict(res)
    return repro_script(spec, args.backend, cr.tolerances(),
                        summary=f"{res['category']}: {res['message'][:600]}",
                        compile=bool(res.get("compiled")))


def write_reports(args, results, summary: str, sanitizer=None) -> None:
    from fuzz.check import FAILURES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    (out / "summary.txt").write_text(summary + "\n")
    if sanitizer is not None:
        with open(out / "sanitizer.jsonl", "w") as f:
            for s in sanitizer:
                f.write(json.dumps(s) + "\n")
    failing = [r for r in results if r["category"] in FAILURES + ("definition_error",)]
    repro_dir = out / "repro"
    doc = ["# pyfuser fuzz failures", "", "```", summary, "```", ""]
    for (cat, sch, sig), members in _groups(results, FAILURES + ("definition_error",
                                                                   "ill_conditioned")):
        doc += [f"## {cat} | {sch or '-'} | {sig}", "",
                f"{len(members)} case(s): " + " ".join(m["id"] for m in members), ""]
        if args.shrink and cat in FAILURES:
            small = _smallest(args, members)
            doc += [f"Shrunk repro of {small['id']}, the group's smallest case:", "",
                    "```python", _shrunk_repro(args, small), "```", ""]
        for m in members:
            script = _repro(args, m)
            if m in failing and args.repro_files:
                repro_dir.mkdir(exist_ok=True)
                (repro_dir / f"{m['id'].replace(':', '_')}.py").write_text(script)
            tb = "\n".join(m.get("traceback", "").strip().splitlines()[-12:])
            doc += [f"### {m['id']} ({m['pattern']}, {m['seconds']} s)", "",
                    f"{m['message'][:3000]}", "", f"ran: `{m['run'][:600]}`", ""]
            if tb:
                doc += ["```", tb, "```", ""]
            doc += ["```python", script, "```", ""]
    (out / "failures.md").write_text("\n".join(doc))


KNOWN_TEMPLATE = '''"""The fuzzer's CI sample (test_fuzz_sample.py): its constants, and the cases known to fail.

Each known case is a strict xfail: it must keep failing in its category, and a fixed case
turns the test red until its entry is removed. Raise SAMPLE_COUNT when the interpreter gets
faster (the sample should take about 2 minutes on one core); after changing the constants or
the generator (which changes the cases), regenerate this file:

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --sample --jobs 2 \\
        --known-failures tests/fuzz/known_failures.py

Entries read "category: scheduler | normalized reason".
"""
SAMPLE_SEED = {seed}
SAMPLE_COUNT = {count}
SAMPLE_MAX_ELEMENTS = {max_elements}

KNOWN = {{
{entries}}}
'''


def write_known_failures(args, results) -> None:
    from fuzz.check import FAILURES
    refused = FAILURES + ("definition_error", "ill_conditioned")
    entries = []
    for (cat, sch, sig), members in _groups(results, refused):
        entries.append(f"    # {cat} | {sch or '-'} | {sig}"[:100] + "\n")
        for m in members:
            reason = f"{cat}: {sch or '-'} | {sig}"
            entries.append(f"    {m['id']!r}: {reason!r},\n")
    Path(args.known_failures).write_text(KNOWN_TEMPLATE.format(
        seed=args.seed, count=args.count, max_elements=args.max_elements,
        entries="".join(entries)))


def _smallest(args, members: list) -> dict:
    """The member with the fewest input elements, then the fewest ops."""
    def size(m):
        seed, index = parse_case_id(m["id"])
        spec = gen.generate(seed, index, args.max_elements, args.pattern)
        return (sum(i.get("storage", 0) for i in spec["inputs"]), len(spec["ops"]))
    return min(members, key=size)


def _shrunk_repro(args, res: dict) -> str:
    from fuzz.check import run_case
    from fuzz.shrink import shrink
    seed, index = parse_case_id(res["id"])
    spec = gen.generate(seed, index, args.max_elements, args.pattern)

    def still_fails(candidate):
        r = run_case(candidate, args.backend, compile=_compiles(args, index))
        return r.category == res["category"] and r.signature == res["signature"]
    small = shrink(spec, still_fails, budget=args.shrink_budget)
    final = run_case(small, args.backend, compile=_compiles(args, index))
    return repro_script(small, args.backend, final.tolerances(),
                        summary=f"{final.category}: {final.message[:600]}",
                        compile=bool(final.compiled))


# Main ----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("interpret", "gpu"), default="interpret")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument("--count", type=int, default=None, help=f"cases (default {DEFAULT_COUNT})")
    p.add_argument("--long", action="store_true", help=f"{LONG_COUNT} cases")
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes (0: run in this process); default 1, 8 on the GPU")
    p.add_argument("--chunk", type=int, default=None, help="cases per worker process")
    p.add_argument("--timeout", type=float, default=None, help="seconds per case")
    p.add_argument("--max-elements", type=int, default=gen.DEFAULT_MAX_ELEMENTS)
    p.add_argument("--pattern", choices=sorted(gen.PATTERNS), default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--case", action="append", default=[], help="SEED:INDEX to run (repeatable)")
    p.add_argument("--print-repro", default=None, metavar="SEED:INDEX")
    p.add_argument("--sanitize", type=int, default=0, metavar="N",
                   help="rerun N cases under compute-sanitizer memcheck (GPU)")
    p.add_argument("--sanitizer", default=None, help="compute-sanitizer's path (default: PATH, "
                   "then /usr/local/cuda/bin)")
    p.add_argument("--shrink", action="store_true", help="shrink each failure group's first case")
    p.add_argument("--shrink-budget", type=int, default=30)
    p.add_argument("--sample", action="store_true",
                   help="the CI sample's cases (seed, count, max elements of known_failures.py)")
    p.add_argument("--known-failures", default=None, metavar="FILE",
                   help="write the failing cases as a known_failures.py module")
    p.add_argument("--no-repro-files", dest="repro_files", action="store_false",
                   help="no repro/ folder (failures.md still holds every script): for a GPU "
                        "machine whose output folder carries back a few files only")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also compile the interpreted kernels with NVRTC (default: with --long)")
    p.add_argument("--compile-every", type=int, default=None, metavar="K",
                   help="compile the kernels of the cases whose index is a multiple of K")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.print_repro:
        seed, index = parse_case_id(args.print_repro)
        print(repro_script(gen.generate(seed, index, args.max_elements, args.pattern),
                           args.backend))
        return 0
    if args.sample:
        from fuzz import known_failures
        from fuzz.check import SAMPLE_COMPILE_EVERY
        args.seed, args.start = known_failures.SAMPLE_SEED, 0
        args.count = known_failures.SAMPLE_COUNT
        args.max_elements = known_failures.SAMPLE_MAX_ELEMENTS
        if args.compile is None and args.compile_every is None:
            args.compile_every = SAMPLE_COMPILE_EVERY
    gpu = args.backend == "gpu"
    if args.sanitize and args.sanitizer is None:
        import shutil
        args.sanitizer = (shutil.which("compute-sanitizer")
                          or "/usr/local/cuda/bin/compute-sanitizer")
    if args.jobs is None:
        args.jobs = 8 if gpu else 1
    if args.chunk is None:
        args.chunk = 25 if gpu else 10
    if args.timeout is None:
        args.timeout = 180.0 if gpu else 600.0
    if args.count is None:
        args.count = LONG_COUNT if args.long else DEFAULT_COUNT
    if args.compile_every is None:
        args.compile_every = 1 if (args.long if args.compile is None else args.compile) else 0
    if args.case:
        ids = list(args.case)
        args.seed = parse_case_id(ids[0])[0]
    else:
        ids = [case_id(args.seed, k) for k in range(args.start, args.start + args.count)]
    if args.out is None:
        args.out = f"fuzz-{args.backend}-{args.seed}"
    t0 = time.monotonic()
    results = run_all(args, ids)
    san = sanitize(args, results) if args.sanitize else None
    summary = summarize(args, results, time.monotonic() - t0, san)
    write_reports(args, results, summary, san)
    if args.known_failures:
        write_known_failures(args, results)
    print(summary)
    print(f"results, summary, failures.md and repro/ in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
