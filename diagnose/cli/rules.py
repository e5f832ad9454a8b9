"""`diagnose rules list | explain ID | lint | thresholds | signals`."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import settings
from diagnose.errors import InputError
from diagnose.rules.conditions import referenced_thresholds
from diagnose.rules.lint import lint
from diagnose.rules.spec import load_rules, threshold_docs

RULES_DIR_OPT = click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path),
                             help="A directory of your own rules (repeatable).")


@click.group(context_settings=settings())
def rules() -> None:
    """List, explain and lint the diagnosis rules."""


@rules.command("list")
@RULES_DIR_OPT
@click.option("--family", help="Only this family (latency, scheduler, gpu, host, validity, cost, trace).")
def list_rules(rules_dirs: tuple[Path, ...], family: str | None) -> None:
    """One line per rule: id, severity, family, name."""
    specs = load_rules(rules_dirs)
    for s in sorted(specs, key=lambda s: (s.family, s.id)):
        if family and s.family != family:
            continue
        click.echo(f"{s.id:8} {s.severity:9} {s.family:10} {s.name}")
    click.echo(f"{len(specs)} rules")


@rules.command("explain")
@click.argument("rule_id")
@RULES_DIR_OPT
def explain(rule_id: str, rules_dirs: tuple[Path, ...]) -> None:
    """Everything about one rule: what it detects, its condition, causes and experiments."""
    import yaml

    specs = {s.id: s for s in load_rules(rules_dirs)}
    spec = specs.get(rule_id.upper())
    if spec is None:
        raise InputError(f"no rule {rule_id!r} (see `diagnose rules list`)")
    click.echo(f"{spec.id} {spec.name}  [{spec.family}, {spec.severity}]")
    if spec.description:
        click.echo(f"\n{spec.description.strip()}")
    click.echo("\nFires when:\n" + yaml.safe_dump(spec.when, sort_keys=False).rstrip())
    if spec.requires:
        click.echo(f"\nRequires: {', '.join(spec.requires)}")
    docs = threshold_docs()
    used = sorted(referenced_thresholds(spec.raw))
    if used:
        click.echo("\nThresholds (rules/thresholds.yaml; --threshold NAME=VALUE overrides):")
        for name in used:
            d = docs.get(name, {})
            unit = f" {d['unit']}" if d.get("unit") else ""
            click.echo(f"  {name} = {d.get('value', '?')}{unit}" + (f"  ({d['description']})" if d.get("description") else ""))
    click.echo(f"\nKind: {spec.kind}" + (" (restates what is out of line; ranked after every cause)"
                                         if spec.kind == "symptom" else ""))
    if spec.explains:
        click.echo("Explains (shown as its consequences, their advice dropped, when both fire): "
                   + ", ".join(f"{i} {specs[i].name}" if i in specs else i for i in spec.explains))
    explained_by = sorted(s.id for s in specs.values() if spec.id in s.explains)
    if explained_by:
        click.echo("Explained by (the causes that link to it): "
                   + ", ".join(f"{i} {specs[i].name}" for i in explained_by))
    if spec.share:
        click.echo(f"Share of the symptom it explains: {' or '.join(spec.share)} (first known)")
    click.echo("\nCandidate causes:")
    for c in spec.causes:
        click.echo(f"- {c['cause']}")
        if c.get("confirm"):
            click.echo(f"    confirm: {c['confirm']}")
        if c.get("refute"):
            click.echo(f"    refute:  {c['refute']}")
        for key, label in (("supported_when", "supported when"), ("refuted_when", "ruled out when")):
            if c.get(key):
                click.echo(f"    {label}: {yaml.safe_dump(c[key], default_flow_style=True, width=10_000).strip()}")
        exp = c.get("experiment") or {}
        if exp:
            moves = ", ".join(f"{k} {v}" for k, v in (exp.get("expect") or {}).items())
            click.echo(f"    experiment: {exp.get('change')}" + (f" (expect {moves})" if moves else ""))
    click.echo(f"\nFile: {spec.path}")


@rules.command("lint")
@RULES_DIR_OPT
@click.option("--cases", "cases_dirs", multiple=True, type=click.Path(path_type=Path),
              help="Where case files live (default: tests/rules/cases if present).")
def lint_cmd(rules_dirs: tuple[Path, ...], cases_dirs: tuple[Path, ...]) -> None:
    """Check rule files: schema, undeclared signals/thresholds, duplicate ids, missing fires/quiet cases.

    A signal name must be declared exactly in the signal catalogue (`diagnose rules signals`)."""
    dirs = list(cases_dirs) or [p for p in [Path("tests/rules/cases")] if p.is_dir()]
    problems = lint(list(rules_dirs), dirs)
    for p in problems:
        click.echo(p)
    if problems:
        raise click.exceptions.Exit(1)
    click.echo("rules: OK")


@rules.command("thresholds")
def thresholds() -> None:
    """Every threshold with its default value, unit and meaning."""
    for name, doc in sorted(threshold_docs().items()):
        click.echo(f"{name:32} {doc['value']:>10g} {doc.get('unit', ''):10} {doc.get('description', '')}")


@rules.command("signals")
@click.option("--source", type=click.Choice(["client", "server", "host", "gpu", "trace", "derived"]),
              help="Only the signals of this source.")
def signals(source: str | None) -> None:
    """Every declared signal: name, unit, source, producer and meaning (the names rules may use)."""
    from diagnose.signals.catalog import CATALOG

    n = 0
    for name, spec in sorted(CATALOG.items()):
        if source and spec.source != source:
            continue
        n += 1
        click.echo(f"{name:40} {spec.unit:9} {spec.source:8} {spec.producer:30} {spec.description}")
    click.echo(f"{n} signals")
