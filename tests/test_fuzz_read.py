"""The bad-input corpus and a seeded fuzzer over the shipped samples, each case held to one contract
(tests/badinput.py ``check_contract``): no traceback, no "internal error", no hang; an unusable input is a
non-zero exit with one line naming the file (and line or field); a usable one a result, with a counted warning
when the damage is one the reader can notice.

* corpus: every case of tests/badinput_cases.py (bundles, manifests, streams, artifacts, traces, span files,
  CLI arguments), run through ``diagnose analyze`` in-process (click's CliRunner), report and --json included.
* fuzz: FUZZ_CASES seeded mutations (seed FUZZ_SEED) of the small copies of all samples (tests/badinput.py
  ``mini_sample``): byte flips in a stream (decompressed or compressed) or in manifest.json, lines cut,
  duplicated or dropped, streams deleted, emptied or duplicated, a field set to a wrong type or a huge value.
  Each runs the whole pipeline through the library (``diagnose.pipeline.analyze``, then the --json document),
  on a bundle that keeps the mutated stream and the load probe's streams (the others are left out so that
  hundreds of cases fit the unit suite's time; each normaliser reads only its own streams).

Every case has its own time limit (pytest-timeout). The last test prints and checks the counts:
``corpus/fuzz: N cases, tracebacks=0, internal errors=0, hangs=0``.

Tiers (issue 39): the unit tier (the README's command) runs a sample of each, drawn by ``SAMPLE_SEED``
(``DIAGNOSE_FUZZ_SAMPLE_SEED``, default 0: the same sample every run; set it to explore others); the rest of
each is marked ``slow``, which CI runs after the unit tier, so CI runs the whole corpus and all fuzz cases.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from diagnose.cli.analyze import analysis_json
from diagnose.errors import DiagnoseError
from diagnose.pipeline import analyze as analyze_lib
from tests.badinput import (
    LOAD_STREAMS,
    SAMPLE_NAMES,
    STREAMS,
    Outcome,
    analyze,
    check_contract,
    dumps,
    mini_sample,
    outcome,
    read_stream,
    stream_path,
    write_stream,
)
from tests.badinput_cases import CASES

FUZZ_SEED = 20261201
FUZZ_CASES = 330
SAMPLE_SEED = int(os.environ.get("DIAGNOSE_FUZZ_SAMPLE_SEED") or 0)
CORPUS_SAMPLE = 30  # corpus cases in the unit tier
FUZZ_SAMPLE = 30  # fuzz cases in the unit tier


def tiered(values: list[Any], sample: int, salt: str) -> list[Any]:
    """``values`` as pytest params: ``sample`` of them (drawn by SAMPLE_SEED) in the unit tier, the rest marked
    ``slow``; together always all of them."""
    chosen = set(random.Random(f"{SAMPLE_SEED}:{salt}").sample(range(len(values)), min(sample, len(values))))
    return [v if i in chosen else pytest.param(v, marks=pytest.mark.slow) for i, v in enumerate(values)]

TALLY: Counter[str] = Counter()
STARTED: Counter[str] = Counter()


# -- the corpus ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", tiered(sorted(CASES), CORPUS_SAMPLE, "corpus"))
def test_corpus_case(name: str, tmp_path: Path) -> None:
    STARTED["corpus"] += 1
    spec = CASES[name](tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    o = outcome(analyze(spec.args, out))
    _tally("corpus", o)
    why = check_contract(o, names=spec.names, expect=spec.expect, needle=spec.needle)
    assert not why, f"{name}: {why}"
    assert not list(out.glob("*.tmp")), "a temp file was left behind"


# -- the fuzzer ------------------------------------------------------------------------------------------------
WRONG = ["x", "", [], [1, "a"], {}, {"k": 1}, None, True, 1.5, -1, -(10**12), 2**63, 2**70, 1e308, -1e308]


def _records(b: Path, name: str) -> list[Any]:
    p = stream_path(b, name)
    if p is None:
        return []
    return read_stream(b, name)


def _lines(b: Path, name: str) -> tuple[Path, list[bytes]]:
    p = stream_path(b, name)
    assert p is not None
    data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    return p, data.splitlines(keepends=True)


def _put(p: Path, data: bytes) -> None:
    p.write_bytes(gzip.compress(data) if p.name.endswith(".gz") else data)


def _set_random_field(rng: random.Random, rec: dict[str, Any], huge: bool) -> str:
    keys = [k for k in rec if k != "kind"] or ["x"]
    k = rng.choice(keys)
    if huge:
        rec[k] = rng.choice([1e308, -1e308, 2**63, 2**64 + 1, 10**30, -(2**63) - 1])
    elif isinstance(rec.get(k), list) and rec[k] and rng.random() < 0.5:
        rec[k][rng.randrange(len(rec[k]))] = rng.choice(WRONG)
        return f"{k}[i]"
    else:
        rec[k] = rng.choice([v for v in WRONG if type(v) is not type(rec.get(k))])
    return k


def mutate(rng: random.Random, b: Path) -> tuple[str, str]:
    """Damages bundle ``b`` in one seeded way; returns (what was done, expectation for check_contract)."""
    present = [s for s in STREAMS if stream_path(b, s) is not None]
    stream = rng.choice(present)
    kind = rng.choice(["flip", "flip_gz", "cut", "drop_lines", "dup_lines", "delete", "empty", "dup_stream",
                       "wrong_type", "wrong_type", "huge", "manifest_flip", "manifest_type", "manifest_drop",
                       "not_object", "garbage_line"])
    if kind == "flip":
        p, lines = _lines(b, stream)
        data = bytearray(b"".join(lines))
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        _put(p, bytes(data))
        return f"flip bytes in {p.name}", "any"
    if kind == "flip_gz":
        p = stream_path(b, stream)
        assert p is not None
        raw = bytearray(p.read_bytes())
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(10 if len(raw) > 20 else 0, len(raw))
            raw[i] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(raw))
        return f"flip bytes in compressed {p.name}", "any"
    if kind == "cut":
        p, lines = _lines(b, stream)
        data = b"".join(lines)
        _put(p, data[: rng.randrange(1, max(2, len(data)))])
        return f"cut {p.name}", "any"
    if kind in ("drop_lines", "dup_lines"):
        p, lines = _lines(b, stream)
        idx = sorted(rng.sample(range(len(lines)), min(len(lines), rng.randint(1, 5))))
        if kind == "drop_lines":
            keep = [ln for i, ln in enumerate(lines) if i not in set(idx)]
        else:
            keep = lines + [lines[i] for i in idx]
        _put(p, b"".join(keep))
        return f"{kind} {idx} in {p.name}", "warn" if kind == "drop_lines" else "any"
    if kind == "delete":
        p = stream_path(b, stream)
        assert p is not None
        p.unlink()
        return f"delete {p.name}", "warn"
    if kind == "empty":
        p = stream_path(b, stream)
        assert p is not None
        _put(p, b"")
        return f"empty {p.name}", "warn"
    if kind == "dup_stream":
        p, lines = _lines(b, stream)
        other = b / (p.name[:-3] if p.name.endswith(".gz") else p.name + ".gz")
        _put(other, b"".join(lines))
        return f"second file {other.name}", "warn"
    if kind in ("wrong_type", "huge"):
        recs = _records(b, stream)
        if not recs:
            return "nothing to change", "any"
        i = rng.randrange(len(recs))
        fld = _set_random_field(rng, recs[i], kind == "huge")
        write_stream(b, stream, recs)
        return f"{kind} {stream} line {i + 1} field {fld}", "any"
    if kind == "not_object":
        p, lines = _lines(b, stream)
        i = rng.randrange(len(lines))
        lines[i] = dumps(rng.choice([[1, 2], "text", 3, None, True])) + b"\n"
        _put(p, b"".join(lines))
        return f"line {i + 1} of {p.name} not an object", "warn"
    if kind == "garbage_line":
        p, lines = _lines(b, stream)
        i = rng.randrange(len(lines) + 1)
        lines.insert(i, bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) + b"\n")
        _put(p, b"".join(lines))
        return f"garbage line {i + 1} in {p.name}", "any"
    mf = b / "manifest.json"
    m = orjson.loads(mf.read_bytes())
    if kind == "manifest_flip":
        raw = bytearray(mf.read_bytes())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        mf.write_bytes(bytes(raw))
        return "flip bytes in manifest.json", "any"
    path = _random_path(rng, m)
    if kind == "manifest_drop" and len(path) > 0:
        _at(m, path[:-1]).pop(path[-1], None)
        mf.write_bytes(dumps(m))
        return f"drop manifest {'.'.join(map(str, path))}", "any"
    if path:
        _at(m, path[:-1])[path[-1]] = rng.choice(WRONG)
    mf.write_bytes(dumps(m))
    return f"wrong type at manifest {'.'.join(map(str, path))}", "any"


def _random_path(rng: random.Random, m: dict[str, Any]) -> list[Any]:
    path: list[Any] = []
    d: Any = m
    while isinstance(d, dict) and d and rng.random() < 0.8:
        k = rng.choice(sorted(d))
        path.append(k)
        d = d[k]
    return path


def _at(m: dict[str, Any], path: list[Any]) -> Any:
    d: Any = m
    for k in path:
        d = d[k]
    return d


def _fuzz_bundle(rng: random.Random, tmp: Path, case_no: int) -> Path:
    """A copy of one sample's small bundle keeping the load streams and one other stream (the fuzz target)."""
    name = SAMPLE_NAMES[case_no % len(SAMPLE_NAMES)]
    src = mini_sample(name)
    b = tmp / "bundle"
    shutil.copytree(src, b)
    others = [s for s in STREAMS if s not in LOAD_STREAMS and stream_path(b, s) is not None]
    keep = set(LOAD_STREAMS) | ({rng.choice(others)} if others else set())
    if "metrics" in keep:
        keep.add("metric_families")
    for s in STREAMS:
        p = stream_path(b, s)
        if p is not None and s not in keep:
            p.unlink()
            m = orjson.loads((b / "manifest.json").read_bytes())
            m.get("streams", {}).pop(s, None)
            (b / "manifest.json").write_bytes(dumps(m))
    return b


