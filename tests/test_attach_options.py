"""`diagnose attach` assembles its options from the probes' specs: the same options as before, one help section
per probe, probes built from the options in registry order, and a probe registered from outside joins attach
(its option parsed, the probe run) without any change to attach.py."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from diagnose.cli.attach import attach
from diagnose.cli.attach_capture import _run_loop, build_probes
from diagnose.cli.main import cli
from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.model import ProbeStatus
from diagnose.probes import PROBE_MODULES, probe_specs, register, unregister
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec, Target
from tests.servers.truth import truth_server

# every option `diagnose attach` had when its options were one 40-option function (spellings and aliases)
EXPECTED = {
    "--url", "-o", "--output", "--force", "--api-key-env", "--model", "--api", "--concurrency", "-c", "--rate", "-r",
    "--arrival", "--burstiness", "--max-concurrency", "--duration", "-d", "--num-requests", "-n", "--warmup",
    "--baseline", "--input-tokens", "--output-tokens", "--ignore-eos", "--no-ignore-eos", "--shared-prefix",
    "--seed", "--timeout", "--slo", "--metrics-interval", "--no-metrics", "--otlp", "--otlp-grpc-port",
    "--otlp-http-port", "--otlp-export", "--pyspy", "--pid", "--pyspy-rate", "--pyspy-blocking", "--nvml",
    "--no-nvml", "--nvml-interval", "--profile-iterations", "--profiler-dir", "--profile-client", "--observe",
    "--store-text", "--progress", "--no-progress", "--realtime", "--report", "-h", "--help",
}
EXPECTED |= {"--prometheus", "--selector", "--since"}  # the fleet capture's own (docs/fleet.md)
EXPECTED |= {"--workload", "--speed", "--loop"}  # replay a workload file (docs/workload.md)
EXPECTED |= {"--session-wait", "--no-session-wait"}  # a replayed session's turn waits for the previous answer
EXPECTED |= {"--host", "--no-host"}  # the /proc counters without py-spy (probes/host_cpu.py)
EXPECTED |= {"--repeat", "--find-max-goodput", "--search-steps", "--launch", "--verify"}  # docs/compare.md
EXPECTED |= {"--overhead-budget"}  # what the probes may cost the server (docs/probe-cost.md)
EXPECTED |= {"--cost-per-hour"}  # the deployment's price, recorded: the report and compare price the run (docs/workload.md)
EXPECTED |= {"--turns", "--think-time", "--retries"}  # tasks: conversations and agent chains (probes/sessions.py)
EXPECTED |= {"--slots", "--no-slots"}  # llama.cpp's /slots (probes/slots.py)
EXPECTED |= {"--config", "--print-config"}  # a YAML file of attach options, and writing one (docs/workload.md)
EXPECTED |= {"--dataset", "--dataset-format"}  # prompts from a local file: ShareGPT or prompts JSONL (docs/workload.md)
EXPECTED |= {"--greedy", "--temperature", "--sampling-seed"}  # the quality guard's sampling (docs/compare.md)
EXPECTED |= {"--logprobs"}  # log-probabilities asked with every token (rule SCH014, docs/workload.md)


@pytest.fixture(autouse=True)
def loop_policy() -> Iterator[None]:
    """attach runs its own uvloop loop and leaves the process's event loop policy as it was (it once installed
    uvloop's, and later tests in the worker ran their loops under uvloop)."""
    old = asyncio.get_event_loop_policy()
    yield
    assert asyncio.get_event_loop_policy() is old


def test_attach_runs_a_uvloop_loop_of_its_own() -> None:
    """The capture's loop is uvloop's (the probes' timing assumes it); the autouse fixture checks the policy."""
    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert _run_loop(kind()).startswith("uvloop")
    assert asyncio.run(kind()).startswith("asyncio")  # the process's own loops are asyncio's still


def _names(cmd: click.Command) -> set[str]:
    ctx = click.Context(cmd, info_name="attach", help_option_names=["-h", "--help"])
    return {n for p in cmd.get_params(ctx) for n in (*p.opts, *p.secondary_opts)}


def _opts(*args: str) -> dict[str, Any]:
    return dict(attach.make_context("attach", ["--url", "http://127.0.0.1:9", *args]).params)


def _help() -> str:
    res = CliRunner().invoke(cli, ["attach", "--help"])
    assert res.exit_code == 0, res.output
    return res.output


def test_attach_has_exactly_the_options_it_had() -> None:
    assert _names(attach) == EXPECTED


