"""The self-contained HTML report: view_model (Analysis -> plain dict), render (jinja2, autoescape on),
charts (inline SVG). ``render_html(analysis)`` and ``write_report(analysis, path)`` are the entry points."""

from .render import ReportError, render_html, write_report
from .view_model import build_view

__all__ = ["ReportError", "build_view", "render_html", "write_report"]