def run_lib(path: Path) -> Outcome:
    """The pipeline through the library, as the CLI would report it: an error is its one line."""
    try:
        a = analyze_lib(path)
        orjson.dumps(analysis_json(a), option=orjson.OPT_SERIALIZE_NUMPY)
    except DiagnoseError as e:
        return Outcome(e.exit_code, "", f"diagnose: error: {e}\n", [])
    except Exception as e:  # noqa: BLE001 - what the contract forbids: recorded, then failed on
        return Outcome(70, "", "internal error\n" + "".join(traceback.format_exception(e)), [])
    return Outcome(5 if not a.run_valid else 0, a.verdict.headline if a.verdict else "", "",
                   [f"warning: {w}" for w in a.warnings])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case_no", tiered(list(range(FUZZ_CASES)), FUZZ_SAMPLE, "fuzz"))
def test_fuzz_case(case_no: int, tmp_path: Path) -> None:
    STARTED["fuzz"] += 1
    rng = random.Random(FUZZ_SEED * 1000 + case_no)
    b = _fuzz_bundle(rng, tmp_path, case_no)
    what, expect = mutate(rng, b)
    o = run_lib(b)
    _tally("fuzz", o)
    why = check_contract(o, names=[b.name, "manifest.json", "requests", "chunks", "phases"] if o.code in (1, 2)
                         else [], expect=expect)
    assert not why, f"case {case_no} ({SAMPLE_NAMES[case_no % len(SAMPLE_NAMES)]}: {what}): {why}"


