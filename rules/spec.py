"""Rule specifications: one YAML file per rule under rules/catalog/<family>/<ID>.yaml."""

from __future__ import annotations

import math
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diagnose.engines.experiments import variable_problems
from diagnose.errors import InputError
from diagnose.model import SEVERITY_WEIGHT
from diagnose.rules.conditions import referenced_signals

CATALOG_DIR = Path(__file__).parent / "catalog"
THRESHOLDS_FILE = Path(__file__).parent / "thresholds.yaml"
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
FAMILIES = ("latency", "scheduler", "gpu", "host", "validity", "cost", "trace", "fleet", "readiness")
SCOPES = ("run", "phase")
# symptom: restates what is out of line (high TTFT, latency grows with load); cause: names why. The verdict and
# the ranking put causes first: a symptom never outranks a cause that fired beside it.
KINDS = ("cause", "symptom")
DIRECTIONS = ("up", "down", "flat")
ID_RE = re.compile(r"^[A-Z]{2,5}[0-9]{3}$")
# a cause's machine-readable evidence: met in the bundle -> "supported" / "ruled out" (same syntax as `when`)
CAUSE_CONDITIONS = ("supported_when", "refuted_when")
REQUIRED_KEYS = ("id", "name", "family", "severity", "when", "title", "hypothesis", "causes")
KNOWN_KEYS = set(REQUIRED_KEYS) | {
    "requires", "scope", "evidence", "impact", "confidence", "runbook", "description",
    "suppressed_by", "tags", "kind", "explains", "share", "holds_back", "timing_free", "minor_when",
}


@dataclass(frozen=True)
class RuleSpec:
    id: str
    name: str
    family: str
    severity: str
    when: dict[str, Any]
    title: str
    hypothesis: str
    causes: tuple[dict[str, Any], ...]
    requires: tuple[str, ...] = ()
    scope: str = "run"
    evidence: tuple[str, ...] = ()
    impact: dict[str, Any] | None = None
    confidence: float = 0.6
    runbook: str = ""
    description: str = ""
    suppressed_by: tuple[str, ...] = ()
    kind: str = "cause"
    # the symptom / consequence rules this cause explains: when both fire, those are shown under this one
    # ("explained by"), ranked after every unexplained finding, and their experiments are dropped (advice for a
    # consequence, such as "raise --max-num-seqs" for queueing caused by KV preemption, can worsen the cause)
    explains: tuple[str, ...] = ()
    # the signals (ratios, first present wins) that say what share of the symptom this cause explains
    share: tuple[str, ...] = ()
    # when this (validity) rule fires, a finding whose firing condition reads only signals of these sources is
    # held back: not judged, ranked last, and the report says why (a client near its limit could explain it)
    holds_back: tuple[str, ...] = ()
    # its condition reads no latency (counts, finish reasons): a client near its limit cannot make it fire, so
    # holds_back never holds it back
    timing_free: bool = False
    # impact gate (issue 35): when this condition holds, what the finding explains is too small a share of the
    # time to matter and the finding is reported at info, whatever its severity
    minor_when: dict[str, Any] | None = None
    path: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def all_signals(self) -> set[str]:
        out = set(self.requires) | set(self.evidence) | set(self.share) | referenced_signals(self.when)
        if self.minor_when:
            out |= referenced_signals(self.minor_when)
        if self.impact and isinstance(self.impact.get("signal"), str):
            out.add(self.impact["signal"])
        for c in self.causes:
            exp = c.get("experiment") or {}
            out |= set((exp.get("expect") or {}).keys())
            value = (exp.get("variable") or {}).get("value") if isinstance(exp.get("variable"), dict) else None
            if isinstance(value, dict) and isinstance(value.get("signal"), str):
                out.add(value["signal"])
            for key in CAUSE_CONDITIONS:
                if c.get(key) is not None:
                    out |= referenced_signals(c[key])
        return out


