"""The report checked as a person sees it: every sample report (and one bare-trace report) opened in
headless Chromium at 1280x800, with no console error, and the verdict and the headline numbers visible in
the first screen (inside the viewport without scrolling, not hidden, not covered by anything else).

Chromium is Debian's `chromium` package (harness/ensure_chromium.sh; .ci/run installs it when missing).
Without it the tests fail under CI=true and skip elsewhere, saying so. DIAGNOSE_REPORT_SHOTS=DIR keeps the
first-screen screenshots there (to look at them); otherwise they go to pytest's tmp_path.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnose.cli.analyze import run_analysis
from diagnose.reports.render import write_report
from diagnose.reports.view_model import build_view
from tests.browser import VIEWPORT, Browser, chromium_path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if (p / "expected_findings.json").exists())
BARE_TRACE = ROOT / "tests" / "data" / "traces" / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"
# the readiness sample is a bundle too (diagnose readiness): its analysis is a report like any capture's
READINESS = ROOT / "sample_traces" / "readiness_vllm_cpu"
CASES = [*SAMPLES, BARE_TRACE, READINESS]
IDS = [p.name for p in SAMPLES] + ["bare_trace_h100_qwen", "readiness_vllm_cpu"]

# Element boxes, styles and hit tests, measured by the page itself; "cover" is what lies on top at the centre.
PROBE = r"""
(() => {
  const box = (el) => {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    const cx = Math.min(Math.max(r.left + r.width / 2, 0), innerWidth - 1);
    const cy = Math.min(Math.max(r.top + r.height / 2, 0), innerHeight - 1);
    const hit = document.elementFromPoint(cx, cy);
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width, height: r.height,
            visible: el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}),
            opacity: parseFloat(cs.opacity), color: cs.color, background: cs.backgroundColor,
            covered: !(hit && (hit === el || el.contains(hit) || hit.contains(el))),
            cover: hit ? hit.tagName + (hit.id ? "#" + hit.id : "") + "." + hit.className : null,
            text: el.innerText.trim()};
  };
  const verdict = document.querySelector("#verdict .headline");
  return {viewport: [innerWidth, innerHeight], scrollY: scrollY,
          verdict: verdict ? box(verdict) : null,
          tiles: [...document.querySelectorAll("#verdict .key")].map(box),
          levels: [...document.querySelectorAll("#verdict .lk")].map(box),
          // every table in the verdict box ends inside it (nothing spills out of the box at this width)
          spill: [...document.querySelectorAll("#verdict table")].map(t => t.getBoundingClientRect().right -
                 document.querySelector("#verdict").getBoundingClientRect().right).filter(d => d > 0.5)};
})()
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    exe = chromium_path()
    if exe is None:
        msg = ("headless Chromium is not installed (Debian package `chromium`; run harness/ensure_chromium.sh, "
               "or set DIAGNOSE_CHROMIUM to a Chromium binary)")
        if os.environ.get("CI") == "true":
            pytest.fail(msg + ": CI must check the report in a browser", pytrace=False)
        pytest.skip(msg)
    b = Browser(exe)
    yield b
    b.close()


