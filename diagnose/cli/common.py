"""What `diagnose compare`, `diagnose verify` and `diagnose experiment` share: analysing an input, writing an
output, the seed check, JSON bytes, a relative change as text and a verification's lines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import InputError

if TYPE_CHECKING:  # pandas/numpy: `diagnose --help` must not pay for them
    from diagnose.compare.verify import Verification


def _analyze(path: Path) -> Any:
    from diagnose.pipeline import analyze

    return analyze(path)


def _write(path: Path | None, data: bytes) -> None:
    """Through the one output writer (diagnose/io/outputs.py: temp file and rename, or in place onto a device or
    FIFO; nothing left behind on failure); one-line error."""
    if path is None:
        return
    from diagnose.io.outputs import write_bytes

    write_bytes(path, data, parents=True)


SEED_MAX = 2**32 - 1


def check_seed(seed: int) -> None:
    if not 0 <= seed <= SEED_MAX:
        raise InputError(f"--seed {seed}: use an integer from 0 to {SEED_MAX}")


def _json(obj: Mapping[str, object]) -> bytes:
    """A JSON document as the commands write it: indented, keys sorted, ``schema_version`` (when it has one)
    first (docs/json-schemas.md)."""
    import orjson

    from diagnose.io.schemas import dumps

    option = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    return dumps(obj, option) if "schema_version" in obj else orjson.dumps(obj, option=option)


def _pct(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:+.1%}"


def verification_lines(v: Verification) -> list[str]:
    lines = [v.headline(), f"  finding: {v.finding} {v.title}", f"  experiment: {v.change}",
             f"  at level {v.level}: {v.reason}; in the new run the finding {_after(v.finding_after)}"]
    for m in v.moves:
        iv = f" [{_pct(m.interval[0])}, {_pct(m.interval[1])}]" if m.interval else ""
        lines.append(f"  expected {m.signal} {m.expect}: {_pct(m.rel)}{iv} -> {m.outcome}")
    if v.worse_elsewhere:
        lines.append("  significantly worse elsewhere: " + ", ".join(v.worse_elsewhere))
    from diagnose.compare.quality import lines as quality_lines

    return lines + quality_lines(v.comparison.quality)


def _after(state: str) -> str:
    return {"gone": "is gone", "weaker": "is weaker"}.get(state, state)
