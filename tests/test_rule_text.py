"""Rule text templates: a ``[[A||B]]`` segment shows A when every value it names is known, else B, else nothing,
so a finding never prints 'unknown ms' for a value the bundle does not hold (issue 32 item 6)."""

from __future__ import annotations

from diagnose.model import Signal
from diagnose.rules.engine import render_text


def _sigs(**values: float) -> dict[str, Signal]:
    return {k: Signal(k, v, "ms", "server", f"the {k}") for k, v in values.items()}


def test_a_segment_naming_a_missing_signal_is_left_out() -> None:
    t = "Waiting {a:.0f} ms.[[ The server's queue time is {b:.0f} ms.]] Done."
    assert render_text(t, _sigs(a=12.0), {}) == "Waiting 12 ms. Done."
    assert render_text(t, _sigs(a=12.0, b=30.4), {}) == "Waiting 12 ms. The server's queue time is 30 ms. Done."


def test_the_alternative_is_shown_when_the_first_cannot_be() -> None:
    t = "hit ratio [[{h:.0%}||not counted]], shared {s:.0%}"
    assert render_text(t, _sigs(s=0.75), {}) == "hit ratio not counted, shared 75%"
    assert render_text(t, _sigs(s=0.75, h=0.25), {}) == "hit ratio 25%, shared 75%"
    assert render_text(t, _sigs(s=0.75, h=float("nan")), {}) == "hit ratio not counted, shared 75%"


def test_labels_thresholds_and_plain_text_inside_segments() -> None:
    t = "[[{label.a} is {a:.1f}||no a]]; [[over {thr.x:g}]][[{label.b}]]"
    assert render_text(t, _sigs(a=1.25), {"x": 3.0}) == "the a is 1.2; over 3"
    assert render_text(t, _sigs(), {"x": 3.0}) == "no a; over 3"


def test_a_template_without_segments_renders_as_before() -> None:
    assert render_text("queue {a:.0f} ms of {b:.0f} ms", _sigs(a=1.0), {}) == "queue 1 ms of unknown ms"
    assert render_text("brackets [x] stay", {}, {}) == "brackets [x] stay"