def shots_dir(tmp_path: Path) -> Path:
    d = os.environ.get("DIAGNOSE_REPORT_SHOTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return tmp_path


def in_first_screen(b: dict[str, object], what: str) -> None:
    w, h = VIEWPORT
    top, bottom, left, right = (float(b[k]) for k in ("top", "bottom", "left", "right"))  # type: ignore[arg-type]
    assert float(b["width"]) > 0 and float(b["height"]) > 0, f"{what} has no size: {b}"  # type: ignore[arg-type]
    assert b["visible"] is True and float(b["opacity"]) > 0, f"{what} is hidden: {b}"  # type: ignore[arg-type]
    assert top >= 0 and bottom <= h and left >= 0 and right <= w, f"{what} is not in the first {w}x{h} screen: {b}"
    assert b["covered"] is False, f"{what} is covered by {b['cover']}: {b}"
    assert b["color"] != b["background"], f"{what} is drawn in its background colour: {b}"
    assert str(b["text"]).strip(), f"{what} shows no text: {b}"


def png_size(p: Path) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{p} is not a PNG"
    w, h = struct.unpack(">II", head[16:24])
    return int(w), int(h)


@pytest.mark.parametrize("source", CASES, ids=IDS)
def test_report_in_a_browser(source: Path, browser: Browser, tmp_path: Path) -> None:
    analysis = run_analysis(source)
    view = build_view(analysis)
    report = write_report(analysis, tmp_path / f"{source.name}.html")
    browser.open(report)
    assert browser.console_errors() == [], f"{source.name}: console errors"
    got = browser.evaluate(PROBE)
    assert got["viewport"] == list(VIEWPORT) and got["scrollY"] == 0, got
    assert got["verdict"] is not None, f"{source.name}: no #verdict .headline element"
    in_first_screen(got["verdict"], "the verdict")
    verdict_text = got["verdict"]["text"]
    assert view["verdict"]["headline"].split("(")[0].strip() in verdict_text, verdict_text
    # every headline number the report data holds is a tile in the first screen, with its value
    want = view["verdict"]["key_numbers"]
    assert len(got["tiles"]) == len(want), (got["tiles"], want)
    for tile, k in zip(got["tiles"], want, strict=True):
        in_first_screen(tile, f"the headline tile {k['label']!r}")
        assert k["label"] in tile["text"], (tile["text"], k)
        assert any(ch.isdigit() for ch in tile["text"]), f"tile {k['label']!r} shows no number: {tile['text']!r}"
    # a sweep: the headline is one row per level (never pooled), every cell in the first screen
    per_level = [k for lv in view["verdict"]["by_level"] for k in lv["key_numbers"]]
    assert len(got["levels"]) == len(per_level), (got["levels"], per_level)
    for cell, k in zip(got["levels"], per_level, strict=True):
        in_first_screen(cell, f"the headline cell {k['label']!r} of {k['window']}")
        if k["value"] is not None:
            assert any(ch.isdigit() for ch in cell["text"]), f"cell {k['label']!r} shows no number: {cell['text']!r}"
    if (source / "bundle").is_dir() or (source / "manifest.json").exists():
        assert want or per_level, f"{source.name}: a capture's report shows no headline numbers"
    assert got["spill"] == [], f"{source.name}: a table spills out of the verdict box by {got['spill']} px"
    holes = template_holes(str(browser.evaluate("document.body.innerText")))
    assert not holes, f"{source.name}: template holes or raw values on the page: {holes}"
    shot = browser.screenshot(shots_dir(tmp_path) / f"{source.name.split('.')[0]}.png")
    assert png_size(shot) == VIEWPORT


# what a person must never read on a page: a missing value printed as a word, a float in scientific notation or
# with all its digits, a Python None/nan, a key=value dump (issue 32 item 6)
HOLES = re.compile(r"\bNone\b|\bnan\b|\d[eE][+-]\d|unknown ?(?:ms|%|x\b|requests|tok)|(?:is|of) unknown\b|"
                   r"\d\.\d{5,}|[\w.]+=[\w.]+; [\w.]+=")


def template_holes(text: str) -> list[str]:
    return [text[max(0, m.start() - 40):m.end() + 20].replace("\n", " ") for m in HOLES.finditer(text)]


@pytest.mark.parametrize("text", ["queue time P50 is unknown ms of", "waiting 9.3e-05 requests", "TTFT 1.3e+03 ms",
                                  "at 1.79651e+09", "2 → None", "scrape_ms_max=7.77279",
                                  "nonblocking=True; processes.1.exited=False", "hit ratio is unknown (",
                                  "18.3 ms (unknownx the baseline)", "P50 nan ms"])
def test_template_holes_are_found(text: str) -> None:
    assert template_holes(f"before {text} after"), text


def test_plain_text_has_no_holes() -> None:
    assert template_holes("TTFT P50 4,006 ms, queue 93%, <0.001 requests, client stall (cause unknown), 0.0012") == []


def test_console_errors_are_caught(browser: Browser, tmp_path: Path) -> None:
    """The check above could pass by not listening: a page that logs an error and throws must be caught."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('boom from test');"
                    "setTimeout(() => { throw new Error('thrown from test'); }, 0);</script></body></html>")
    browser.open(page)
    errs = browser.console_errors()
    assert any("boom from test" in e for e in errs), errs
    assert any("thrown from test" in e for e in errs), errs


def test_hidden_or_offscreen_verdict_is_caught(browser: Browser, tmp_path: Path) -> None:
    """And a verdict below the first screen, or hidden, must fail the first-screen check."""
    page = tmp_path / "low.html"
    page.write_text('<!DOCTYPE html><html><body><div style="height:2000px"></div>'
                    '<section id="verdict"><div class="headline">late verdict</div>'
                    '<div class="key" style="visibility:hidden">1 ms TTFT</div></section></body></html>')
    browser.open(page)
    got = browser.evaluate(PROBE)
    with pytest.raises(AssertionError, match="not in the first"):
        in_first_screen(got["verdict"], "the verdict")
    with pytest.raises(AssertionError, match="hidden"):
        in_first_screen(got["tiles"][0], "a tile")


READINESS_PROBE = r"""
(() => {
  const h = document.querySelector('.headline');
  const r = h ? h.getBoundingClientRect() : null;
  const rows = [...document.querySelectorAll('#card tbody tr')].map(tr => {
    const b = tr.getBoundingClientRect();
    return {id: tr.id, top: b.top, bottom: b.bottom, text: tr.innerText};
  });
  return {headline: h ? h.innerText : null, top: r ? r.top : null, bottom: r ? r.bottom : null, rows: rows};
})()
"""


def test_the_readiness_card_in_a_browser(browser: Browser, tmp_path: Path) -> None:
    """The shipped readiness page as a person opens it: the verdict and the four checks' rows in the first
    screen, the failed check naming its rule, no console error, no template hole."""
    page = tmp_path / "readiness.html"
    page.write_bytes((READINESS / "readiness.html").read_bytes())
    browser.open(page)
    assert browser.console_errors() == []
    got = browser.evaluate(READINESS_PROBE)
    assert got["headline"] and got["headline"].startswith("not ready: RDY003"), got
    assert got["top"] >= 0 and got["bottom"] <= VIEWPORT[1], got
    assert [r["id"] for r in got["rows"]] == ["RDY001", "RDY002", "RDY003", "RDY004"], got["rows"]
    assert got["rows"][0]["top"] < VIEWPORT[1], "the card starts below the first screen"
    assert "(rule RDY032)" in got["rows"][2]["text"] and "fail" in got["rows"][2]["text"], got["rows"][2]
    assert not template_holes(str(browser.evaluate("document.body.innerText")))
    shot = browser.screenshot(shots_dir(tmp_path) / "readiness_vllm_cpu_card.png")
    assert png_size(shot) == VIEWPORT
