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
