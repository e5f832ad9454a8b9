"""`diagnose attach --config FILE` and `--print-config` (issue 36; docs/workload.md, "A config file").

A config file is a YAML mapping of attach options, each by its long name (``input-tokens`` or ``input_tokens``)
with a value of the option's type (a flag: true or false). It becomes click's ``default_map``: an option given
on the command line overrides the file's value. An unknown key or a value of the wrong type is one line naming
the file and the key (exit status 2); a value is never echoed (it could be a secret). ``api_key`` is the one key
that is no option: the API key itself, used like ``--api-key-env``'s and never written anywhere (not to the
bundle, not to stderr, not by ``--print-config``).

The capture records the resolved options in the manifest (``options.resolved``: every attach option's value,
the URL without credentials; ``options.config``: the file and the keys it set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from diagnose.errors import InputError

API_KEY = "api_key"  # the one key that is no option: the key itself
_META = "diagnose.config_api_key"
NOT_IN_FILE = frozenset({"config", "print_config", "help"})
MAX_BYTES = 1 << 20  # a config file is small; a larger one is a mistake (a dataset given as --config)


def _key_name(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def options_of(ctx: click.Context) -> dict[str, click.Option]:
    return {p.name: p for p in ctx.command.get_params(ctx) if isinstance(p, click.Option) and p.name}


def read_config(path: Path) -> dict[str, Any]:
    """The file's mapping (YAML; JSON is YAML too). InputError naming the file for anything else."""
    import yaml

    try:
        if not path.is_file():
            raise InputError(f"--config {path}: not a readable file")
        if path.stat().st_size > MAX_BYTES:
            raise InputError(f"--config {path}: larger than {MAX_BYTES >> 20} MiB: not a config file")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"--config {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"--config {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise InputError(f"--config {path}{where}: not YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path}: expected a mapping of attach options (key: value), "
                         f"got {_kind(data)}")
    return data


def _convert(ctx: click.Context, p: click.Option, value: Any, where: str) -> Any:
    """The file's value for option ``p`` as click would take it from the command line; InputError naming the key
    (the value itself is never shown)."""
    t = p.type
    got = _kind(value)
    if p.is_flag:
        if not isinstance(value, bool):
            raise InputError(f"{where}: expected true or false, got {got}")
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise InputError(f"{where}: expected {_want(t)}, got {got}")
    if isinstance(t, click.types.IntParamType) and not isinstance(value, int):
        raise InputError(f"{where}: expected a whole number, got {got}")
    if isinstance(t, click.types.FloatParamType) and not isinstance(value, (int, float)):
        raise InputError(f"{where}: expected a number, got {got}")
    if isinstance(t, (click.types.StringParamType, click.Path, click.Choice)):
        value = str(value)
    try:
        return p.type_cast_value(ctx, value)
    except click.BadParameter as e:
        raise InputError(f"{where}: {e.message}") from None


def _kind(v: Any) -> str:
    """What a YAML value is, in words (never the value: it could be a secret)."""
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, int):
        return "a whole number"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "text"
    return {"list": "a list", "dict": "a mapping"}.get(type(v).__name__, f"a {type(v).__name__}")


def _want(t: click.ParamType) -> str:
    if isinstance(t, click.types.IntParamType):
        return "a whole number"
    if isinstance(t, click.types.FloatParamType):
        return "a number"
    if isinstance(t, click.Choice):
        return "one of " + ", ".join(map(str, t.choices))
    return "a text value"


