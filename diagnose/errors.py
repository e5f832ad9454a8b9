"""Errors that the CLI turns into one-line messages and a non-zero exit status."""

from __future__ import annotations


class DiagnoseError(Exception):
    """A user-facing failure: the message says what went wrong and where (no traceback is shown)."""

    exit_code = 1


class BundleError(DiagnoseError):
    """A directory is not a readable capture bundle (missing manifest, unknown schema, corrupt file)."""

    exit_code = 2


class InputError(DiagnoseError):
    """An input file (trace, spans, config) cannot be read or has the wrong format."""

    exit_code = 2


class TargetError(DiagnoseError):
    """The target server cannot be reached or answered in a way that makes the capture impossible."""

    exit_code = 3


class MissingExtra(DiagnoseError):
    """A feature needs an optional dependency that is not installed: the message names the extra to install."""

    exit_code = 2


def require(module: str, extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` can be imported (checked without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out as None
        found = False
    if not found:
        raise MissingExtra(f"{feature} needs {module}, which is not installed: pip install 'diagnose[{extra}]'")
