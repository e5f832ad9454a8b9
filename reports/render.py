"""Render an Analysis as one self-contained HTML file (inline CSS and SVG, no external URL, works offline).

jinja2 with autoescape on: every captured string is escaped by the template; the SVG charts are built by
reports/charts.py, which escapes every text it embeds, and are the only markup passed through unescaped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache
from markupsafe import Markup

from diagnose.analysis import Analysis
from diagnose.errors import DiagnoseError

from . import charts
from .formatting import fmt_cell, fmt_text, fmt_value, is_numeric_cell
from .sections.model import Section
from .view_model import build_view
from .view_types import ChartSpec, View, WaterfallRow

__all__ = ["ReportError", "fmt_value", "render_html", "svg", "write_report"]

HERE = Path(__file__).resolve().parent


class ReportError(DiagnoseError):
    """The report cannot be written (bad path, no permission, disk full)."""

    exit_code = 1


def svg(spec: ChartSpec) -> Markup:
    """One chart spec (see view_model / sections_view) as inline SVG markup (texts escaped inside)."""
    kind = spec.get("kind")
    title = str(spec.get("title", ""))
    if spec["kind"] == "line_chart":
        out = charts.line_chart(spec.get("series") or [], title=title, x_label=str(spec.get("x_label", "")),
                                y_label=str(spec.get("y_label", "")), y2_label=str(spec.get("y2_label", "")),
                                bands=spec.get("bands") or [])
    elif spec["kind"] == "histogram":
        out = charts.histogram(spec.get("bins") or [], title=title, x_label=str(spec.get("x_label", "")),
                               y_label=str(spec.get("y_label", "count")), log_x=bool(spec.get("log_x")),
                               markers=spec.get("markers") or [])
    elif spec["kind"] == "stacked_bars":
        out = charts.stacked_bars([fmt_text(c) for c in spec.get("categories") or []], spec.get("series") or [],
                                  title=title,
                                  unit=str(spec.get("unit", "")), x_label=str(spec.get("x_label", "")),
                                  y_label=str(spec.get("y_label", "")))
    elif spec["kind"] == "waterfall":
        rows: list[WaterfallRow] = [{**r, "label": fmt_text(r.get("label", ""))} for r in spec.get("rows") or []]
        out = charts.waterfall(rows, title=title, unit=str(spec.get("unit", "ms")),
                               y_label=str(spec.get("y_label", "item")))
    elif spec["kind"] == "flamegraph":
        out = charts.flamegraph(spec.get("root") or {"name": "", "value": 0.0}, title=title, unit=str(spec.get("unit", "samples")))
    else:
        out = f'<p class="unavailable">{charts.esc(title)}: not available: cannot draw {charts.esc(kind)}</p>'
    return Markup(out)


class _QuietBytecodeCache(jinja2.FileSystemBytecodeCache):
    """A cache that cannot be written (disk full, read-only temp dir) only costs the compile, never the report."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """jinja2's per-user cache of compiled templates (a private folder under the temp dir, keyed by the
    template's checksum): compiling report.html costs about 0.07 s of every `diagnose analyze`; none when
    that folder cannot be made safely (then every run compiles, as before)."""
    try:
        return _QuietBytecodeCache()
    except (OSError, RuntimeError):
        return None


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             bytecode_cache=_bytecode_cache())
    env.globals.update(svg=svg, fmt=fmt_value, fmt_cell=fmt_cell, is_num=is_numeric_cell)
    return env


def render_html(analysis: Analysis, sections: Sequence[Section] | None = None) -> str:
    """The report for ``analysis`` as one HTML document (``sections``: shown instead of those built from the
    analysis's tables, for previews and tests)."""
    return render_view(build_view(analysis, sections))


def render_view(view: View) -> str:
    """The HTML document of a view model (:func:`view_model.build_view`): the page only displays it."""
    has_flame = any(s["kind"] == "flamegraph" for g in view["section_groups"] for s in g["sections"])
    # our own static asset, never captured data; only when a flame graph needs it
    js = Markup((HERE / "assets" / "flame.js").read_text(encoding="utf-8")) if has_flame else None
    return render_page(Page("report.html", {"v": view, "flame_js": js}))


@dataclass(frozen=True)
class Page:
    """One page of the tool (the report, the compare page, the SLO-edge search page): its template and the plain
    data the template displays. Every page goes through :func:`render_page`: one environment (autoescaping
    everything), one stylesheet inlined, no network."""

    template: str
    context: Mapping[str, Any]


def render_page(page: Page) -> str:
    css = Markup((HERE / "assets" / "report.css").read_text(encoding="utf-8"))
    return _env().get_template(page.template).render(css=css, **page.context)


def write_report(analysis: Analysis, path: str | os.PathLike[str], sections: Sequence[Section] | None = None,
                 view: View | None = None) -> Path:
    """Render and write the report; returns the path written. Raises ReportError with a one-line reason.
    ``view``: the view model already built for ``analysis`` (the CLI builds it once for the page and --json).
    Written as every output is (diagnose/io/outputs.py): through a temporary file that a failure (a full disk)
    or a signal removes, or in place onto a device or FIFO."""
    from diagnose.io.outputs import OutputError, write_bytes

    p = Path(path)
    html = render_view(view) if view is not None else render_html(analysis, sections)
    try:
        write_bytes(p, html.encode("utf-8"), parents=True)
    except OutputError as e:
        raise ReportError(f"cannot write report {p}: {e.why}") from e
    return p