def spec_problems(raw: Any, path: str) -> list[str]:
    """Schema problems of one rule file (empty list = valid)."""
    if not isinstance(raw, dict):
        return [f"{path}: a rule file must hold a mapping"]
    probs: list[str] = []
    for k in REQUIRED_KEYS:
        if k not in raw:
            probs.append(f"{path}: missing key '{k}'")
    for k in raw:
        if k not in KNOWN_KEYS:
            probs.append(f"{path}: unknown key '{k}'")
    rid = str(raw.get("id", ""))
    if rid and not ID_RE.match(rid):
        probs.append(f"{path}: id {rid!r} must look like ABC123")
    if raw.get("family") not in FAMILIES:
        probs.append(f"{path}: family {raw.get('family')!r} not one of {', '.join(FAMILIES)}")
    if raw.get("severity") not in SEVERITY_WEIGHT:
        probs.append(f"{path}: severity {raw.get('severity')!r} not one of {', '.join(SEVERITY_WEIGHT)}")
    if raw.get("scope", "run") not in SCOPES:
        probs.append(f"{path}: scope must be one of {', '.join(SCOPES)}")
    causes = raw.get("causes")
    if not isinstance(causes, list) or not causes:
        probs.append(f"{path}: 'causes' needs at least one cause")
    else:
        for i, c in enumerate(causes):
            if not isinstance(c, dict) or "cause" not in c:
                probs.append(f"{path}: cause #{i + 1} needs 'cause'")
                continue
            for key in CAUSE_CONDITIONS:
                if key in c and not isinstance(c[key], dict):
                    probs.append(f"{path}: {key} of cause {c['cause']!r} must be a condition (a mapping)")
            exp = c.get("experiment")
            if exp is None:
                probs.append(f"{path}: cause {c['cause']!r} has no experiment")
                continue
            if not isinstance(exp, dict) or "change" not in exp:
                probs.append(f"{path}: experiment of cause {c['cause']!r} needs 'change'")
                continue
            if "variable" in exp:  # optional for a user's rules; every shipped rule has one (tests/test_experiments.py)
                probs.extend(variable_problems(exp["variable"], f"{path}: experiment of cause {c['cause']!r}"))
            for sig, d in (exp.get("expect") or {}).items():
                if d not in DIRECTIONS:
                    probs.append(f"{path}: expected direction {d!r} for {sig} not one of up/down/flat")
    if raw.get("kind", "cause") not in KINDS:
        probs.append(f"{path}: kind must be one of {', '.join(KINDS)}")
    for key in ("suppressed_by", "explains"):
        ids = raw.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, str) and ID_RE.match(i) for i in ids):
            probs.append(f"{path}: {key} must be a list of rule ids")
    if raw.get("explains") and raw.get("kind", "cause") != "cause":
        probs.append(f"{path}: only a cause rule explains others (kind: symptom has no explains)")
    hb = raw.get("holds_back", [])
    if not isinstance(hb, list) or not all(isinstance(x, str) for x in hb):
        probs.append(f"{path}: holds_back must be a list of sources (client, server, ...)")
    if not isinstance(raw.get("timing_free", False), bool):
        probs.append(f"{path}: timing_free must be true or false")
    share = raw.get("share", [])
    if not (isinstance(share, str) or (isinstance(share, list) and all(isinstance(x, str) for x in share))):
        probs.append(f"{path}: share must be a signal name or a list of them")
    conf = raw.get("confidence", 0.6)
    if not isinstance(conf, (int, float)) or not 0 < conf <= 1:
        probs.append(f"{path}: confidence must be in (0, 1]")
    return probs


