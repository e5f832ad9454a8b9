"""The scenario suite's description file and scoring (the real-engine run itself is scenarios/suite.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.rules.spec import load_rules
from scenarios.score import HEALTHY, ScenarioResult, accuracy, confusion_markdown, report_markdown
from scenarios.spec import ScenarioError, load_scenarios

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_scenarios_cover_the_issue_and_name_real_rules() -> None:
    scns = load_scenarios()
    names = {s.name for s in scns}
    assert {"healthy", "queue_bound", "prefill_heavy", "kv_pressure", "prefix_cache_miss", "bursty",
            "host_contention", "client_bound"} <= names
    ids = {r.id for r in load_rules()}
    for s in scns:
        assert s.expect_top is None or s.expect_top in ids, s.name
        assert set(s.expect_top3) <= ids, s.name
        assert s.expect_top is None or not s.expect_top3 or s.expect_top in s.expect_top3, s.name
        assert "--concurrency" in s.attach_args or "--rate" in s.attach_args, s.name
    healthy = next(s for s in scns if s.name == "healthy")
    assert healthy.expect_top is None and healthy.hog is None and not healthy.engine_args


def test_scenarios_with_the_same_engine_flags_share_a_key() -> None:
    by = {s.name: s for s in load_scenarios()}
    assert by["healthy"].engine_key() == by["bursty"].engine_key()
    assert by["healthy"].engine_key() != by["queue_bound"].engine_key()


@pytest.mark.parametrize(("text", "msg"), [
    ("scenarios: 3", "'scenarios' list"),
    ("scenarios: [{name: a}]", "'expect' needs 'top'"),
    ("scenarios: [{name: a, expect: {top: X}, hog: {target: gpu}}]", "hog.target"),
    ("scenarios: [{name: a, expect: {top: X}, colour: red}]", "unknown key"),
    ("scenarios: [{name: a, expect: {top: X}}, {name: a, expect: {top: Y}}]", "duplicate"),
    ("scenarios: [{name: a, expect: {top: X}, attach: 5}]", "list of strings"),
    ("scenarios: [", "cannot read"),
])
def test_bad_scenario_files_are_one_line_errors(tmp_path: Path, text: str, msg: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError, match=msg) as e:
        load_scenarios(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def _f(rule: str, sev: str, score: float = 1.0) -> dict[str, object]:
    return {"rule_id": rule, "severity": sev, "score": score, "title": rule}


def test_top1_skips_info_findings_and_top3_counts() -> None:
    r = ScenarioResult("q", "SCH001", findings=[_f("VAL002", "info", 9), _f("LAT001", "warning", 3),
                                                _f("SCH001", "error", 2)])
    assert r.top1 == "LAT001" and not r.ok1 and r.ok3
    r2 = ScenarioResult("q", "SCH001", findings=[_f("SCH001", "error")])
    assert r2.ok1 and r2.ok3


def test_held_back_findings_are_not_asserted_and_are_read_from_the_json(tmp_path: Path) -> None:
    import json

    from scenarios.score import findings_from_json

    doc = {"findings": [{"rule_id": "LAT003", "severity": "warning", "score": 2, "held_back": "VAL006"},
                        {"rule_id": "VAL006", "severity": "info", "score": 1, "held_back": ""}]}
    (tmp_path / "f.json").write_text(json.dumps(doc))
    found = findings_from_json(tmp_path / "f.json")
    assert found[0]["held_back"] == "VAL006"
    assert ScenarioResult("h", None, findings=found).ok1  # the held-back warning is no diagnosis


def test_healthy_is_right_only_without_warnings() -> None:
    assert ScenarioResult("h", None, findings=[_f("CST002", "info")]).ok1
    assert ScenarioResult("h", None, findings=[]).top1 == HEALTHY
    bad = ScenarioResult("h", None, findings=[_f("VAL004", "warning")])
    assert not bad.ok1 and not bad.ok3 and bad.top1 == "VAL004"


def test_errors_count_as_wrong_and_show_in_the_table() -> None:
    rs = [ScenarioResult("q", "SCH001", error="attach exited 3: refused"),
          ScenarioResult("h", None, findings=[], repeat=1),
          ScenarioResult("q", "SCH001", findings=[_f("SCH001", "error")], repeat=2)]
    assert accuracy(rs) == (2, 2, 3)
    table = confusion_markdown(rs)
    assert "(error)" in table and "| q | SCH001 |" in table and "**1**" in table
    md = report_markdown(rs, "# t")
    assert "## Run 1: top-1 1/2" in md and "## Run 2: top-1 1/1" in md and "error: attach exited 3" in md


def test_export_writes_a_trimmed_sample_and_leaves_foreign_folders_alone(tmp_path: Path) -> None:
    import gzip
    import json

    from diagnose.io.bundle import open_bundle
    from diagnose.io.writer import BundleWriter
    from scenarios.export import MARKER, export_sample

    src = tmp_path / "b"
    w = BundleWriter(src, workload={"input_tokens": 8})
    w.stream("requests").write({"rid": "r1", "ok": True})
    w.finish()
    (src / "findings.json").write_text("{}")
    scn = next(s for s in load_scenarios() if s.name == "queue_bound")
    res = ScenarioResult("queue_bound", "SCH001", findings=[_f("SCH001", "error", 2.0)])
    dest = tmp_path / "samples" / "vllm_cpu_queue_bound_x"
    assert export_sample(src, dest, scn, res, "diagnose attach --concurrency 16", "vllm --max-num-seqs 2") == dest
    exp = json.loads((dest / "expected_findings.json").read_text())
    assert exp["top"] == "SCH001" and "SCH001" in exp["must_include"]
    assert (dest / MARKER).exists() and not (dest / "bundle" / "findings.json").exists()
    with gzip.open(dest / "bundle" / "requests.jsonl.gz") as fh:
        assert json.loads(fh.readline())["rid"] == "r1"
    assert open_bundle(dest / "bundle").records("requests")[0]["rid"] == "r1"
    readme = (dest / "README.md").read_text()
    assert "--max-num-seqs 2" in readme and "--concurrency 16" in readme
    foreign = tmp_path / "samples" / "lead_sample"
    foreign.mkdir()
    (foreign / "expected_findings.json").write_text("{}")
    assert export_sample(src, foreign, scn, res) is None
    assert (foreign / "expected_findings.json").read_text() == "{}"


def test_healthy_export_forbids_warnings() -> None:
    from scenarios.export import expected_findings

    scn = next(s for s in load_scenarios() if s.name == "healthy")
    exp = expected_findings(scn, ScenarioResult("healthy", None))
    assert exp == {"top": None, "must_not_include_severity_at_least": "warning", "warning_and_above": []}


def test_pyspy_false_drops_host_stacks_and_otlp_gets_its_own_engine(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("defaults: {attach: [--pyspy, --no-nvml]}\n"
                 "scenarios:\n"
                 "  - {name: a, expect: {top: null}, attach: [--concurrency, '2']}\n"
                 "  - {name: b, expect: {top: null}, attach: [--concurrency, '2'], pyspy: false}\n"
                 "  - {name: c, expect: {top: null}, attach: [--concurrency, '2'], otlp: true}\n"
                 "  - {name: d, expect: {top: HST005}, hog: {target: engine_core, procs: 2}}\n"
                 "  - {name: e, expect: {top: null}, hog: {target: any, procs: 1, nice_offset: 10}}\n")
    a, b, c, d, e = load_scenarios(p)
    assert "--pyspy" in a.attach_args and "--pyspy" not in b.attach_args and "--no-nvml" in b.attach_args
    assert not a.otlp and c.otlp
    assert a.engine_key() == b.engine_key() != c.engine_key()  # spans need an engine started to export them
    assert d.hog is not None and d.hog.target == "engine_core" and e.hog is not None and e.hog.nice_offset == 10
    p.write_text("scenarios: [{name: a, expect: {top: null}, otlp: 'yes'}]")
    with pytest.raises(ScenarioError, match="otlp must be true or false"):
        load_scenarios(p)


def test_the_split_generator_draws_sixteen_families_with_probes_varied(tmp_path: Path) -> None:
    from scenarios.heldout import variants

    tune = variants(7)
    names = [v["name"] for v in tune]
    assert len(names) == len(set(names)) == 16
    assert sum(bool(v.get("otlp")) for v in tune) == 3 and sum(v.get("pyspy") is False for v in tune) == 4
    prefill = [v for v in tune if v["name"].startswith("prefill_heavy")]
    assert len(prefill) == 2 and sorted("--slo" in v["attach"] for v in prefill) == [False, True]  # both ways
    assert {"api_server", "engine_core", "worker", "client", "any"} == {v["hog"]["target"] for v in tune if "hog" in v}
    assert variants(7) == tune  # a seed is a fixed draw
    held = variants(99, frozenset(names))
    assert not {v["name"] for v in held} & set(names)
    p = tmp_path / "h.yaml"
    import yaml

    from scenarios.heldout import DEFAULTS
    p.write_text(yaml.safe_dump({"defaults": DEFAULTS["vllm"], "scenarios": held}))
    assert len(load_scenarios(p)) == 16  # every draw is a valid scenario file


def test_the_llama_split_draws_its_families_on_llama_server(tmp_path: Path) -> None:
    import yaml

    from scenarios.heldout import DEFAULTS, variants

    tune = variants(7, engine="llamacpp")
    names = [v["name"] for v in tune]
    assert len(names) == len(set(names)) == 8 and all(n.startswith("llama_") for n in names)
    assert sum("--pyspy" in v["attach"] for v in tune) == 2 and sum("1s" in v["attach"] for v in tune) == 2
    assert {v["expect"]["top"] for v in tune} == {None, "SCH001", "SCH010", "HST005", "HST006", "VAL001"}
    held = variants(99, frozenset(names), engine="llamacpp")
    assert not {v["name"] for v in held} & set(names)
    p = tmp_path / "h.yaml"
    p.write_text(yaml.safe_dump({"defaults": DEFAULTS["llamacpp"], "scenarios": held}))
    loaded = load_scenarios(p)
    assert len(loaded) == 8 and {s.engine_kind for s in loaded} == {"llamacpp"}
    ctx = next(s for s in loaded if s.name.startswith("llama_ctx_too_small"))
    slot = int(ctx.engine_args[ctx.engine_args.index("-c") + 1]) // int(ctx.engine_args[ctx.engine_args.index("-np") + 1])
    def last(flag: str) -> int:
        return int(ctx.attach_args[max(i for i, a in enumerate(ctx.attach_args) if a == flag) + 1])

    total = int(ctx.engine_args[ctx.engine_args.index("-c") + 1])
    assert slot % 256 == 0 and total == slot * int(ctx.engine_args[ctx.engine_args.index("-np") + 1])  # as it runs
    assert last("--input-tokens") < slot < last("--input-tokens") + last("--output-tokens")  # prompt fits, output not


@pytest.mark.parametrize(("engine", "tuning", "families"), [("llamacpp", "user_families_llamacpp.yaml", 8),
                                                             ("vllm", "user_families.yaml", 4)])
def test_the_user_report_families_cite_threads_and_draw_held_back_variants(
        tmp_path: Path, engine: str, tuning: str, families: int) -> None:
    """Issue 34's families from user reports: every tuning scenario cites a public thread and names real rules;
    a held-back draw gives one variant of each family, none repeating a tuning scenario, that loads as a
    scenario file of the same engine."""
    import yaml

    from scenarios.heldout import DEFAULTS, variants

    path = ROOT / "scenarios" / tuning
    raw = yaml.safe_load(path.read_text())["scenarios"]
    assert len(raw) == families and all(str(s.get("thread", "")).startswith("https://github.com/") for s in raw)
    ids = {r.id for r in load_rules()}
    tune = load_scenarios(path)
    for s in tune:
        assert s.expect_top in ids and set(s.expect_top3) <= ids and s.expect_top in s.expect_top3, s.name
    names = frozenset(s.name for s in tune)
    held = variants(20261234, names, engine=engine, families="user")
    assert len(held) == families and not {v["name"] for v in held} & names
    # one variant of each tuning family (a held-back name extends its family's tuning name)
    assert sorted(next(n for n in names if v["name"].startswith(n)) for v in held) == sorted(names)
    assert variants(20261234, names, engine=engine, families="user") == held  # the seed alone decides
    p = tmp_path / "h.yaml"
    p.write_text(yaml.safe_dump({"defaults": DEFAULTS[engine], "scenarios": held}))
    loaded = load_scenarios(p)
    assert all(s.expect_top in ids and s.expect_top in s.expect_top3 for s in loaded)
    assert {s.engine_kind for s in loaded} == {"llamacpp" if engine == "llamacpp" else "vllm"}


def test_a_llama_scenario_cannot_ask_for_spans(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("defaults: {engine: {kind: llamacpp}}\nscenarios:\n  - {name: x, otlp: true, expect: {top: null}}\n")
    with pytest.raises(ScenarioError, match="llama.cpp exports no OpenTelemetry"):
        load_scenarios(p)
    p.write_text("scenarios:\n  - {name: x, engine: {kind: sglang}, expect: {top: null}}\n")
    with pytest.raises(ScenarioError, match="engine.kind must be one of vllm, llamacpp"):
        load_scenarios(p)


def test_a_run_is_one_line_in_the_committed_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32 item 8: a suite run appends one line to results/runs.md; its full table and JSON go to the
    uncommitted runs/ folder instead of one committed file per run."""
    from scenarios import suite

    monkeypatch.setattr(suite, "RESULTS_DIR", tmp_path)
    (tmp_path / "runs.md").write_text("| run | what | command | misses |\n")
    ok = ScenarioResult("queue_bound", "SCH001", findings=[{"rule_id": "SCH001", "severity": "error", "score": 2.0}])
    miss = ScenarioResult("healthy", None, findings=[{"rule_id": "LAT001", "severity": "warning", "score": 1.0}])
    header = "# Scenario suite\n\n2 scenarios x 1 run(s), 4.0 min. Top-1 1/2, top-3 1/2.\n\nCommand: `python -m x | y`"
    suite.log_run("20261206T000000Z", header, [ok, miss])
    lines = (tmp_path / "runs.md").read_text().splitlines()
    assert len(lines) == 2
    assert lines[1] == ("| 20261206T000000Z | 2 scenarios x 1 run(s), 4.0 min. Top-1 1/2, top-3 1/2. | "
                        "`python -m x / y` | healthy → LAT001 |")
    assert suite.RUNS_DIR.name == "runs" and "/scenarios/runs/" in (ROOT / ".gitignore").read_text()
    assert not list((ROOT / "scenarios" / "results").glob("2026*")), "per-run files are committed again"
