"""Every shipped sample's signal values are pinned (sample_traces/<sample>/expected_signals.json, tests/golden.py).

A change that moves a number fails here with every number it moved, so a refactor shows it moved none and a
deliberate change shows which ones it moved and by how much (rewrite with ``python tests/golden.py --write``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from golden import FILE, differences, golden, samples

SAMPLES = samples()


def test_every_sample_has_its_golden_values() -> None:
    assert SAMPLES, "no samples found"
    missing = [s.name for s in SAMPLES if not (s / FILE).exists()]
    assert not missing, f"samples without {FILE}: {missing} (python tests/golden.py --write NAME)"


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_signals_are_the_pinned_ones(sample: Path) -> None:
    want = json.loads((sample / FILE).read_text())
    assert want["signals"], f"{sample.name}: nothing pinned"
    diffs = differences(want, golden(sample))
    assert not diffs, f"{sample.name}: {len(diffs)} pinned values moved:\n" + "\n".join(diffs[:60])


def test_a_moved_number_is_reported_with_its_name_and_both_values() -> None:
    sample = next(s for s in SAMPLES if s.name == "vllm_cpu_queue_bound")
    want = json.loads((sample / FILE).read_text())
    got = copy.deepcopy(want)
    name = sorted(got["signals"])[0]
    got["signals"][name]["value"] = float(got["signals"][name]["value"]) * 1.01 + 1.0
    del got["signals"][sorted(got["signals"])[1]]
    label = got["phases"][-1]["label"]
    got["phases"][-1]["signals"]["made_up_ms"] = {"value": 1.0, "unit": "ms", "source": "client"}
    diffs = differences(want, got)
    assert any(d.startswith(f"run: {name} value ") for d in diffs), diffs
    assert any("is gone" in d for d in diffs), diffs
    assert f"phase {label}: made_up_ms is new (1.0 ms)" in diffs, diffs
    assert differences(want, copy.deepcopy(want)) == []
