"""The quality guard's command-line options (compare, verify, experiment; diagnose/compare/quality.py)."""

from __future__ import annotations

from typing import Any

# the judgement's defaults (diagnose/compare/quality.py reads them here, where `diagnose --help` can cheaply)
MIN_AGREEMENT = 0.90  # share of identical greedy outputs below which (whole 95% interval) quality is refuted
MAX_SCORE_DROP = 0.02  # relative drop of the --quality-cmd score that refutes
QUALITY_TIMEOUT_S = 600.0


def quality_options(f: Any) -> Any:
    """The quality guard's command-line options (compare, verify, experiment)."""
    import click

    for opt in reversed((
        click.option("--quality-cmd", metavar="CMD",
                     help="Your evaluation, run once per run ({bundle} and $DIAGNOSE_BUNDLE name the run's bundle; "
                          "its score: the last number on its last output line, higher is better); a score that "
                          "falls by more than --max-score-drop refutes the change (docs/compare.md)."),
        click.option("--quality-timeout", type=float, default=QUALITY_TIMEOUT_S, show_default=True,
                     metavar="SECONDS", help="Stop --quality-cmd after this long (its score is then not measured)."),
        click.option("--min-agreement", type=float, default=MIN_AGREEMENT, show_default=True, metavar="SHARE",
                     help="Greedy runs (attach --greedy): the share of identical outputs for the same prompt below "
                          "which (whole 95% interval) the change is refuted on quality."),
        click.option("--max-score-drop", type=float, default=MAX_SCORE_DROP, show_default=True, metavar="SHARE",
                     help="Relative drop of the --quality-cmd score that refutes the change."),
    )):
        f = opt(f)
    return f
