"""The shipped sample captured with length distributions (sample_traces/vllm_cpu_lognormal_lengths): the manifest
records both, the workload card names them, and the lengths the engine really saw vary as drawn, within bounds."""

from __future__ import annotations

import statistics
from pathlib import Path

from diagnose.io.bundle import open_bundle
from diagnose.pipeline import analyze

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "vllm_cpu_lognormal_lengths"


def test_the_sample_records_and_shows_its_length_distributions() -> None:
    b = open_bundle(SAMPLE / "bundle")
    wl = b.manifest["workload"]
    assert wl["input_lengths"]["kind"] == "lognormal" and wl["output_lengths"]["kind"] == "uniform"
    reqs = [r for r in b.records("requests") if r["ok"] and not r["warmup"] and r["phase"] == 1]
    assert len(reqs) > 150
    outs = [r["max_tokens"] for r in reqs]
    assert min(outs) >= 16 and max(outs) <= 96 and len(set(outs)) > 40  # uniform 16-96: nearly every value
    served = [r["prompt_tokens_usage"] for r in reqs]  # the engine's own count of each prompt
    assert min(served) >= 16 and max(served) <= 1024 + 8 and len(set(served)) > 100
    assert statistics.mean(served) > statistics.median(served)  # lognormal: skewed right
    assert all(r["output_tokens_usage"] == r["max_tokens"] for r in reqs)  # ignore_eos: exactly as drawn
    card = analyze(SAMPLE).workload_card
    assert card is not None
    assert card["lengths"]["input"] == "lognormal, mean 256, stdev 160, 16 to 1024"
    assert card["lengths"]["output"] == "uniform, 16 to 96" and card["lengths"]["seed"] == 7
    assert card["input_tokens"]["p90"] > 1.8 * card["input_tokens"]["p50"]
