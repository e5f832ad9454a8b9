"""The rendered HTML: self-contained (no external URL), escaped, verdict first, charts with titles and labels."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from diagnose.analysis import Analysis
from diagnose.errors import DiagnoseError
from diagnose.reports import render_html, write_report
from diagnose.reports.demo import demo_sections, synthetic_analysis
from diagnose.reports.sections.model import Phrase, Quantity, Section, Table

HOSTILE = "<script>alert(1)</script>"
ATTR_HOSTILE = "\"'><img src=x onerror=alert(2)>"
FLAME_JS = (Path(__file__).resolve().parents[1] / "reports" / "assets" / "flame.js").read_text(encoding="utf-8")
URL_ATTRS = {"src", "href", "xlink:href", "action", "formaction", "poster", "data", "srcset", "background"}


class Doc(HTMLParser):
    """Collects tags, attributes, text, and the order of section ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self.scripts: list[str] = []
        self._in_style = False
        self.stack: list[str] = []
        self.svgs: list[dict[str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        self._in_style = tag == "style"
        if tag == "svg":
            self.svgs.append({"classes": [], "title": []})
        if self.svgs and tag == "text":
            self.svgs[-1]["classes"].append(a.get("class") or "")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        if self.stack and self.stack[-1] == "script":
            self.scripts.append(data)
            return
        self.text.append(data)
        if self.svgs and self.stack and self.stack[-1] == "title" and "svg" in self.stack:
            self.svgs[-1]["title"].append(data)


def parse(html: str) -> Doc:
    d = Doc()
    d.feed(html)
    d.close()
    return d


@pytest.fixture(scope="module")
def hostile_html() -> str:
    a = synthetic_analysis(per_level_s=4.0, hostile=HOSTILE)
    evil = Section("evil", f"Section{ATTR_HOSTILE}", Table(
        (ATTR_HOSTILE, "value"), ((ATTR_HOSTILE, Quantity(1.5, "ms")),), Phrase((ATTR_HOSTILE, Quantity(2.0, "ms")))),
        group=f"grp{ATTR_HOSTILE}")
    return render_html(a, [*demo_sections(HOSTILE), evil])


def test_no_external_urls(hostile_html: str) -> None:
    doc = parse(hostile_html)
    for tag, attrs in doc.tags:
        for k, v in attrs.items():
            if k in URL_ATTRS and v is not None:
                assert not re.match(r"\s*(https?:)?//", v, re.I), (tag, k, v)
        assert not (tag == "link" and attrs.get("rel") == "stylesheet")
    css = "".join(doc.styles) + "".join(a.get("style") or "" for _, a in doc.tags)
    assert "url(" not in css and "@import" not in css
    assert not [t for t, _ in doc.tags if t in ("iframe", "img", "object", "embed")]
    # one inline script: the flame graph's zoom, our own static asset (no src, no fetch)
    scripts = [a for t, a in doc.tags if t == "script"]
    assert scripts == [{}]
    assert "".join(doc.scripts).strip() == FLAME_JS.strip()
    assert not re.search(r"fetch|XMLHttpRequest|import\(|https?:", FLAME_JS)


def test_hostile_strings_only_escaped(hostile_html: str) -> None:
    assert HOSTILE not in hostile_html
    assert ATTR_HOSTILE not in hostile_html
    doc = parse(hostile_html)
    assert [t for t, _ in doc.tags if t in ("script", "img")] == ["script"]  # only the flame-graph asset
    assert "alert" not in "".join(doc.scripts)
    assert not [k for _, a in doc.tags for k in a if k.startswith("on")]
    text = "".join(doc.text)
    # the hostile strings survive as visible text: model name, rule title, error detail, probe reason,
    # evidence note, warning, series name, table cell, flame-graph frame, section title and group
    assert text.count(HOSTILE) >= 9
    assert "evil_frame" + HOSTILE in text
    assert text.count(ATTR_HOSTILE) >= 4


def test_verdict_before_findings_and_partial_banner_first() -> None:
    html = render_html(synthetic_analysis(per_level_s=3.0, partial=True))
    i_banner = html.index("Partial capture:")
    i_verdict = html.index('id="verdict"')
    i_findings = html.index('id="findings"')
    i_latency = html.index('id="latency"')
    assert i_banner < i_verdict < i_findings < i_latency
    assert html.index("TTFT P99") > i_verdict


def test_invalid_run_says_so_in_verdict() -> None:
    html = render_html(synthetic_analysis(per_level_s=3.0, run_valid=False))
    verdict = html[html.index('id="verdict"'): html.index('id="findings"')]
    assert "Run invalid: the load client was the bottleneck" in verdict  # the judgement stage's own verdict
    assert "level-invalid" in verdict
    assert "within SLO" not in verdict  # nothing judged against the SLO is shown as a result of an invalid run


def test_charts_have_titles_and_axis_labels(hostile_html: str) -> None:
    doc = parse(hostile_html)
    # the demo is a sweep: TTFT and ITL CDFs by level (no pooled histogram), the throughput-latency curve (its
    # manifest's SLO is a string, which is no SLO: the curve was lost to an error before the SLO was read
    # tolerantly), timeline, output lengths and arrivals (the demo's requests have no input lengths: that chart
    # says so), 5 SVG sections (not table/text)
    assert len(doc.svgs) == 11
    assert "Throughput vs latency, one point per level" in hostile_html
    assert "Input lengths: not available: the requests table has no prompt_tokens_planned column" in hostile_html
    for svg in doc.svgs:
        assert "".join(svg["title"]).strip(), svg
        assert "chart-title" in svg["classes"]
        assert any("x-label" in c for c in svg["classes"]), svg
    # every chart but the flame graph has a y-axis label
    assert sum(any("y-label" in c for c in s["classes"]) for s in doc.svgs) >= len(doc.svgs) - 1
    text = "".join(doc.text)
    for label in ("time to first token (ms)", "TTFT (ms)", "time since capture start (s)",
                  "requests (in flight / queued)", "cumulative share (%)"):
        assert label in text


def test_missing_tables_render_not_available_lines() -> None:
    html = render_html(Analysis(source="empty", manifest={}))
    doc = parse(html)
    text = "".join(doc.text)
    assert "TTFT distribution: not available: no requests table" in text
    assert "not available: no itl table" in text or "ITL distribution (pooled chunk gaps): not available" in text
    assert "over time: not available" in text
    assert "<svg" not in html and "<script" not in html  # no flame graph: no script at all


def test_report_is_small_for_a_long_run(tmp_path: Path) -> None:
    a = synthetic_analysis(levels=(4, 16, 32), per_level_s=40.0, output_tokens=128)
    assert len(a.tables["itl"]) > 150_000
    out = write_report(a, tmp_path / "r" / "report.html", demo_sections())
    size = out.stat().st_size
    assert size < 1_000_000, size
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_secrets_never_rendered() -> None:
    html = render_html(synthetic_analysis(per_level_s=3.0))
    assert "sk-secret" not in html and "sk-abcdefgh" not in html and "Bearer" not in html


def test_write_report_bad_path_is_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DiagnoseError) as ei:
        write_report(Analysis(source="x", manifest={}), blocker / "report.html")
    assert "cannot write report" in str(ei.value) and "\n" not in str(ei.value)


def test_every_page_goes_through_one_renderer() -> None:
    """Issue 32 item 5: the report, the compare page and the SLO-edge search page are each a Page (template + plain
    data) rendered by reports.render.render_page: one environment, one stylesheet."""
    import inspect

    from diagnose.reports import compare as compare_page
    from diagnose.reports import goodput as search_page
    from diagnose.reports import render

    for mod in (compare_page, search_page, render):
        src = inspect.getsource(mod)
        assert "render_page(Page(" in src, mod.__name__
        assert src.count(".get_template(") == (1 if mod is render else 0), mod.__name__  # render_page's own
