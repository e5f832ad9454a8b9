"""Golden values of the shipped samples: every signal the analysis computes, pinned beside expected_findings.json.

``sample_traces/<sample>/expected_signals.json`` holds, for one sample, the value and unit of every run signal,
of every phase's signals (by phase label), a digest of each signal's series (points, sum, min, max), and the
findings' rule ids, severities and scores with the verdict's headline. tests/test_sample_signals.py checks
each sample against its file, so a change that moves a number says which numbers moved, by how much and
where; a change that moves them on purpose rewrites the files and says why in its commit:

    .venv/bin/python tests/golden.py --write            # every sample
    .venv/bin/python tests/golden.py --write vllm_cpu_queue_bound
    .venv/bin/python tests/golden.py                    # check only: list what moved, exit 1 if anything did
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
FILE = "expected_signals.json"
FORMAT = 1
REL_TOL = 1e-9  # the analysis is deterministic; this absorbs only the last bits of a float sum's order
ABS_TOL = 1e-12


def samples() -> list[Path]:
    return sorted(p.parent for p in SAMPLES.glob("*/expected_findings.json"))


def bundle_of(sample: Path) -> Path:
    return sample / "bundle" if (sample / "bundle" / "manifest.json").exists() else sample


def _num(v: float) -> float | str:
    """A JSON-safe number: non-finite values as their names (a signal should never be one; if it is, say so)."""
    v = float(v)
    return v if math.isfinite(v) else repr(v)


def _signals(sigs: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(sigs):
        s = sigs[name]
        rec: dict[str, Any] = {"value": _num(s.value), "unit": s.unit, "source": s.source}
        if s.series:
            vals = [float(v) for _, v in s.series]
            rec["series"] = {"points": len(vals), "sum": _num(math.fsum(vals)), "min": _num(min(vals)),
                             "max": _num(max(vals))}
        out[name] = rec
    return out


def golden(sample: Path) -> dict[str, Any]:
    """What the analysis of ``sample`` computes today, in the file's shape."""
    from diagnose.pipeline import analyze_bundle

    a = analyze_bundle(bundle_of(sample))
    return {
        "format": FORMAT,
        "sample": sample.name,
        "signals": _signals(a.signals),
        "phases": [{"phase": p.phase, "label": p.name, "role": p.role, "signals": _signals(sigs)}
                   for p, sigs in zip(a.phases, a.phase_signals, strict=True)],
        "findings": [{"rule": f.rule_id, "severity": f.severity, "score": _num(f.score),
                      "explained_by": f.explained_by, "held_back": f.held_back} for f in a.findings],
        "verdict": a.verdict.headline if a.verdict is not None else None,
    }


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


def _diff_signals(where: str, want: Mapping[str, Any], got: Mapping[str, Any]) -> Iterable[str]:
    for name in sorted(set(want) - set(got)):
        yield f"{where}: {name} is gone (was {want[name]['value']} {want[name]['unit']})"
    for name in sorted(set(got) - set(want)):
        yield f"{where}: {name} is new ({got[name]['value']} {got[name]['unit']})"
    for name in sorted(set(want) & set(got)):
        w, g = want[name], got[name]
        for key in ("value", "unit", "source"):
            if not _close(w.get(key), g.get(key)):
                yield f"{where}: {name} {key} {w.get(key)!r} -> {g.get(key)!r}"
        ws, gs = w.get("series") or {}, g.get("series") or {}
        for key in sorted(set(ws) | set(gs)):
            if not _close(ws.get(key), gs.get(key)):
                yield f"{where}: {name} series {key} {ws.get(key)!r} -> {gs.get(key)!r}"


def differences(want: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """Every pinned number that moved, one line each (empty: the analysis computes what was pinned)."""
    out = list(_diff_signals("run", want["signals"], got["signals"]))
    wp = {p["label"]: p for p in want["phases"]}
    gp = {p["label"]: p for p in got["phases"]}
    if list(wp) != list(gp):
        out.append(f"phases {list(wp)} -> {list(gp)}")
    for label in wp.keys() & gp.keys():
        if (wp[label]["phase"], wp[label]["role"]) != (gp[label]["phase"], gp[label]["role"]):
            out.append(f"phase {label}: {wp[label]['phase']}/{wp[label]['role']} -> "
                       f"{gp[label]['phase']}/{gp[label]['role']}")
        out.extend(_diff_signals(f"phase {label}", wp[label]["signals"], gp[label]["signals"]))
    wf = [(f["rule"], f["severity"], f["explained_by"], f["held_back"]) for f in want["findings"]]
    gf = [(f["rule"], f["severity"], f["explained_by"], f["held_back"]) for f in got["findings"]]
    if wf != gf:
        out.append(f"findings {wf} -> {gf}")
    else:
        for w, g in zip(want["findings"], got["findings"], strict=True):
            if not _close(w["score"], g["score"]):
                out.append(f"finding {w['rule']} score {w['score']} -> {g['score']}")
    if want["verdict"] != got["verdict"]:
        out.append(f"verdict {want['verdict']!r} -> {got['verdict']!r}")
    return out


def write(sample: Path) -> Path:
    path = sample / FILE
    path.write_text(json.dumps(golden(sample), indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str]) -> int:
    do_write = "--write" in argv
    names = [a for a in argv if not a.startswith("--")]
    chosen = [s for s in samples() if not names or s.name in names]
    unknown = set(names) - {s.name for s in chosen}
    if unknown:
        print(f"golden: no such sample: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    moved = 0
    for s in chosen:
        if do_write:
            print(f"wrote {write(s).relative_to(ROOT)}")
            continue
        path = s / FILE
        if not path.exists():
            print(f"{s.name}: no {FILE}")
            moved += 1
            continue
        diffs = differences(json.loads(path.read_text()), golden(s))
        moved += bool(diffs)
        for d in diffs:
            print(f"{s.name}: {d}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
