"""`diagnose export BUNDLE --format speedscope`: the py-spy host stacks as a speedscope file.

The file follows speedscope's file format (https://www.speedscope.app/file-format-schema.json): one
``sampled`` profile per process and thread (named ``<role> pid N · <thread name> (tid T)``), frames shared
by all profiles (``name`` = the function, ``file`` = its file, as py-spy reports them), one sample per
distinct stack of a py-spy window, weighted by how many times py-spy saw it: in seconds of on-CPU time
(samples / the probe's rate) when the rate is recorded, else in samples (unit ``none``). py-spy's raw
output aggregates each window (30 s by default), so the samples are in window order and, within a window,
in stack order: speedscope's "left heavy" and "sandwich" views are exact, its time-order view is not a
timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import orjson
import pandas as pd

from diagnose import __version__
from diagnose.errors import DiagnoseError
from diagnose.export import Written
from diagnose.export.files import write_bytes
from diagnose.io import schemas
from diagnose.io.bundle import Bundle

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


class Frame(TypedDict):
    name: str
    file: NotRequired[str]


class Profile(TypedDict):
    """A speedscope "sampled" profile: one thread's stacks (indices into the shared frames) and their weights."""

    type: str
    name: str
    unit: str
    startValue: int
    endValue: float
    samples: list[list[int]]
    weights: list[float]


class Shared(TypedDict):
    frames: list[Frame]


# the speedscope file (its format, plus schema_version and exporter); "$schema" is no identifier: functional form
SpeedscopeDoc = TypedDict("SpeedscopeDoc", {"schema_version": int, "$schema": str, "shared": Shared,
                                            "profiles": list[Profile], "name": str, "activeProfileIndex": int,
                                            "exporter": str})


@dataclass
class SpeedscopeExport:
    doc: SpeedscopeDoc
    profiles: int
    frames: int
    samples: int


def parse_frame(frame: str) -> Frame:
    """``"func (file)"`` (py-spy's raw format without line numbers) -> speedscope frame {name, file}."""
    if frame.endswith(")") and " (" in frame:
        i = frame.find(" (")  # as host_stacks.func_of: a function name has no " (", a path may
        return {"name": frame[:i], "file": frame[i + 2:-1]}
    return {"name": frame}


def _label(src: Path) -> str:
    return src.parent.name if src.name == "bundle" else src.name  # a sample folder's bundle: the sample's name


def build(bundle: Bundle) -> SpeedscopeExport:
    from diagnose.normalize import host

    t = host.tables(bundle)
    st = t.get("host_stacks")
    if st is None or st.empty:
        raise DiagnoseError(f"{bundle.source}: no py-spy stacks to export (capture with attach --pyspy)")
    rate = bundle.meta.probe_detail("pyspy").get("rate_hz")
    rate = float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0 else None
    procs = t.get("host_processes", pd.DataFrame(columns=["pid", "role"]))
    roles = {int(p): str(r) for p, r in zip(procs["pid"], procs["role"], strict=True)}
    frames: list[Frame] = []
    index: dict[str, int] = {}
    profiles: list[Profile] = []
    n_samples = 0
    for (pid, tid), g in st.groupby(["pid", "tid"], sort=True):
        g = g.sort_values(["t0_s", "stack"], kind="stable")
        samples: list[list[int]] = []
        weights: list[float] = []
        for stack, count in zip(g["stack"], g["samples"], strict=True):
            if int(count) <= 0:
                continue
            ids = []
            for f in (stack.split(";") if stack else ["(no Python frames)"]):
                i = index.get(f)
                if i is None:
                    i = index[f] = len(frames)
                    frames.append(parse_frame(f))
                ids.append(i)
            samples.append(ids)
            weights.append(int(count) / rate if rate else int(count))
        if not samples:
            continue
        n_samples += int(g["samples"].sum())
        thread = str(g["thread"].iloc[0] or "thread")
        profiles.append({"type": "sampled", "name": f"{roles.get(int(pid), 'other')} pid {int(pid)} · {thread} "
                                                    f"(tid {int(tid)})",
                         "unit": "seconds" if rate else "none", "startValue": 0, "endValue": sum(weights),
                         "samples": samples, "weights": weights})
    active = max(range(len(profiles)), key=lambda i: profiles[i]["endValue"]) if profiles else 0
    doc: SpeedscopeDoc = {"schema_version": schemas.SPEEDSCOPE, "$schema": SCHEMA_URL, "shared": {"frames": frames}, "profiles": profiles,
           "name": f"{_label(Path(str(bundle.source)))}: py-spy host stacks", "activeProfileIndex": active,
           "exporter": f"diagnose {__version__}"}
    return SpeedscopeExport(doc=doc, profiles=len(profiles), frames=len(frames), samples=n_samples)


def export(bundle: Bundle, out: Path) -> SpeedscopeExport:
    res = build(bundle)
    write_bytes(out, orjson.dumps(res.doc))
    return res


def run(bundle: Bundle, out: Path, *, include_text: bool = False) -> Written:
    """The registry's entry point (diagnose/export/__init__.py); ``include_text``: stacks hold no request text."""
    res = export(bundle, out)
    return Written(f"{res.profiles} profiles, {res.frames} frames, {res.samples} samples")
