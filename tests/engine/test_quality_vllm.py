"""The quality guard's hashes on vLLM CPU (issue 38): vLLM streams each delta's token ids when asked
(``return_token_ids``), so a greedy capture hashes the outputs' token ids, not their text: one id per token the
server counted (usage.completion_tokens), a prefix hash at every 8 ids, no text stored. Two greedy captures are
compared id by id. (llama-server ignores the option; tests/engine/test_quality_llama.py has its text hashes.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnose.compare.quality import agreement
from diagnose.io.bundle import open_bundle
from diagnose.probes.output_hash import STEP

pytestmark = pytest.mark.engine
DIAG = [sys.executable, "-m", "diagnose"]
N = 8


def greedy(url: str, out: Path) -> list[dict[str, Any]]:
    p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "1", "--baseline", "0", "--warmup", "0", "--no-nvml",
                        "-n", str(N), "--input-tokens", "64", "--output-tokens", "24", "--ignore-eos", "--seed", "3",
                        "--greedy", "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return list(open_bundle(out).records("requests"))


def test_greedy_outputs_are_hashed_by_their_token_ids(vllm_server: Any, tmp_path: Path) -> None:
    recs = greedy(vllm_server.url, tmp_path / "a")
    assert len(recs) == N and all(r["ok"] for r in recs)
    assert {r["output_hash_of"] for r in recs} == {"token_ids"}, [r.get("output_hash_of") for r in recs]
    for r in recs:  # one id per token the engine counted: a prefix hash at each multiple of 8 of them
        assert [t for t, _ in r["output_prefix_hashes"]] == list(range(STEP, r["output_tokens_usage"] + 1, STEP)), r
        assert "output_text" not in r
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert "return_token_ids" in json.dumps(manifest)  # the option the client negotiated, recorded
    greedy(vllm_server.url, tmp_path / "b")
    ag = agreement(str(tmp_path / "a"), str(tmp_path / "b"))
    assert ag is not None and ag["greedy"] and ag["pairs"] == N and ag["hashed"] == "token ids", ag
    assert "kind_mismatched" not in ag
