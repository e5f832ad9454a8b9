"""Every exit status of the `diagnose` command, in one table that `--help` prints and tests check.

Standard library only: `diagnose --help` and `--version` import this, and must not pay for pandas or numpy.
"""

from __future__ import annotations

OK = 0
ERROR = 1  # a user-facing failure: cannot write the report, unreadable file; `rules lint` found problems
USAGE = 2  # bad command line (click), or an input that is not a bundle/trace/spans file or has a bad format
TARGET = 3  # `attach`: the server cannot be reached or answers so that no capture is possible
FAIL_ON = 4  # `analyze --fail-on SEVERITY`: a finding this severe or worse fired
INVALID_RUN = 5  # `analyze`: the run is invalid (e.g. the load client was the bottleneck); the report is written
REGRESSION = 6  # `compare --fail-on-regression`: a metric is significantly worse than allowed
REFUTED = 7  # `verify`: the experiment refuted the hypothesis
INCONCLUSIVE = 8  # `verify`: the runs cannot confirm or refute it
UNDECIDED = 9  # `compare --fail-on-regression`: the gate could not judge a metric (and no --allow-undecided)
INTERNAL = 70  # a bug in diagnose (EX_SOFTWARE); DIAGNOSE_DEBUG=1 shows the traceback
INTERRUPTED = 130  # Ctrl-C / SIGTERM; `attach` keeps a valid partial bundle

# (code, meaning) in the order --help lists them
TABLE: tuple[tuple[int, str], ...] = (
    (OK, "success"),
    (ERROR, "error: a file cannot be read or written; attach: the load failed; rules lint: problems found"),
    (USAGE, "usage: bad option or argument, or an input that is not a bundle, trace or span file"),
    (TARGET, "attach: the server cannot be reached or cannot be captured"),
    (FAIL_ON, "analyze --fail-on: a finding of that severity or worse fired"),
    (INVALID_RUN, "analyze: the run is invalid (e.g. the client was the bottleneck); report and --json are written"),
    (REGRESSION, "compare --fail-on-regression: a metric is significantly worse than the change allowed"),
    (REFUTED, "verify: the experiment refuted the hypothesis"),
    (INCONCLUSIVE, "verify: the runs neither confirm nor refute the hypothesis"),
    (UNDECIDED, "compare --fail-on-regression: the gate could not judge a metric (too few requests, not measured, "
                "no common load level); --allow-undecided passes it"),
    (INTERNAL, "internal error (a bug; set DIAGNOSE_DEBUG=1 for the traceback)"),
    (INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)"),
)
ANALYZE_CODES = (OK, ERROR, USAGE, FAIL_ON, INVALID_RUN, INTERNAL, INTERRUPTED)
COMPARE_CODES = (OK, ERROR, USAGE, REGRESSION, UNDECIDED, INTERNAL, INTERRUPTED)
VERIFY_CODES = (OK, ERROR, USAGE, REFUTED, INCONCLUSIVE, INTERNAL, INTERRUPTED)


def epilog(codes: tuple[int, ...] | None = None, extra: str = "") -> str:
    """The "Exit status" paragraph of a --help text (``\\b`` keeps click from re-wrapping the lines)."""
    rows = [(c, m) for c, m in TABLE if codes is None or c in codes]
    lines = ["\b", "Exit status:"] + [f"  {c:<4} {m}" for c, m in rows]
    if extra:
        lines.append(f"  {extra}")
    return "\n".join(lines)
