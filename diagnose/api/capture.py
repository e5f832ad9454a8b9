"""``capture``: ``diagnose attach`` run in this process (docs/api.md). Every attach option is a keyword argument by
its Python name, checked by the attach command's own code and refused with its one-line messages, raised as
:mod:`diagnose.errors` exceptions."""

from __future__ import annotations

import asyncio
import difflib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import DiagnoseError, InputError

if TYPE_CHECKING:
    import click

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