def parse_spec(raw: dict[str, Any], path: str) -> RuleSpec:
    return RuleSpec(
        id=str(raw["id"]),
        name=str(raw["name"]),
        family=str(raw["family"]),
        severity=str(raw["severity"]),
        when=dict(raw["when"]),
        minor_when=dict(raw["minor_when"]) if isinstance(raw.get("minor_when"), dict) else None,
        title=str(raw["title"]),
        hypothesis=str(raw["hypothesis"]),
        causes=tuple(dict(c) for c in raw["causes"]),
        requires=tuple(raw.get("requires") or ()),
        scope=str(raw.get("scope", "run")),
        evidence=tuple(raw.get("evidence") or ()),
        impact=dict(raw["impact"]) if raw.get("impact") else None,
        confidence=float(raw.get("confidence", 0.6)),
        runbook=str(raw.get("runbook", "")),
        description=str(raw.get("description", "")),
        kind=str(raw.get("kind", "cause")),
        suppressed_by=tuple(raw.get("suppressed_by") or ()),
        explains=tuple(raw.get("explains") or ()),
        holds_back=tuple(raw.get("holds_back") or ()),
        timing_free=bool(raw.get("timing_free", False)),
        share=tuple([raw["share"]] if isinstance(raw.get("share"), str) else raw.get("share") or ()),
        path=path,
        raw=raw,
    )


def rule_files(dirs: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        # a "cases" folder beside user rules holds their test cases, not rules
        out.extend(sorted(p for p in d.rglob("*.yaml") if p.is_file() and "cases" not in p.relative_to(d).parts))
    return out


def load_raw(path: Path) -> Any:
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block for ever, a device mislead
            raise InputError(f"{path}: not a regular file")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        # libyaml's loader when PyYAML has it: same SafeConstructor, about 10x faster than the pure-Python one
        return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{path}:{where} invalid YAML ({problem})") from e


def load_rules(extra_dirs: Iterable[str | Path] = ()) -> list[RuleSpec]:
    """The built-in catalog plus user rule directories; a bad rule file is a one-line InputError."""
    dirs = [CATALOG_DIR]
    for d in extra_dirs:
        p = Path(d)
        if not p.is_dir():
            raise InputError(f"--rules {p}: not a directory")
        dirs.append(p)
    specs: list[RuleSpec] = []
    seen: dict[str, str] = {}
    for f in rule_files(dirs):
        raw = load_raw(f)
        probs = spec_problems(raw, str(f))
        if probs:
            raise InputError(probs[0] + (f" (and {len(probs) - 1} more; run `diagnose rules lint`)" if len(probs) > 1 else ""))
        spec = parse_spec(raw, str(f))
        if spec.id in seen:
            raise InputError(f"{f}: duplicate rule id {spec.id} (also in {seen[spec.id]})")
        seen[spec.id] = str(f)
        specs.append(spec)
    return specs


def load_thresholds(files: Iterable[str | Path] = (), overrides: dict[str, float] | None = None) -> dict[str, float]:
    """Defaults from rules/thresholds.yaml, then each --thresholds FILE, then --threshold name=value."""
    base = _threshold_file(THRESHOLDS_FILE)
    out = {k: v["value"] for k, v in base.items()}
    for f in files:
        for k, v in _threshold_file(Path(f), flat_ok=True).items():
            if k not in out:
                raise InputError(f"{f}: unknown threshold {k!r} (see `diagnose rules thresholds`)")
            out[k] = v["value"]
    for name, value in (overrides or {}).items():
        if name not in out:
            raise InputError(f"--threshold {name}: unknown threshold (see `diagnose rules thresholds`)")
        if not math.isfinite(float(value)):
            raise InputError(f"--threshold {name}: {value} is not a finite number")
        out[name] = float(value)
    return out


def threshold_docs() -> dict[str, dict[str, Any]]:
    return _threshold_file(THRESHOLDS_FILE)


def _threshold_file(path: Path, flat_ok: bool = False) -> dict[str, dict[str, Any]]:
    raw = load_raw(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a mapping of threshold name to value")
    out: dict[str, dict[str, Any]] = {}
    for k, v in raw.items():
        if isinstance(v, dict) and "value" in v:
            val = v["value"]
            entry = dict(v)
        elif flat_ok and isinstance(v, (int, float)):
            val = v
            entry = {"value": v}
        else:
            raise InputError(f"{path}: threshold {k!r} needs a numeric value")
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise InputError(f"{path}: threshold {k!r} needs a finite numeric value")
        entry["value"] = float(val)
        out[str(k)] = entry
    return out
