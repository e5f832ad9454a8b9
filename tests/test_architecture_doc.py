"""docs/ARCHITECTURE.md states the hops and reach-backs that tools/hops.py measures on the README's sample
(issue 32 item 7): a change that adds or removes a reach-back must say so in the doc. The tool runs in a fresh
process (what an earlier test imported or cached would hide calls from it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_doc_states_the_measured_counts() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "hops.py"),
                        str(ROOT / "sample_traces" / "vllm_cpu_queue_bound")],
                       capture_output=True, text=True, timeout=240, check=True)
    edges = int(re.search(r"^module edges: (\d+)$", p.stdout, re.M).group(1))  # type: ignore[union-attr]
    back = int(re.search(r"^reach-backs: (\d+)$", p.stdout, re.M).group(1))  # type: ignore[union-attr]
    callees = re.findall(r"^  \S+ -> (\S+)$", p.stdout, re.M)
    assert len(callees) == back, p.stdout
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert f"**{edges} module edges**" in doc, p.stdout
    assert f"**{back} reach-back{'' if back == 1 else 's'}**" in doc, p.stdout
    for callee in callees:  # each reach-back's callee function is named in the doc
        assert callee.rsplit(".", 1)[-1] in doc, callee
