"""The command line: one click command per module, registered lazily by diagnose.cli.main."""

from __future__ import annotations

from typing import Any

HELP_NAMES = ["-h", "--help"]


def settings(**extra: Any) -> dict[str, Any]:
    """A command's context settings: -h and --help on every command however it is invoked (under the group or
    on its own, as tests do; click caches a command's help option from the first context it sees, so a command
    without them answered -h or not by test order)."""
    return {"help_option_names": HELP_NAMES, **extra}
