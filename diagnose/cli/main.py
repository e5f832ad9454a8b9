"""The `diagnose` command: one module per sub-command, registered here and imported only when needed.

`diagnose --version` imports nothing heavier than click; `--help` imports the sub-command modules, which
import their heavy dependencies (pandas, numpy, jinja2, asyncio clients) inside the commands, never at
module level (tests/test_startup.py checks it).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

import click

from diagnose import __version__
from diagnose.cli import exits, settings
from diagnose.errors import DiagnoseError

# name -> "module:attribute" of the click command
COMMANDS = {
    "attach": "diagnose.cli.attach:attach",
    "capacity": "diagnose.cli.capacity:capacity",
    "readiness": "diagnose.cli.readiness:readiness",
    "analyze": "diagnose.cli.analyze:analyze",
    "compare": "diagnose.cli.compare:compare",
    "experiment": "diagnose.cli.experiment:experiment",
    "export": "diagnose.cli.export:export",
    "rules": "diagnose.cli.rules:rules",
    "run": "diagnose.cli.run:run",
    "verify": "diagnose.cli.verify:verify",
    "workload": "diagnose.cli.workload:workload",
}


class Group(click.Group):
    """Turns DiagnoseError into one line on stderr and its exit code; never shows a traceback unless asked.

    Sub-commands in COMMANDS are imported on first use (click's documented lazy-group pattern).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            cmd = getattr(importlib.import_module(module), attr)
            if not isinstance(cmd, click.Command):  # pragma: no cover - a wrong COMMANDS entry
                raise TypeError(f"{COMMANDS[cmd_name]} is not a click command")
            self.add_command(cmd, cmd_name)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DiagnoseError as e:
            click.echo(f"diagnose: error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("diagnose: interrupted", err=True)
            sys.exit(exits.INTERRUPTED)
        except OSError as e:
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            click.echo(f"diagnose: error: {e.strerror or e}{where}", err=True)
            sys.exit(exits.ERROR)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 - last resort: one line, details only with DIAGNOSE_DEBUG=1
            if os.environ.get("DIAGNOSE_DEBUG"):
                traceback.print_exc()
            click.echo(f"diagnose: internal error: {type(e).__name__}: {e} (set DIAGNOSE_DEBUG=1 for details)", err=True)
            sys.exit(exits.INTERNAL)


@click.group(cls=Group, context_settings=settings(max_content_width=110),
             epilog=exits.epilog(extra="diagnose run: the server's own exit status (97: pyinstrument is not installed)"))
@click.version_option(__version__, "--version", prog_name="diagnose")
def cli() -> None:
    """Profile an LLM inference server and diagnose its bottleneck.

    \b
    diagnose attach --url http://127.0.0.1:8000 --concurrency 16 --duration 30s -o bundle/
    diagnose analyze bundle/ -o report.html
    diagnose analyze trace.json.gz -o report.html     (a torch.profiler / Kineto trace)
    """


def main() -> None:
    cli(prog_name="diagnose")