def _tally(kind: str, o: Outcome) -> None:
    text = o.stdout + o.stderr
    TALLY[f"{kind}_cases"] += 1
    TALLY[f"{kind}_tracebacks"] += "Traceback" in text
    TALLY[f"{kind}_internal"] += "internal error" in text
    TALLY[f"{kind}_errors"] += o.code in (1, 2)
    TALLY[f"{kind}_warned"] += o.code not in (1, 2) and bool(o.warnings)


def test_the_tiers_together_run_every_case() -> None:
    for values, sample, salt in ((sorted(CASES), CORPUS_SAMPLE, "corpus"), (list(range(FUZZ_CASES)), FUZZ_SAMPLE, "fuzz")):
        params = tiered(values, sample, salt)
        unit = [p for p in params if not isinstance(p, type(pytest.param(0)))]
        rest = [p.values[0] for p in params if isinstance(p, type(pytest.param(0)))]
        assert len(unit) == sample and sorted(map(str, unit + rest)) == sorted(map(str, values)), salt
        assert all(m.name == "slow" for p in params if not isinstance(p, (str, int)) for m in p.marks)
    assert len(CASES) >= 100 and FUZZ_CASES >= 300


def _counts() -> str:
    lines = []
    for kind in ("corpus", "fuzz"):
        n = TALLY[f"{kind}_cases"]
        if not STARTED[kind]:
            continue  # that part was deselected
        hangs = STARTED[kind] - n  # a case that timed out never reached its tally
        lines.append(f"{kind}: {n} cases, tracebacks={TALLY[kind + '_tracebacks']}, "
                     f"internal errors={TALLY[kind + '_internal']}, hangs={hangs}; "
                     f"{TALLY[kind + '_errors']} one-line errors, {TALLY[kind + '_warned']} results with warnings")
        assert TALLY[f"{kind}_tracebacks"] == 0 and TALLY[f"{kind}_internal"] == 0 and hangs == 0
    return "\n".join(lines) + f" (sample seed {SAMPLE_SEED})"


def test_zz_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """The counts the issue asks for, over the cases this tier ran; runs last (pytest keeps definition order
    within a module)."""
    text = _counts()
    with capsys.disabled():
        print("\n" + text)


@pytest.mark.slow
def test_zz_counts_slow_tier(capsys: pytest.CaptureFixture[str]) -> None:
    """The same counts in the slow tier (the rest of the corpus and fuzz cases)."""
    test_zz_counts(capsys)
