"""The `diagnose` command: one module per sub-command, registered here."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click

from diagnose import __version__
from diagnose.errors import DiagnoseError


class Group(click.Group):
    """Turns DiagnoseError into one line on stderr and its exit code; never shows a traceback unless asked."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DiagnoseError as e:
            click.echo(f"diagnose: error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("diagnose: interrupted", err=True)
            sys.exit(130)
        except OSError as e:
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            click.echo(f"diagnose: error: {e.strerror or e}{where}", err=True)
            sys.exit(1)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 - last resort: one line, details only with DIAGNOSE_DEBUG=1
            if os.environ.get("DIAGNOSE_DEBUG"):
                traceback.print_exc()
            click.echo(f"diagnose: internal error: {type(e).__name__}: {e} (set DIAGNOSE_DEBUG=1 for details)", err=True)
            sys.exit(70)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="diagnose")
def cli() -> None:
    """Profile an LLM inference server and diagnose its bottleneck.

    \b
    diagnose attach --url http://127.0.0.1:8000 --concurrency 16 --duration 30s -o bundle/
    diagnose analyze bundle/ -o report.html
    diagnose analyze trace.json.gz -o report.html     (a torch.profiler / Kineto trace)
    """


def _register() -> None:
    from diagnose.cli import analyze, attach, rules, run

    cli.add_command(attach.attach)
    cli.add_command(analyze.analyze)
    cli.add_command(rules.rules)
    cli.add_command(run.run)


_register()


def main() -> None:
    cli(prog_name="diagnose")
