"""Count the hops from `diagnose analyze` to the HTML, and the calls that reach back to an earlier stage.

    .venv/bin/python tools/hops.py [SAMPLE_OR_BUNDLE] [--edges]

It runs the command's own code path in process (diagnose.cli.analyze: analysis, view, HTML into a temporary
file) under a profiler hook and records every call from a function of one product module into a function of
another. Definitions (docs/ARCHITECTURE.md cites the output):

- a *module edge* is a distinct (caller module, callee module) pair seen during the run;
- the *stage path* is the sequence of stages the run's product calls pass through, in the order first entered
  (input and output, tables, signals, judgement, view, CLI), and its *hops* are the edges between stages;
- a *reach-back* is an edge from a later stage into an earlier one that computes: the stages are ordered
  tables, signals, judgement, view, CLI (the view calling the table stage or the shared request statistics,
  the judgement calling the table stage, ...). The orchestrator (diagnose.pipeline) calls every stage, and
  every stage may read and write files (input/output): neither is a reach-back. Calls into the shared central
  types (model, analysis, errors, number formatting, redaction) are not counted, nor a module's import.

Exit status 0; the counts are printed, one per line, then the reach-back edges with one call site each.
"""

from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("input/output", "orchestrator", "tables", "signals", "judgement", "view", "cli")
# a call from a later one into an earlier one reaches back; signals are computed from tables (one rank)
ORDERED = ("tables", "signals", "judgement", "view", "cli")
RANK = {"tables": 0, "signals": 0, "judgement": 1, "view": 2, "cli": 3}
# module name prefixes -> stage; first match wins
STAGE_OF: tuple[tuple[str, str | None], ...] = (
    ("diagnose.model", None), ("diagnose.analysis", None), ("diagnose.errors", None), ("diagnose.numbers", None),
    ("diagnose.capture.redact", None),
    ("diagnose.cli", "cli"),
    ("diagnose.reports", "view"),
    ("diagnose.rules", "judgement"), ("diagnose.engines.experiments", "judgement"),
    ("diagnose.pipeline", "orchestrator"),
    ("diagnose.signals", "signals"), ("diagnose.normalize.derived", "signals"),
    ("diagnose.normalize", "tables"), ("diagnose.trace", "tables"), ("diagnose.requests", "tables"),
    ("diagnose.engines.detect", "tables"), ("diagnose.capture.profiler_window", "tables"),
    ("diagnose.capture.overhead", "tables"),
    ("diagnose.", "input/output"),
)


def stage(module: str) -> str | None:
    for prefix, st in STAGE_OF:
        if module == prefix or module.startswith(prefix + ".") or (prefix.endswith(".") and module.startswith(prefix)):
            return st
    return None


def run(source: Path) -> tuple[dict[tuple[str, str], tuple[str, str]], list[str]]:
    edges: dict[tuple[str, str], tuple[str, str]] = {}
    order: list[str] = []

    def module_of(frame: FrameType) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if isinstance(name, str) and name.startswith("diagnose") else None

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":  # an import runs a module: no data passes
            return
        callee = module_of(frame)
        if callee is None:
            return
        caller_frame = frame.f_back
        while caller_frame is not None and module_of(caller_frame) is None:
            caller_frame = caller_frame.f_back
        st = stage(callee)
        if st is not None and (not order or order[-1] != st) and st not in order:
            order.append(st)
        if caller_frame is None:
            return
        caller = module_of(caller_frame)
        if caller is None or caller == callee:
            return
        edges.setdefault((caller, callee), (caller_frame.f_code.co_name, frame.f_code.co_name))

    from diagnose.cli.analyze import run_analysis
    from diagnose.reports.render import write_report

    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(hook)
        try:
            analysis = run_analysis(source)
            write_report(analysis, Path(tmp) / "report.html")
        finally:
            sys.setprofile(None)
    return edges, order


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    source = Path(args[0]) if args else ROOT / "sample_traces" / "vllm_cpu_queue_bound"
    edges, order = run(source)
    rank = RANK
    by_stage: dict[tuple[str, str], int] = defaultdict(int)
    back: list[tuple[str, str, tuple[str, str]]] = []
    for (a, b), site in sorted(edges.items()):
        sa, sb = stage(a), stage(b)
        if sa is None or sb is None:
            continue
        if sa != sb:
            by_stage[(sa, sb)] += 1
        if sa in rank and sb in rank and rank[sa] > rank[sb]:
            back.append((a, b, site))
    print(f"source: {source}")
    print(f"module edges: {len(edges)}")
    print(f"stage path: {' -> '.join(order)} ({max(len(order) - 1, 0)} hops)")
    print(f"stage edges: {len(by_stage)} ({', '.join(f'{a}->{b} x{n}' for (a, b), n in sorted(by_stage.items()))})")
    print(f"reach-backs: {len(back)}")
    for a, b, (fa, fb) in back:
        print(f"  {a}.{fa} -> {b}.{fb}")
    if "--edges" in argv:
        for (a, b), (fa, fb) in sorted(edges.items()):
            print(f"edge {a}.{fa} -> {b}.{fb}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
