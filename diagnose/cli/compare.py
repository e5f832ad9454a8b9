"""`diagnose compare A B`: two runs side by side, with confidence intervals; a CI gate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from diagnose.cli import exits, settings
from diagnose.cli.common import _analyze, _json, _pct, _write, check_seed
from diagnose.cli.quality_options import MAX_SCORE_DROP, MIN_AGREEMENT, QUALITY_TIMEOUT_S, quality_options
from diagnose.errors import InputError
from diagnose.io import schemas
from diagnose.io.schemas import versioned

if TYPE_CHECKING:  # pandas/numpy: `diagnose --help` must not pay for them
    from diagnose.compare.core import Comparison


def comparison_lines(c: Comparison) -> list[str]:
    comp = c.comparability
    lines = [f"A: {c.a}", f"B: {c.b}"]
    lines += [f"  not comparable: {p}" for p in comp["problems"]]
    lines.append(f"  {comp['attribution']}")
    lines += [f"  note: {d}" for d in comp.get("host_drift", [])]
    for ch in comp["changed"]:
        lines.append(f"  changed: {ch['what']}: {ch['a']!r} -> {ch['b']!r}")
    for lv in c.levels:
        lines.append(f"level {lv.label}: {lv.n_a} vs {lv.n_b} measured requests "
                     f"({c.confidence:.0%} intervals, {c.resamples} resamples of {c.resample}; "
                     f"noise band +-{c.noise:.0%})")
        for side, runs, sp in (("A", lv.runs_a, lv.spread_a), ("B", lv.runs_b, lv.spread_b)):
            if sp:
                lines.append(f"  {side}: {runs} runs (resampled runs first, then blocks; where Student's t over "
                             "the runs' values is wider, it is the interval), run-to-run spread (max - min) / median: "
                             + ", ".join(
                    f"{k} {v['spread']:.0%}" for k, v in sp.items() if v["spread"] is not None))
        order = {"worse": 0, "better": 1, "within noise": 2, "no significant change": 3, "too few requests": 4,
                 "not comparable": 5}
        for m in sorted(lv.metrics, key=lambda m: order.get(m.verdict, 9)):
            if m.verdict == "not comparable" and not (math.isfinite(m.a) or math.isfinite(m.b)):
                continue
            lines.append(f"  {m.metric:<14} {m.a:>10.4g} -> {m.b:<10.4g} {m.unit:<6} {_pct(m.rel):>8} "
                         f"[{_pct(m.rel_lo)}, {_pct(m.rel_hi)}]  {m.verdict}"
                         + ("  (interval: Student's t over the runs)" if m.interval == "runs' t" else ""))
    for t in c.trace:
        lines.append(f"  {t['what']:<40} {t['a'] if t['a'] is not None else 'n/a':>10} -> "
                     f"{t['b'] if t['b'] is not None else 'n/a'} {t['unit']} ({_pct(t['rel'])})")
    for f in c.findings:
        if f["change"] != "unchanged":
            lines.append(f"  finding {f['rule']}: {f['change']} ({f['title_b'] or f['title_a']})")
    lines += [f"  no gain: {j}" for j in c.judgements]
    from diagnose.compare.quality import lines as quality_lines

    lines += quality_lines(c.quality)
    for g in c.gate:
        if g["regressed"]:
            lines.append(f"  REGRESSION at {g['level']}: {g['metric']} {_pct(g['rel'])} "
                         f"(allowed {g['allowed']:+.0%}; {g.get('why') or 'significant'})")
        elif g.get("outcome") == "undecided":
            where = f"at {g['level']}" if g["level"] is not None else "(no level)"
            lines.append(f"  GATE UNDECIDED {where}: {g['metric']} {_pct(g['rel'])} (allowed {g['allowed']:+.0%}): "
                         f"{g['why']}")
    return lines


@click.command(epilog=exits.epilog(exits.COMPARE_CODES), context_settings=settings())
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the comparison as an HTML report.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the comparison as JSON.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="Confidence of the intervals.")
@click.option("--resamples", type=int, default=2000, show_default=True, help="Bootstrap resamples.")
@click.option("--resample", type=click.Choice(["blocks", "requests"]), default="blocks", show_default=True,
              help="What the bootstrap draws for latency: blocks of time (default; requests of a loaded server "
                   "are not independent) or single requests. Throughput always draws blocks of time.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the resampling.")
@click.option("--fail-on-regression", "gate", metavar="METRIC=PCT%,...",
              help=f"Exit with status {exits.REGRESSION} when a metric is significantly worse by more than PCT "
                   "(latency and cost: a rise, >= 0%; throughput: a drop, <= 0%), e.g. ttft_p99=5%,output_tps=-3%; "
                   f"with status {exits.UNDECIDED} when the gate cannot judge a metric (docs/compare.md).")
@click.option("--allow-undecided", is_flag=True,
              help=f"With --fail-on-regression: a metric the gate cannot judge passes (exit 0, not "
                   f"{exits.UNDECIDED}); it is still listed.")
@click.option("--cost-per-hour", "cost", metavar="PRICE[,PRICE_B]",
              help="Price of an hour of the deployment (A's, and B's when it differs; each PRICE or PRICExDEVICES): adds "
                   "cost per million output tokens, per request and per request within the SLO, with intervals. "
                   "Default: the prices the two captures recorded (attach --cost-per-hour), when both did.")
@click.option("--noise", type=float, default=0.10, show_default=True, metavar="SHARE",
              help="Run-to-run noise band: better/worse only when the whole interval of the relative change lies "
                   "beyond +-SHARE (0: any significant change counts). The CI gate uses its own allowances.")
@quality_options
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def compare(a: Path, b: Path, output: Path | None, json_out: Path | None, confidence: float, resamples: int,
            resample: str, seed: int, gate: str | None, cost: str | None, noise: float, quiet: bool,
            allow_undecided: bool = False, quality_cmd: str | None = None,
            quality_timeout: float = QUALITY_TIMEOUT_S, min_agreement: float = MIN_AGREEMENT,
            max_score_drop: float = MAX_SCORE_DROP) -> None:
    """Compare two runs (bundles, or two traces): per matched load level, every latency percentile,
    throughput and goodput of B against A with a bootstrap confidence interval, better / worse / no
    significant change; what differs between the runs; which findings appeared or went away.

    A is the baseline, B the new run. With --fail-on-regression it is a CI gate (outputs that no longer agree,
    or a --quality-cmd score that fell, fail it too).
    """
    from diagnose import compare as cmp
    from diagnose.compare import gate as gate_rules
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    cmp.check_options(confidence, resamples, resample)
    cmp.check_noise(noise)
    from diagnose.compare.quality import check_options as check_quality

    check_quality(min_agreement, max_score_drop, quality_timeout)
    check_seed(seed)
    rules = gate_rules.parse_gate(gate) if gate is not None else None
    if allow_undecided and rules is None:
        raise InputError("--allow-undecided: only with --fail-on-regression")
    prices = cmp.parse_cost(cost) if cost else None
    check_outputs((("-o", output), ("--json", json_out)), (a, b))
    with terminate_interrupts():  # SIGTERM: exit 130 with no temporary file left, as Ctrl-C
        c, recorded = _compare(cmp, a, b, output, json_out, confidence, resamples, resample, seed, rules, prices,
                               noise, (quality_cmd, quality_timeout, min_agreement, max_score_drop))
    if not quiet:
        for line in comparison_lines(c):
            click.echo(line)
        if recorded is not None:
            click.echo(f"cost: at the prices recorded by the captures (A ${recorded[0]:.3g}/h, B ${recorded[1]:.3g}/h)")
        outs = [str(p) for p in (output, json_out) if p is not None]
        if outs:
            click.echo("written: " + ", ".join(outs))
    if any(g["regressed"] for g in c.gate) or (rules and c.quality and c.quality["failed"]):
        raise click.exceptions.Exit(exits.REGRESSION)
    if any(g.get("outcome") == "undecided" for g in c.gate) and not allow_undecided:
        click.echo(f"diagnose: the gate could not judge every metric (exit {exits.UNDECIDED}; "
                   "--allow-undecided passes them)", err=True)
        raise click.exceptions.Exit(exits.UNDECIDED)


def _compare(cmp: Any, a: Path, b: Path, output: Path | None, json_out: Path | None, confidence: float,
             resamples: int, resample: str, seed: int, rules: Any, prices: tuple[float, float] | None,
             noise: float, q: tuple[str | None, float, float, float] = (None, QUALITY_TIMEOUT_S, MIN_AGREEMENT,
                                                                        MAX_SCORE_DROP),
             ) -> tuple[Comparison, tuple[float, float] | None]:
    an_a, an_b = _analyze(a), _analyze(b)
    recorded = cmp.recorded_prices(an_a, an_b) if prices is None else None
    c = cmp.compare(an_a, an_b, confidence=confidence, resamples=resamples, seed=seed,
                    resample=resample, cost_per_hour=prices or recorded, noise=noise)
    from diagnose.compare.quality import quality

    c.quality = quality(str(a), str(b), *q)
    if rules:
        from diagnose.compare.gate import apply_gate

        apply_gate(c, rules)
    _write(json_out, _json(versioned(schemas.COMPARISON, c.to_json())))
    if output is not None:
        from diagnose.reports.compare import render_comparison

        _write(output, render_comparison(c.to_json()).encode("utf-8"))
    return c, recorded
