"""diagnose's Python API (docs/api.md): capture a bundle, analyse it, write its report or its JSON document.

    from diagnose import api

    bundle = api.capture(url="http://127.0.0.1:8000", concurrency=8, duration="20s", output="run1")
    analysis = api.analyze(bundle)            # diagnose.analysis.Analysis: typed and frozen
    api.report(analysis, "run1.html")         # the HTML report `diagnose analyze -o` writes
    doc = api.document(analysis)              # the `analyze --json` document, as a dict

``capture`` runs what ``diagnose attach`` runs, in this process: every attach option is a keyword argument by its
Python name (``--input-tokens`` is ``input_tokens``, ``--no-nvml`` is ``nvml=False``), checked by the same code
and refused with the same one-line messages, raised as :mod:`diagnose.errors` exceptions instead of printed.
Progress lines go to stderr as on the command line. ``analyze`` is ``diagnose analyze``'s analysis
(diagnose.pipeline.analyze) without writing anything.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import DiagnoseError, InputError

if TYPE_CHECKING:
    import click

    from diagnose.analysis import Analysis

__all__ = ["CaptureFailed", "analyze", "attach_options", "capture", "document", "report"]

# attach's options that make no sense in a call: --print-config prints and runs nothing, --help is help
NOT_IN_API = frozenset({"print_config", "help"})
# `diagnose attach --verify`: these exit statuses are the experiment's outcome, not a failure (docs/compare.md)
VERIFY_OUTCOMES = frozenset({0, 7, 8})


class CaptureFailed(DiagnoseError):
    """The capture ran but failed (every request failed, the server went away, the bundle could not be written,
    or it was interrupted). ``path`` is the bundle, which keeps every record that was written; ``exit_code`` is
    the status ``diagnose attach`` would have exited with."""

    def __init__(self, message: str, path: Path, exit_code: int) -> None:
        super().__init__(message)
        self.path = path
        self.exit_code = exit_code


def _command() -> click.Command:
    from diagnose.cli.attach import attach

    return attach


def attach_options() -> dict[str, str]:
    """Every keyword ``capture`` takes (attach's options and the probes'), with its command-line spelling."""
    import click

    out: dict[str, str] = {}
    for p in _command().params:  # not get_params(): a bare Context would fix the command's help option without -h
        if isinstance(p, click.Option) and p.name and p.name not in NOT_IN_API:
            out[p.name] = next((o for o in p.opts if o.startswith("--")), p.opts[0])
    return out


def _argv(options: Mapping[str, Any]) -> list[str]:
    """The command line these keyword options stand for; InputError naming an unknown keyword or a wrong value."""
    import click

    params = {p.name: p for p in _command().params if isinstance(p, click.Option) and p.name}
    argv: list[str] = []
    for key, value in options.items():
        p = params.get(key)
        if p is None or key in NOT_IN_API:
            close = difflib.get_close_matches(key, [k for k in params if k not in NOT_IN_API], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InputError(f"capture(): unknown option {key!r}{hint}; diagnose.api.attach_options() lists them")
        if value is None:
            continue
        long = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        if p.is_flag:
            if not isinstance(value, bool):
                raise InputError(f"capture(): {key} is a flag ({long}): give True or False")
            if value:
                argv.append(long)
            elif p.secondary_opts:
                argv.append(p.secondary_opts[0])
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float, os.PathLike)):
            raise InputError(f"capture(): {key} ({long}) takes text, a number or a path, "
                             f"got {type(value).__name__}")
        argv += [long, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return argv


def capture(url: str | None = None, *, output: str | os.PathLike[str] | None = None, api_key: str | None = None,
            **options: Any) -> Path:
    """Run ``diagnose attach`` in this process and return the bundle's directory (with ``launch``/``verify`` or
    ``find_max_goodput``: the run's directory, holding its bundles and summary).

    ``output`` defaults to ./diagnose-<time> (as the command's). ``api_key`` is the server's API key (never
    written anywhere; the default is attach's: ``api_key_env``'s variable, else OPENAI_API_KEY). Every other
    keyword is an attach option (``diagnose.api.attach_options()`` lists them), including ``config`` (a YAML
    config file whose options the keywords override).

    Raises InputError (a bad option, as the command's exit status 2), TargetError (the server cannot be
    reached or captured), MissingExtra, or CaptureFailed (the capture ran and failed; its ``path`` keeps what
    was written). Must be called where no asyncio event loop is running (from async code: asyncio.to_thread).
    """
    import click

    from diagnose.cli.attach_config import _META

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise InputError("capture() runs its own event loop: call it where none is running "
                         "(from async code: await asyncio.to_thread(capture, ...))")
    out = Path(output) if output is not None else Path(time.strftime("diagnose-%Y%m%d-%H%M%S"))
    if url is not None:
        options = {"url": url, **options}
    if api_key is not None:
        if not isinstance(api_key, str) or not api_key.strip():
            raise InputError("capture(): api_key must be the key as text")
        if options.get("api_key_env"):
            raise InputError("capture(): give api_key or api_key_env, not both")
        if any(options.get(k) for k in ("launch", "verify", "find_max_goodput", "prometheus")):
            raise InputError("capture(): api_key works for a capture of url; with launch, verify, "
                             "find_max_goodput or prometheus give api_key_env (an environment variable's name)")
    argv = [*_argv(options), "--output", os.fspath(out)]
    cmd = _command()
    try:
        ctx = cmd.make_context("diagnose attach", argv)
    except click.exceptions.Exit as e:  # pragma: no cover - only --help exits here, and it is refused above
        raise InputError(f"capture(): nothing to run (exit status {e.exit_code})") from None
    except click.ClickException as e:
        raise InputError(_click_message(e)) from None
    if api_key is not None:
        ctx.meta[_META] = api_key.strip()  # where --config's api_key goes: used like it, never stored
    code = 0
    with ctx:
        try:
            cmd.invoke(ctx)
        except click.exceptions.Exit as e:
            code = int(e.exit_code)
        except click.ClickException as e:
            raise InputError(_click_message(e)) from None
    if code == 0 or (options.get("verify") and code in VERIFY_OUTCOMES):
        return out
    what = "interrupted" if code == 130 else "failed"
    raise CaptureFailed(f"the capture into {out} {what} (diagnose attach would exit {code}); "
                        "its last stderr line says why", out, code)


def _click_message(e: click.ClickException) -> str:
    """A click error as one line, with the option named as on the command line (--concurrency)."""
    return " ".join(e.format_message().split())


def analyze(path: str | os.PathLike[str], *, rules: Sequence[str | os.PathLike[str]] = (),
            threshold_files: Sequence[str | os.PathLike[str]] = (), thresholds: Mapping[str, float] | None = None,
            include_python: bool = False, cost_per_hour: str | float | None = None) -> Analysis:
    """Analyse a bundle, a profiler trace (file or directory of ranks) or an OTLP JSON span file, as
    ``diagnose analyze`` does, and return the typed, frozen :class:`diagnose.analysis.Analysis` (nothing written).

    ``rules``: directories of your own rules; ``threshold_files`` / ``thresholds``: overrides (name: value) as
    ``--thresholds`` / ``--threshold``; ``cost_per_hour``: a price (4.1, or "4.1x8") instead of the recorded one.
    Raises BundleError / InputError (one line naming the file) for an input it cannot read."""
    from diagnose.pipeline import analyze as run

    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"analyze(): path must be a file or directory path, got {type(path).__name__}")
    src = Path(path)
    if not src.exists():
        raise InputError(f"{src}: no such file or directory")
    price: float | None = None
    if cost_per_hour is not None:
        from diagnose.signals.cost import parse_price

        price = parse_price(str(cost_per_hour))
    overrides: dict[str, float] | None = None
    if thresholds is not None:
        overrides = {}
        for k, v in thresholds.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"analyze(): threshold {k!r}: expected a number, got {type(v).__name__}")
            overrides[str(k)] = float(v)
    return run(src, rules_dirs=[Path(r) for r in rules], threshold_files=[Path(f) for f in threshold_files],
               threshold_overrides=overrides, include_python=include_python, cost_per_hour=price)


def report(analysis: Analysis, path: str | os.PathLike[str]) -> Path:
    """Write the self-contained HTML report of ``analysis`` to ``path`` (as ``diagnose analyze -o``); returns it.
    Raises ReportError (a DiagnoseError) when it cannot be written."""
    from diagnose.reports.render import write_report

    return write_report(analysis, path)


def document(analysis: Analysis) -> dict[str, Any]:
    """The ``diagnose analyze --json`` document of ``analysis`` (schema_version first; docs/json-schemas.md)."""
    from diagnose.reports.document import build_document

    return build_document(analysis)