def test_defaults_and_types_are_kept() -> None:
    o = _opts()
    assert (o["api"], o["arrival"], o["burstiness"], o["warmup"], o["baseline"]) == ("completions", "poisson", 1.0, 2, 8)
    # the lengths are text since they may be distributions (issue 36): a plain integer is that one length
    assert (o["input_tokens"], o["output_tokens"], o["ignore_eos"], o["shared_prefix"], o["seed"]) == ("128", "64",
                                                                                                      True, 0.0, 0)
    assert (o["timeout"], o["metrics_interval"], o["nvml"], o["nvml_interval"]) == ("60s", "1s", True, "100ms")
    assert (o["otlp_grpc_port"], o["otlp_http_port"], o["pyspy_rate"]) == (4317, 4318, 10)
    assert o["progress"] is None  # tri-state: on a terminal only
    assert o["pyspy"] is False and o["otlp"] is False and o["no_metrics"] is False and o["max_concurrency"] is None
    assert isinstance(_opts("--profiler-dir", "prof")["profiler_dir"], Path)
    with pytest.raises(click.BadParameter):
        _opts("--arrival", "bursty")


def test_help_has_one_section_per_probe_in_registry_order() -> None:
    text = _help()
    titles = [spec.title for spec in probe_specs()]
    where = [text.index(f"\n{t}:\n") for t in titles]
    assert text.index("\nOptions:\n") < where[0] and where == sorted(where)
    for spec, start in zip(probe_specs(), where, strict=True):
        section = text[start:text.find("\n\n", start + 1)]
        for opt in spec.options:
            assert f"  {opt.name.split('/')[0]}" in section or f", {opt.name}" in section, (spec.name, opt.name)
    own = text[text.index("\nOptions:\n"):where[0]]
    assert "--url" in own and "--realtime" in own and "--concurrency" not in own


def test_every_builtin_probe_declares_a_spec() -> None:
    specs = probe_specs()
    assert [s.name for s in specs[:len(PROBE_MODULES)]] == ["load", "prometheus", "slots", "otel", "pyspy", "host",
                                                            "nvml", "profiler", "pyinstrument", "otel_export"]
    assert all(s.title and s.options for s in specs)


def test_help_and_version_load_no_probe_module() -> None:
    """The probes' options are assembled when attach needs them: `diagnose --help` imports no probe module."""
    code = ("import sys; from click.testing import CliRunner; from diagnose.cli.main import cli; "
            "r = [CliRunner().invoke(cli, a) for a in (['--help'], ['--version'])]; "
            "assert all(x.exit_code == 0 for x in r); "
            "print(sorted(m for m in sys.modules if m.startswith('diagnose.probes.')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["['diagnose.probes.base']"]


def _built(*args: str) -> list[Any]:
    o = _opts(*args)
    return build_probes(o, ProbeSetup(target=Target(url="http://127.0.0.1:9")))


def test_probes_built_from_the_options() -> None:
    assert [p.name for p in _built()] == ["load", "prometheus", "slots", "host", "nvml"]
    assert [p.name for p in _built("--no-host")] == ["load", "prometheus", "slots", "nvml"]
    assert [p.name for p in _built("--no-slots")] == ["load", "prometheus", "host", "nvml"]
    host = {p.name: p for p in _built("--pid", "42")}["host"]
    assert host.pid == 42 and not host.stacks  # type: ignore[attr-defined]  # the counters, never py-spy
    probes = _built("--observe", "--no-nvml", "--metrics-interval", "250ms", "--otlp", "--otlp-grpc-port", "0",
                    "--pyspy", "--pid", "42", "--pyspy-rate", "20", "--pyspy-blocking", "--profile-client",
                    "--profile-iterations", "3", "--profiler-dir", "prof", "--otlp-export", "grpc://collector:4317")
    by = {p.name: p for p in probes}
    assert list(by) == ["prometheus", "slots", "otel", "pyspy", "profiler", "pyinstrument", "otel_export"]
    assert by["prometheus"].interval_s == by["slots"].interval_s == 0.25
    assert (by["otel"].grpc_port, by["otel"].http_port) == (0, 4318)
    assert (by["pyspy"].pid, by["pyspy"].rate_hz, by["pyspy"].nonblocking) == (42, 20.0, False)
    assert (by["profiler"].iterations, by["profiler"].profiler_dir) == (3, Path("prof"))
    assert (by["otel_export"].protocol, by["otel_export"].endpoint) == ("grpc", "http://collector:4317")
    nvml = {p.name: p for p in _built("--nvml-interval", "50ms")}["nvml"]
    assert nvml.rate_hz == pytest.approx(20.0)


@pytest.mark.parametrize(("args", "message"), [
    (("--profile-iterations", "3"), "--profile-iterations needs --profiler-dir"),
    (("--profile-iterations", "-1", "--profiler-dir", "p"), "--profile-iterations -1: must be at least 1"),
    (("--otlp-export", "collector"), "--otlp-export 'collector' is not a URL"),
    (("--metrics-interval", "soon"), "bad duration 'soon'"),
    (("--nvml-interval", "x"), "bad duration 'x'"),
])
def test_bad_probe_options_are_input_errors(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(InputError, match=message):
        _built(*args)


def test_bad_probe_option_fails_before_connecting(tmp_path: Path) -> None:
    """Nothing listens on port 9: the option's error comes first, in one line, and no bundle is started."""
    res = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--otlp-export", "collector",
                                   "-o", str(tmp_path / "b")])
    assert res.exit_code == 2
    assert res.output.strip().splitlines()[-1].startswith("diagnose: error: --otlp-export 'collector' is not a URL")
    assert "Traceback" not in res.output and not (tmp_path / "b").exists()
    res = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--observe", "-c", "4"])
    assert res.exit_code == 2 and "--observe sends no requests" in res.output


