"""Scenario descriptions (scenarios/scenarios.yaml) -> typed :class:`Scenario` objects.

A bad file is a one-line :class:`ScenarioError` saying what and where; the suite never starts an engine
for a scenario it cannot describe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diagnose.errors import InputError

SCENARIOS_FILE = Path(__file__).resolve().parent / "scenarios.yaml"
HOG_TARGETS = ("worker", "client", "client_near", "api_server", "engine_core", "any")
ENGINE_KINDS = ("vllm", "llamacpp")  # harness.engine.VllmServer, harness.llama_server.LlamaServer


class ScenarioError(InputError):
    """scenarios.yaml is malformed (the message names the scenario and the key)."""


@dataclass(frozen=True)
class Hog:
    # "worker": pinned to the engine worker's core; "client": to the load client's core, the client 10 nice
    # steps below the suite (starved); "client_near": the same with the client at the hogs' priority; "api_server" /
    # "engine_core": the engine's API-server / EngineCore process is pinned (all threads) to the core the
    # worker is not bound to, and the hogs with it; "any": not pinned (a busy machine)
    target: str
    procs: int = 1
    nice_offset: int = 0  # the hogs' session priority relative to the suite's (negative: stronger)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    engine_args: tuple[str, ...]
    engine_env: dict[str, str]
    kv_cache_space_gib: int
    attach_args: tuple[str, ...]
    expect_top: str | None
    expect_top3: tuple[str, ...]
    hog: Hog | None = None
    timeout_s: float = 150.0
    otlp: bool = False  # the engine exports OpenTelemetry spans; attach receives them (--otlp)
    engine_kind: str = "vllm"  # which real engine serves it (ENGINE_KINDS)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def engine_key(self) -> tuple[Any, ...]:
        """Scenarios with the same key can share one engine start."""
        return (self.engine_kind, self.engine_args, tuple(sorted(self.engine_env.items())), self.kv_cache_space_gib,
                self.otlp)


def _strs(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, (str, int, float)) for x in v):
        raise ScenarioError(f"{where}: expected a list of strings")
    return tuple(str(x) for x in v)


def _parse(raw: Any, defaults: dict[str, Any], path: Path) -> Scenario:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ScenarioError(f"{path}: every scenario needs a 'name'")
    name = raw["name"]
    where = f"{path}: scenario {name!r}"
    known = {"name", "description", "engine", "attach", "hog", "expect", "timeout_s", "otlp", "pyspy",
             "thread"}  # thread: the public report a family comes from (scenarios/user_families*.yaml)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}")
    d_eng = defaults.get("engine") or {}
    eng = raw.get("engine") or {}
    if not isinstance(eng, dict):
        raise ScenarioError(f"{where}: 'engine' must be a mapping")
    env = {**(d_eng.get("env") or {}), **(eng.get("env") or {})}
    kind = eng.get("kind", d_eng.get("kind", "vllm"))
    if kind not in ENGINE_KINDS:
        raise ScenarioError(f"{where}: engine.kind must be one of {', '.join(ENGINE_KINDS)}")
    expect = raw.get("expect")
    if not isinstance(expect, dict) or "top" not in expect:
        raise ScenarioError(f"{where}: 'expect' needs 'top' (a rule id, or null for a healthy run)")
    top = expect["top"]
    if top is not None and not isinstance(top, str):
        raise ScenarioError(f"{where}: expect.top must be a rule id or null")
    hog = None
    if raw.get("hog") is not None:
        h = raw["hog"]
        if not isinstance(h, dict) or h.get("target") not in HOG_TARGETS:
            raise ScenarioError(f"{where}: hog.target must be one of {', '.join(HOG_TARGETS)}")
        procs = h.get("procs", 1)
        if not isinstance(procs, int) or procs < 1:
            raise ScenarioError(f"{where}: hog.procs must be a positive integer")
        offset = h.get("nice_offset", 0)
        if not isinstance(offset, int) or not -10 <= offset <= 10:
            raise ScenarioError(f"{where}: hog.nice_offset must be an integer in -10..10")
        hog = Hog(str(h["target"]), procs, offset)
    for key in ("otlp", "pyspy"):
        if not isinstance(raw.get(key, False), bool):
            raise ScenarioError(f"{where}: {key} must be true or false")
    if kind == "llamacpp" and raw.get("otlp"):
        raise ScenarioError(f"{where}: llama.cpp exports no OpenTelemetry spans (otlp: true)")
    attach = _strs(defaults.get("attach"), f"{path}: defaults.attach") + _strs(raw.get("attach"), f"{where}: attach")
    if raw.get("pyspy") is False:  # the variant without host stacks: --pyspy dropped from the defaults
        attach = tuple(a for a in attach if a != "--pyspy")
    try:
        kv = int(eng.get("kv_cache_space_gib", d_eng.get("kv_cache_space_gib", 2)))
        timeout = float(raw.get("timeout_s", defaults.get("timeout_s", 150)))
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{where}: {e}") from e
    return Scenario(
        name=name,
        description=str(raw.get("description", "")),
        engine_args=_strs(d_eng.get("args"), f"{path}: defaults.engine.args") + _strs(eng.get("args"), f"{where}: engine.args"),
        engine_env={str(k): str(v) for k, v in env.items()},
        kv_cache_space_gib=kv,
        attach_args=attach,
        expect_top=top,
        expect_top3=_strs(expect.get("top3"), f"{where}: expect.top3"),
        hog=hog,
        timeout_s=timeout,
        otlp=bool(raw.get("otlp", False)),
        engine_kind=str(kind),
        raw=raw,
    )


def load_scenarios(path: Path = SCENARIOS_FILE) -> list[Scenario]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{path}: cannot read scenarios ({str(e).splitlines()[0]})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise ScenarioError(f"{path}: expected a mapping with a 'scenarios' list")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ScenarioError(f"{path}: 'defaults' must be a mapping")
    out = [_parse(r, defaults, path) for r in doc["scenarios"]]
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ScenarioError(f"{path}: duplicate scenario name(s) {', '.join(dup)}")
    return out
