#!/usr/bin/env python3
"""Make a small copy of a capture bundle for sample_traces/ or a ticket: gzip every stream, drop
artifacts above a size limit (noted in the manifest), keep everything analysis needs.

    python tools/trim_bundle.py SRC DST [--max-artifact-mb 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path


def trim(src: Path, dst: Path, max_artifact_mb: float) -> None:
    if not (src / "manifest.json").exists():
        sys.exit(f"trim_bundle: {src} is not a capture bundle (no manifest.json)")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    manifest = json.loads((src / "manifest.json").read_text())
    for f in sorted(src.glob("*.jsonl")):
        with open(f, "rb") as fi, open(dst / (f.name + ".gz"), "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as fo:
            shutil.copyfileobj(fi, fo)
        name = f.name[: -len(".jsonl")]
        if name in manifest.get("streams", {}):
            manifest["streams"][name]["file"] = f.name + ".gz"
    for f in sorted(src.glob("*.jsonl.gz")):
        shutil.copy2(f, dst / f.name)
    (dst / "artifacts").mkdir()
    for name, art in list((manifest.get("artifacts") or {}).items()):
        p = src / art.get("file", f"artifacts/{name}")
        if p.exists() and p.stat().st_size <= max_artifact_mb * 1e6:
            (dst / art["file"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst / art["file"])
        else:
            art["trimmed"] = f"dropped from this copy (over {max_artifact_mb} MB)"
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    print(f"{dst}: {total / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--max-artifact-mb", type=float, default=2.0)
    a = ap.parse_args()
    trim(a.src, a.dst, a.max_artifact_mb)


if __name__ == "__main__":
    main()
