"""`diagnose compare A B` (two runs side by side, with confidence intervals; a CI gate) and
`diagnose verify BEFORE AFTER` (confirm or refute a finding's hypothesis from a run with its experiment)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from diagnose.cli import exits
from diagnose.errors import DiagnoseError, InputError

if TYPE_CHECKING:  # pandas/numpy: `diagnose --help` must not pay for them
    from diagnose.compare.core import Comparison
    from diagnose.compare.verify import Verification


def _analyze(path: Path) -> Any:
    from diagnose.pipeline import analyze

    return analyze(path)


def _write(path: Path | None, data: bytes) -> None:
    """Through the one output writer (diagnose/io/outputs.py: temp file and rename, or in place onto a device or
    FIFO; nothing left behind on failure); one-line error."""
    if path is None:
        return
    from diagnose.io.outputs import write_bytes

    write_bytes(path, data, parents=True)


SEED_MAX = 2**32 - 1


def check_seed(seed: int) -> None:
    if not 0 <= seed <= SEED_MAX:
        raise InputError(f"--seed {seed}: use an integer from 0 to {SEED_MAX}")


def _json(obj: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def _pct(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:+.1%}"


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
    for g in c.gate:
        if g["regressed"]:
            lines.append(f"  REGRESSION at {g['level']}: {g['metric']} {_pct(g['rel'])} "
                         f"(allowed {g['allowed']:+.0%}; {g.get('why') or 'significant'})")
        elif g.get("outcome") == "undecided":
            where = f"at {g['level']}" if g["level"] is not None else "(no level)"
            lines.append(f"  GATE UNDECIDED {where}: {g['metric']} {_pct(g['rel'])} (allowed {g['allowed']:+.0%}): "
                         f"{g['why']}")
    return lines


@click.command(epilog=exits.epilog(exits.COMPARE_CODES))
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
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def compare(a: Path, b: Path, output: Path | None, json_out: Path | None, confidence: float, resamples: int,
            resample: str, seed: int, gate: str | None, cost: str | None, noise: float, quiet: bool,
            allow_undecided: bool = False) -> None:
    """Compare two runs (bundles, or two traces): per matched load level, every latency percentile,
    throughput and goodput of B against A with a bootstrap confidence interval, better / worse / no
    significant change; what differs between the runs; which findings appeared or went away.

    A is the baseline, B the new run. With --fail-on-regression it is a CI gate.
    """
    from diagnose import compare as cmp
    from diagnose.compare import gate as gate_rules
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    cmp.check_options(confidence, resamples, resample)
    cmp.check_noise(noise)
    check_seed(seed)
    rules = gate_rules.parse_gate(gate) if gate is not None else None
    if allow_undecided and rules is None:
        raise InputError("--allow-undecided: only with --fail-on-regression")
    prices = cmp.parse_cost(cost) if cost else None
    check_outputs((("-o", output), ("--json", json_out)), (a, b))
    with terminate_interrupts():  # SIGTERM: exit 130 with no temporary file left, as Ctrl-C
        c, recorded = _compare(cmp, a, b, output, json_out, confidence, resamples, resample, seed, rules, prices,
                               noise)
    if not quiet:
        for line in comparison_lines(c):
            click.echo(line)
        if recorded is not None:
            click.echo(f"cost: at the prices recorded by the captures (A ${recorded[0]:.3g}/h, B ${recorded[1]:.3g}/h)")
        outs = [str(p) for p in (output, json_out) if p is not None]
        if outs:
            click.echo("written: " + ", ".join(outs))
    if any(g["regressed"] for g in c.gate):
        raise click.exceptions.Exit(exits.REGRESSION)
    if any(g.get("outcome") == "undecided" for g in c.gate) and not allow_undecided:
        click.echo(f"diagnose: the gate could not judge every metric (exit {exits.UNDECIDED}; "
                   "--allow-undecided passes them)", err=True)
        raise click.exceptions.Exit(exits.UNDECIDED)


def _compare(cmp: Any, a: Path, b: Path, output: Path | None, json_out: Path | None, confidence: float,
             resamples: int, resample: str, seed: int, rules: Any, prices: tuple[float, float] | None,
             noise: float) -> tuple[Comparison, tuple[float, float] | None]:
    an_a, an_b = _analyze(a), _analyze(b)
    recorded = cmp.recorded_prices(an_a, an_b) if prices is None else None
    c = cmp.compare(an_a, an_b, confidence=confidence, resamples=resamples, seed=seed,
                    resample=resample, cost_per_hour=prices or recorded, noise=noise)
    if rules:
        from diagnose.compare.gate import apply_gate

        apply_gate(c, rules)
    _write(json_out, _json(c.to_json()))
    if output is not None:
        from diagnose.reports.compare import render_comparison

        _write(output, render_comparison(c.to_json()).encode("utf-8"))
    return c, recorded


def verification_lines(v: Verification) -> list[str]:
    lines = [v.headline(), f"  finding: {v.finding} {v.title}", f"  experiment: {v.change}",
             f"  at level {v.level}: {v.reason}; in the new run the finding {_after(v.finding_after)}"]
    for m in v.moves:
        iv = f" [{_pct(m.interval[0])}, {_pct(m.interval[1])}]" if m.interval else ""
        lines.append(f"  expected {m.signal} {m.expect}: {_pct(m.rel)}{iv} -> {m.outcome}")
    if v.worse_elsewhere:
        lines.append("  significantly worse elsewhere: " + ", ".join(v.worse_elsewhere))
    return lines


@click.command(epilog=exits.epilog(exits.VERIFY_CODES))
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--finding", metavar="RULE_ID", help="The finding of BEFORE to verify (default: the verdict's top one).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the verification as JSON.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the comparison as an HTML report.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="Confidence of the intervals.")
@click.option("--resamples", type=int, default=2000, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the resampling.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def verify(before: Path, after: Path, finding: str | None, json_out: Path | None, output: Path | None,
           confidence: float, resamples: int, seed: int, quiet: bool) -> None:
    """Confirm or refute a finding of BEFORE from AFTER, a run with the finding's experiment applied: did
    the signals its hypothesis names move the predicted way, significantly, without breaking the SLO?"""
    from diagnose import compare as cmp
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    cmp.check_options(confidence, resamples, "blocks")
    check_seed(seed)
    check_outputs((("-o", output), ("--json", json_out)), (before, after))
    with terminate_interrupts():
        v = cmp.verify(_analyze(before), _analyze(after), finding=finding, confidence=confidence,
                       resamples=resamples, seed=seed)
        _write(json_out, _json(v.to_json()))
        if output is not None:
            from diagnose.reports.compare import render_comparison

            _write(output, render_comparison(v.comparison.to_json(), verification=v.to_json()).encode("utf-8"))
    if not quiet:
        for line in verification_lines(v):
            click.echo(line)
    if v.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if v.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)


def _after(state: str) -> str:
    return {"gone": "is gone", "weaker": "is weaker"}.get(state, state)


@click.command(epilog=exits.epilog(exits.VERIFY_CODES + (exits.TARGET,)),
               context_settings={"ignore_unknown_options": True})
@click.option("--launch", "launch_cmd", required=True, metavar="COMMAND",
              help="The server command line, e.g. \"vllm serve MODEL --port 8000 --max-num-seqs 2\". diagnose "
                   "starts it, and restarts it with the experiment's one flag changed.")
@click.option("--url", required=True, help="Where that server answers, e.g. http://127.0.0.1:8000.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Folder for both bundles, the verification (verify.json) and its report (report.html).")
@click.option("--finding", metavar="RULE_ID", help="Run this finding's experiment (default: the verdict's top one).")
@click.option("--set", "override", metavar="FLAG=VALUE",
              help="Change this engine flag instead of the finding's variable (e.g. to test another cause).")
@click.option("--startup-timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the server.")
@click.option("--warmup-s", "warmup_s", type=float, default=10.0, show_default=True,
              help="After each start, send this many seconds of the same load first (not measured), so both "
                   "runs are warm; 0: measure from a cold start.")
@click.argument("attach_args", nargs=-1, type=click.UNPROCESSED)
def experiment(launch_cmd: str, url: str, output: Path, finding: str | None, override: str | None,
               startup_timeout: float, warmup_s: float, attach_args: tuple[str, ...]) -> None:
    """Run the top finding's experiment: start the server, capture (ATTACH_ARGS are `diagnose attach`'s
    workload options, e.g. -- --concurrency 16 --duration 15s), diagnose, restart it with the one engine
    flag the experiment names changed, capture the same workload again, and verify: confirmed (0),
    refuted (7) or inconclusive (8). diagnose only ever changes the server it started here."""
    from diagnose import compare as cmp
    from diagnose.runs import experiment as er

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    import signal

    def _term(_sig: int, _frame: object) -> None:  # SIGTERM: stop the server we started, as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    url = er.check_url(url)
    argv = er.split_launch(launch_cmd)  # bad input is a usage error (exit 2), before anything starts
    pair = er.parse_set(override) if override else None
    startup_timeout = er.check_startup_timeout(startup_timeout)
    er.refuse_running(url)
    output.mkdir(parents=True, exist_ok=True)
    args = list(attach_args[1:] if attach_args[:1] == ("--",) else attach_args)
    log("run 1 of 2: as given")
    if not (warmup_s >= 0 and math.isfinite(warmup_s)):
        raise DiagnoseError(f"--warmup-s {warmup_s}: expected seconds >= 0")
    record: dict[str, Any] = {"launch": argv, "url": url, "attach_args": args, "warmup_s": warmup_s}
    record["invalid_tries_before"] = er.valid_capture(argv, url, output / "before", args, log, startup_timeout,
                                                      warmup_s)
    p, why = er.plan(output / "before", argv, finding, pair)
    if p is None:
        record["not_run"] = why
        _write(output / "experiment.json", _json(record))
        click.echo(f"inconclusive: not run: {why}")
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
    record.update(finding=p.finding, variable=p.variable, flag=p.flag, value=p.value, launch_after=p.argv_after)
    _write(output / "experiment.json", _json(record))
    how = "the flag given with --set" if pair else f"{p.finding}'s experiment"
    log(f"run 2 of 2: {how}: {p.flag} {p.value}".rstrip())
    record["invalid_tries_after"] = er.valid_capture(p.argv_after, url, output / "after", args, log,
                                                     startup_timeout, warmup_s)
    _write(output / "experiment.json", _json(record))
    v = cmp.verify(_analyze(output / "before"), _analyze(output / "after"), finding=p.finding)
    _write(output / "verify.json", _json({**v.to_json(), "experiment": record}))
    from diagnose.reports.compare import render_comparison

    _write(output / "report.html", render_comparison(v.comparison.to_json(), verification=v.to_json()).encode())
    for line in verification_lines(v):
        click.echo(line)
    click.echo(f"written: {output / 'verify.json'}, {output / 'report.html'}")
    if v.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if v.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