# -- a probe from outside the package --------------------------------------------------------------------
class NoteProbe:
    """Writes its note into a stream of its own and reports it in its status."""

    name = "note"

    def __init__(self, note: str, repeat: int) -> None:
        self.note, self.repeat = note, repeat

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        return True, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        w = ctx.bundle.stream("notes")
        for i in range(self.repeat):
            w.write({"i": i, "note": self.note, "model": ctx.target.model})
        await ctx.stop.wait()
        return ProbeStatus(self.name, "ok", f"{self.repeat} notes: {self.note}")


NOTE = ProbeSpec(
    name="note", title="Notes (a test probe)",
    options=(ProbeOption("--note", help="Write this note into the bundle."),
             ProbeOption("--note-repeat", type=int, default=2, show_default=True, help="Times to write it.")),
    enabled=lambda o: o["note"] is not None,
    build=lambda o, setup: NoteProbe(o["note"], o["note_repeat"]),
    record=lambda o: {"note": o["note"]},
)


@pytest.fixture
def note_probe() -> Iterator[None]:
    register(NOTE)
    yield
    unregister("note")


def test_a_registered_probe_joins_attach(tmp_path: Path, note_probe: None) -> None:
    assert _names(attach) == EXPECTED | {"--note", "--note-repeat"}
    text = _help()
    assert "Notes (a test probe):" in text and "Write this note into the bundle." in text
    assert text.index("Client spans (OTLP export):") < text.index("Notes (a test probe):")
    with truth_server() as (url, _proc):
        res = CliRunner().invoke(cli, ["attach", "--url", url, "-n", "3", "--baseline", "0", "--warmup", "0",
                                       "--output-tokens", "4", "--no-nvml", "--no-metrics", "--note", "hello",
                                       "--note-repeat", "3", "-o", str(tmp_path / "b")], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        res_off = CliRunner().invoke(cli, ["attach", "--url", url, "-n", "2", "--baseline", "0", "--warmup", "0",
                                           "--output-tokens", "4", "--no-nvml", "--no-metrics",
                                           "-o", str(tmp_path / "off")], catch_exceptions=False)
        assert res_off.exit_code == 0, res_off.output
    b = open_bundle(tmp_path / "b")
    st = {s.name: s for s in b.probe_statuses()}
    assert st["note"].state == "ok" and st["note"].reason == "3 notes: hello"
    assert [r["note"] for r in b.records("notes")] == ["hello"] * 3
    assert b.records("notes")[0]["model"]  # the probe ran against the detected target
    assert b.manifest["options"]["note"] == "hello"
    assert st["load"].state == "ok"
    off = open_bundle(tmp_path / "off")
    assert "note" not in {s.name for s in off.probe_statuses()} and off.manifest["options"]["note"] is None


def test_unregistered_probe_leaves_attach(note_probe: None) -> None:
    assert "--note" in _names(attach)
    unregister("note")
    assert _names(attach) == EXPECTED
    res = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--note", "x"])
    assert res.exit_code == 2 and re.search(r"No such option\W+--note", res.output), res.output


def test_a_probe_may_not_take_another_ones_option_or_name() -> None:
    def dummy(o: Options, setup: ProbeSetup) -> NoteProbe:
        return NoteProbe("", 0)

    clash = ProbeSpec(name="clash", title="Clash", options=(ProbeOption("--pyspy-rate", type=int),),
                      enabled=lambda o: False, build=dummy)
    register(clash)
    try:
        with pytest.raises(ValueError, match="probe 'clash': option --pyspy-rate is already probe 'pyspy''s"):
            _names(attach)
    finally:
        unregister("clash")
    assert _names(attach) == EXPECTED
    own = ProbeSpec(name="own", title="Own", options=(ProbeOption("--url"),), enabled=lambda o: False, build=dummy)
    register(own)
    try:
        with pytest.raises(ValueError, match="probe 'own': option --url is already attach's"):
            _names(attach)
    finally:
        unregister("own")
    with pytest.raises(ValueError, match="a probe named 'load' is already registered"):
        register(ProbeSpec(name="load", title="Load again", enabled=lambda o: False, build=dummy))


def test_every_command_answers_h_on_its_own() -> None:
    """-h is each command's own setting, not only the group's: click caches a command's help option from the
    first context it sees, so attach answered -h or not depending on which test invoked it first."""
    from diagnose.cli.main import COMMANDS, cli

    for name in COMMANDS:
        cmd = cli.get_command(click.Context(cli), name)
        assert cmd is not None
        res = CliRunner().invoke(cmd, ["-h"])
        assert res.exit_code == 0 and "Usage:" in res.output, (name, res.output)
