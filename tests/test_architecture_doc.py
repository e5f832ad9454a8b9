"""docs/ARCHITECTURE.md states the hops and reach-backs that tools/hops.py measures on the README's sample
(issue 32 item 7): a change that adds or removes a reach-back must say so in the doc."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import hops  # noqa: E402


def test_the_doc_states_the_measured_counts() -> None:
    edges, _order = hops.run(ROOT / "sample_traces" / "vllm_cpu_queue_bound")
    rank = {s: i for i, s in enumerate(hops.ORDERED)}
    back = [(a, b) for a, b in edges if (sa := hops.stage(a)) in rank and (sb := hops.stage(b)) in rank
            and rank[sa] > rank[sb]]
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert f"**{len(edges)} module edges**" in doc, len(edges)
    assert f"**{len(back)} reach-backs**" in doc, sorted(back)
    for _a, b in back:  # each reach-back's callee is named in the doc
        assert b.rsplit(".", 1)[-1] in doc, b
