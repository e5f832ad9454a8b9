"""docs/robustness.md names, for every promise, the test that checks it: each named test exists (a renamed or
removed test would leave a promise unchecked; one such line was found and fixed when part 3 was added)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_the_robustness_page_names_exists() -> None:
    doc = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    names = set(re.findall(r"\b(test_[a-z0-9_]+)\b(?!\.py)", doc))
    assert len(names) > 100, len(names)
    defined = set()
    for p in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_[a-z0-9_]+)", p.read_text(encoding="utf-8"), re.M))
    missing = sorted(names - defined - {p.stem for p in (ROOT / "tests").rglob("test_*.py")})
    assert not missing, f"docs/robustness.md names tests that do not exist: {missing}"
