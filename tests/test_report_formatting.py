"""Typed section values (reports/sections/model.py) and their text (reports/formatting.py): numbers stay
numbers with units in the view model and become text only when the template renders them."""

from __future__ import annotations

import json
import math

import pytest

from diagnose.analysis import Analysis
from diagnose.reports.formatting import fmt_cell, fmt_quantity, fmt_text, is_numeric_cell, view_value
from diagnose.reports.render import render_html
from diagnose.reports.sections.model import Phrase, Quantity, Section, Table, TextBlock
from diagnose.reports.view_model import build_view


@pytest.mark.parametrize(("q", "text"), [
    (Quantity(1234.56, "ms", 2), "1,235"),          # three significant digits, thousands grouped
    (Quantity(0.05612, "cores", 2), "0.06"),         # rounded to its digits first
    (Quantity(120, "requests"), "120"),              # an int as it is
    (Quantity(0.2, "ratio", 1, "percent"), "20.0%"),
    (Quantity(133.4, "ms", 0, "fixed"), "133"),
    (Quantity(-1.25, "ms", 1, "signed"), "-1.2"),
    (Quantity(1234567, "events", style="grouped"), "1,234,567"),
    (Quantity(99.0, "percentile", style="general"), "99"),
    (Quantity(2.5, "ms", style="bound"), "2.5 ms"),
    (Quantity(math.inf, "ms", style="bound"), "+Inf"),
    (Quantity(None, "ms"), "—"),
    (Quantity(math.nan, "ms", 1, "percent"), "—"),  # missing is a dash, never 0
])
def test_quantity_styles(q: Quantity, text: str) -> None:
    assert fmt_quantity(q) == text
    assert fmt_cell(json.loads(json.dumps(view_value(q), allow_nan=False))) == text  # the same from view data


def test_quantities_refuse_what_they_cannot_show() -> None:
    with pytest.raises(ValueError, match="needs digits"):
        Quantity(0.5, "ratio", style="percent")
    with pytest.raises(ValueError, match="style"):
        Quantity(1.0, "ms", style="pretty")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="number or None"):
        Quantity("12 ms", "ms")  # type: ignore[arg-type]


def test_phrases_and_numeric_cells() -> None:
    p = Phrase(("queue ", Quantity(0.41, "ratio", 1, "percent"), ", prefill ", Quantity(0.125, "ratio", 1, "percent")))
    assert fmt_text(p) == "queue 41.0%, prefill 12.5%"
    assert fmt_cell(view_value(p)) == fmt_text(p)
    assert is_numeric_cell(view_value(Quantity(1.5, "ms"))) and is_numeric_cell(3)
    assert not is_numeric_cell(view_value(Quantity(None, "ms"))) and not is_numeric_cell(view_value(p))
    assert not is_numeric_cell(view_value(Quantity(0.2, "ratio", 1, "percent"))) and not is_numeric_cell("x")


def test_view_keeps_numbers_and_the_html_shows_their_text() -> None:
    sec = Section("t", "Typed", Table(("part", "mean ms", "share"), (
        ("queue", Quantity(12.3456, "ms"), Quantity(0.25, "ratio", 1, "percent")),),
        Phrase((Quantity(7, "requests"), " requests"))), group="latency")
    note = Section("n", "Note", TextBlock(Phrase(("used ", Quantity(1.234, "s", 2, "fixed"), " s"))), group="latency")
    a = Analysis(source="x", manifest={})
    view = build_view(a, [sec, note])
    table = next(s for g in view["section_groups"] for s in g["sections"] if s["id"] == "t")
    assert table["rows"][0][1] == {"value": 12.3456, "unit": "ms", "digits": None, "style": "sig"}
    assert table["rows"][0][2]["value"] == 0.25 and table["rows"][0][2]["unit"] == "ratio"
    html = render_html(a, [sec, note])
    assert '<td class="num">12.3</td><td>25.0%</td>' in html
    assert "7 requests" in html and "used 1.23 s" in html
