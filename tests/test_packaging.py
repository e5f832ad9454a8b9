"""The wheel holds every sub-package and the package data, so a new sub-package cannot silently drop out.

Builds the wheel from a copy of the sources with setuptools' PEP 517 backend (what `pip wheel` runs, no
network: setuptools is the one in this environment) and compares it with the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# directory -> import name, as in pyproject.toml's package-dir
ROOTS = {"diagnose": "diagnose", "probes": "diagnose.probes", "rules": "diagnose.rules", "reports": "diagnose.reports"}


def _source_packages() -> set[str]:
    out: set[str] = set()
    for where, name in ROOTS.items():
        for init in (ROOT / where).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / where)
            if "__pycache__" in rel.parts:
                continue
            out.add(".".join([name, *rel.parts]) if rel.parts else name)
    return out


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    src = tmp_path_factory.mktemp("src")
    for f in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    for d in ROOTS:
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = out / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_source_tree_has_the_known_packages() -> None:
    pkgs = _source_packages()
    assert {"diagnose", "diagnose.cli", "diagnose.normalize", "diagnose.trace", "diagnose.probes",
            "diagnose.rules", "diagnose.reports"} <= pkgs, pkgs


def test_every_package_is_in_the_wheel(wheel_names: set[str]) -> None:
    in_wheel = {n.removesuffix("/__init__.py").replace("/", ".") for n in wheel_names if n.endswith("/__init__.py")}
    missing = _source_packages() - in_wheel
    assert not missing, f"sub-packages missing from the wheel: {sorted(missing)}"
    # and every module of each package, not only its __init__
    for where, name in ROOTS.items():
        for py in (ROOT / where).rglob("*.py"):
            if "__pycache__" in py.parts or not (py.parent / "__init__.py").exists():
                continue
            rel = py.relative_to(ROOT / where).as_posix()
            arc = f"{name.replace('.', '/')}/{rel}"
            assert arc in wheel_names, f"{where}/{rel} is not in the wheel as {arc}"


def test_package_data_is_in_the_wheel(wheel_names: set[str]) -> None:
    expected = ["diagnose/py.typed", "diagnose/rules/thresholds.yaml"]
    expected += [f"diagnose/rules/{p.relative_to(ROOT / 'rules').as_posix()}"
                 for p in (ROOT / "rules" / "catalog").glob("*/*.yaml")]
    expected += [f"diagnose/reports/{p.relative_to(ROOT / 'reports').as_posix()}"
                 for pat in ("templates/*.html", "assets/*") for p in (ROOT / "reports").glob(pat) if p.is_file()]
    assert len(expected) > 10, expected  # the catalogue, templates and assets were found at all
    missing = [e for e in expected if e not in wheel_names]
    assert not missing, f"package data missing from the wheel: {missing}"