def load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """``--config``'s callback (eager: before every other option): the file's values become the defaults of
    the options the command line does not give."""
    if value is None:
        return None
    data = read_config(value)
    opts = options_of(ctx)
    off = {_key_name(o): name for name, p in opts.items() for o in p.secondary_opts}
    defaults: dict[str, Any] = {}
    for key, v in data.items():
        if not isinstance(key, str):
            raise InputError(f"--config {value}: key {key!r} is not an option name")
        name = _key_name(key)
        where = f"--config {value}: key {key!r}"
        if name == API_KEY:
            if not isinstance(v, str) or not v.strip():
                raise InputError(f"{where}: expected the API key as text")
            ctx.meta[_META] = v.strip()
            continue
        if name in NOT_IN_FILE:
            raise InputError(f"{where}: not allowed in a config file")
        negated = False
        if name not in opts and name in off:  # the off spelling of an on/off pair: no-nvml: true
            name, negated = off[name], True
        if name not in opts:
            raise InputError(f"{where}: unknown (not an attach option; `diagnose attach --help` lists them)")
        if name in defaults:
            raise InputError(f"{where}: given twice")
        got = _convert(ctx, opts[name], v, where)
        defaults[name] = (not got) if negated else got
    if API_KEY in {_key_name(k) for k in data if isinstance(k, str)} and "api_key_env" in defaults:
        raise InputError(f"--config {value}: give api_key or api_key_env, not both")
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def config_api_key(ctx: click.Context | None) -> str | None:
    """The API key the config file gave (None without one); the command line's --api-key-env overrides it."""
    if ctx is None:
        return None
    key = ctx.meta.get(_META)
    if key is None:
        return None
    from click.core import ParameterSource

    if ctx.get_parameter_source("api_key_env") == ParameterSource.COMMANDLINE:
        return None
    return str(key)


def _plain(v: Any) -> Any:
    return str(v) if isinstance(v, Path) else v


def given_options(ctx: click.Context) -> dict[str, Any]:
    """Every option whose value is not its default (from the command line or the config file), by its long name
    without dashes, as --print-config writes them."""
    out: dict[str, Any] = {}
    from click.core import ParameterSource

    for name, p in options_of(ctx).items():
        if name in NOT_IN_FILE:
            continue
        v = ctx.params.get(name)
        if v is None or ctx.get_parameter_source(name) not in (ParameterSource.COMMANDLINE,
                                                              ParameterSource.DEFAULT_MAP):
            continue
        out[(p.opts[0] if p.opts[0].startswith("--") else p.opts[-1]).lstrip("-")] = _plain(v)
    return out


def print_config(ctx: click.Context) -> None:
    """``--print-config``: the current options (command line over config file) as a config file, on stdout.
    The URL loses any credentials; an API key from a config file is never written."""
    import yaml

    from diagnose.capture.redact import safe_url

    given = {k: safe_url(v) if isinstance(v, str) and v.startswith(("http://", "https://")) else v
             for k, v in given_options(ctx).items()}
    head = "# diagnose attach --config FILE: these options (a flag on the command line overrides a value here)\n"
    click.echo(head + (yaml.safe_dump(given, sort_keys=False, default_flow_style=False) if given else "{}\n"),
               nl=False)


def resolved_options(ctx: click.Context | None) -> dict[str, Any]:
    """What the manifest records: ``resolved``, every attach option's value (the URL without credentials), and
    ``config``, the file and the keys it set (command-line values left out). Never the API key."""
    if ctx is None:
        return {}
    from click.core import ParameterSource

    from diagnose.capture.redact import safe_url

    resolved: dict[str, Any] = {}
    from_file: list[str] = []
    for name in options_of(ctx):
        if name in NOT_IN_FILE or name not in ctx.params:
            continue
        v = _plain(ctx.params[name])
        resolved[name] = safe_url(v) if isinstance(v, str) and v.startswith(("http://", "https://")) else v
        if ctx.get_parameter_source(name) == ParameterSource.DEFAULT_MAP:
            from_file.append(name)
    out: dict[str, Any] = {"resolved": resolved}
    if ctx.params.get("config") is not None:
        out["config"] = {"file": str(ctx.params["config"]), "keys": sorted(from_file),
                         "api_key": ctx.meta.get(_META) is not None}
    return out
