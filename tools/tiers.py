"""Write tests/tiers.json, the tests the unit tier (the README's `python -m pytest -q`) leaves to the slow tier,
from a `pytest --durations=0` log of the whole unit suite on this machine.

    .venv/bin/python -m pytest -q -m 'not engine and not gpu' --durations=0 > /tmp/durations.log
    .venv/bin/python tools/tiers.py /tmp/durations.log [--over 0.5]

A test goes to the slow tier when its setup + call + teardown took at least ``--over`` seconds (default 0.5 s
on 2 idle cores). Tests marked ``timing`` by tests/conftest.py stay in their own tier; the fuzz corpus
samples itself (tests/test_fuzz_read.py). tests/conftest.py marks every listed node id ``slow``; CI runs them
after the unit tier (`python -m pytest -m slow`), so nothing is skipped, only ordered. A test added since the
list was written runs in the unit tier until the list is rewritten.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "tiers.json"
LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(\S.*?)\s*$")


def slow_tests(log: str, over: float) -> list[str]:
    part = log.split("slowest durations", 1)[-1]
    total: Counter[str] = Counter()
    for line in part.splitlines():
        m = LINE.match(line)
        if m and "::" in m.group(2):
            total[m.group(2)] += float(m.group(1))
    return sorted(n for n, t in total.items() if t >= over and "test_fuzz_read.py::" not in n)


def timing_tests() -> set[str]:
    """The tests tests/conftest.py marks ``timing`` (they keep their own tier)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from tests.conftest import TIMING

    return set(TIMING)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--over", type=float, default=0.5, help="seconds per test (default 0.5)")
    args = ap.parse_args()
    timing = timing_tests()
    names = [n for n in slow_tests(args.log.read_text(errors="replace"), args.over) if n.split("[", 1)[0] not in timing]
    OUT.write_text(json.dumps({"over_s": args.over, "slow": names}, indent=0) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(names)} tests of {args.over:g} s or more")


if __name__ == "__main__":
    main()
