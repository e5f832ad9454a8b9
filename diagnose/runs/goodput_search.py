"""``attach --find-max-goodput``: one ``diagnose attach`` capture per load level the search asks for (each its
own bundle under ``<out>/levels/``, analysed by the normal pipeline), then ``search.json`` and ``report.html``
in ``<out>`` (diagnose/runs/goodput.py has the search, docs/compare.md the method)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from diagnose.errors import DiagnoseError, InputError

# attach options the search sets per level itself (or that make no sense per level)
_OWN = frozenset({"output", "force", "report", "find_max_goodput", "search_steps", "concurrency", "rate", "baseline",
                  "observe", "workload", "speed", "loop", "prometheus", "selector", "since", "launch", "verify"})


def level_args(ctx: click.Context, skip: frozenset[str] = _OWN) -> list[str]:
    """The attach command line the user gave, as options, less those named in ``skip`` (by default the ones
    the search sets per level): every option whose value differs from its default, flags by their on/off
    spelling."""
    out: list[str] = []
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name is None or p.name in skip:
            continue
        v = ctx.params.get(p.name)
        if v is None or v == p.default:
            continue
        if p.is_flag and p.secondary_opts:
            out.append(p.opts[0] if v else p.secondary_opts[0])
        elif p.is_flag:
            if v:
                out.append(p.opts[0])
        elif p.multiple:
            for x in v:
                out += [p.opts[0], str(x)]
        else:
            out += [p.opts[0], str(v)]
    return out


def _label(kind: str, level: float) -> str:
    return f"c={int(level)}" if kind == "concurrency" else f"rate={level:g}"


def run_search(o: Mapping[str, Any], ctx: click.Context, slo: dict[str, float],
               log: Callable[[str], None]) -> int:
    from diagnose.capture.workload import parse_levels
    from diagnose.pipeline import analyze
    from diagnose.runs.goodput import level_point, search, slo_metrics, summary_lines

    slo_metrics(slo)  # a one-line error before anything runs
    for opt in ("observe", "workload", "prometheus"):
        if o.get(opt):
            raise InputError(f"--find-max-goodput sends its own load levels: drop --{opt}")
    if o.get("concurrency") and o.get("rate"):
        raise InputError("give --concurrency or --rate, not both")
    kind = "rate" if o.get("rate") else "concurrency"
    ladder = parse_levels(str(o.get("rate") or o.get("concurrency") or "1:256:x2"), kind)
    if kind == "concurrency" and any(v != int(v) for v in ladder):
        raise InputError("--concurrency: whole numbers")
    steps = int(o.get("search_steps") or 0)
    if steps < 0:
        raise InputError(f"--search-steps {steps}: use 0 or more")
    out = Path(o["output"] or "diagnose-goodput")
    if out.exists() and any(out.iterdir()) and not o.get("force"):
        raise InputError(f"{out}: exists and is not empty (use --force to replace it)")
    (out / "levels").mkdir(parents=True, exist_ok=True)
    base = level_args(ctx)
    first = [True]

    def measure(level: float, step: str) -> Any:
        label = _label(kind, level)
        dest = out / "levels" / label
        baseline = str(o.get("baseline", 8)) if first[0] else "0"  # the reference once, with the first level
        first[0] = False
        argv = [sys.executable, "-m", "diagnose", "attach", *base, "--concurrency" if kind == "concurrency"
                else "--rate", f"{int(level)}" if kind == "concurrency" else f"{level:g}", "--baseline", baseline,
                "-o", str(dest), "--force"]
        log(f"measuring {label} ({step})")
        with open(out / "levels" / f"{label}.log", "w") as f:
            p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, text=True, check=False)
        if p.returncode != 0:
            last = (Path(f.name).read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise DiagnoseError(f"the capture at {label} into {dest} failed (exit {p.returncode}): {last}")
        point = level_point(analyze(dest), level, label, slo)
        point.step = step
        log(f"  {label}: {'meets' if point.meets else 'fails'} the SLO, {point.output_tps:.4g} tok/s")
        return point

    result = search(measure, ladder, kind, max_bisections=steps)
    result.slo = dict(slo)
    lines = summary_lines(result)
    from diagnose.cli.common import _json, _write
    from diagnose.io import schemas
    from diagnose.io.schemas import versioned
    from diagnose.reports.goodput import render_search

    data = result.to_json()
    _write(out / "search.json", _json(versioned(schemas.SEARCH, data)))
    _write(out / "report.html", render_search(data, lines).encode())
    for line in lines:
        click.echo(line)
    click.echo(f"written: {out / 'search.json'}, {out / 'report.html'}")
    return 0

