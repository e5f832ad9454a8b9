"""The package's import structure: no import cycles among the product modules, and the normalisers (diagnose/
normalize/, diagnose/trace/) make tables and signals only: nothing of the report is built there.

The import graph is read from the source (ast), the way /work/shared/hooks/import_cycles.py reads it:
diagnose/, probes/, rules/, reports/ as diagnose.*; lazy imports inside functions count; imports under
``if TYPE_CHECKING:`` and package ``__init__`` modules do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"diagnose": "diagnose", "probes": "diagnose.probes", "rules": "diagnose.rules",
            "reports": "diagnose.reports"}
REPORT_ONLY = ("diagnose/normalize", "diagnose/trace")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every product module except package __init__ files."""
    out: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for p in sorted((root / folder).rglob("*.py")):
            parts = list(p.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__" or "__pycache__" in parts:
                continue
            out[".".join([name, *parts])] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip |= {id(c) for c in ast.walk(n)}
    return skip


def imported(source: str, modname: str) -> set[str]:
    """Every module name an import statement in ``source`` (module ``modname``) may refer to: the module
    itself and, for ``from X import a``, also ``X.a`` (a sub-module)."""
    tree = ast.parse(source)
    skip = _type_checking_nodes(tree)
    pkg = modname.rsplit(".", 1)[0]
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in n.names}
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {m: {x for x in imported(p.read_text(encoding="utf-8"), m) if x in mods and x != m}
            for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 50 and "diagnose.normalize.prometheus" in graph and "diagnose.reports.sections.host" in graph
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_lazy_and_relative_cycles(tmp_path: Path) -> None:
    """The check can fail: a cycle made by a lazy import in a function, one through ``from . import``, and
    none from an import under TYPE_CHECKING."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir()
    (tmp_path / "diagnose" / "normalize").mkdir()
    files = {
        "diagnose/normalize/a.py": "from diagnose.normalize.b import x\n",
        "diagnose/normalize/b.py": "def f():\n    from diagnose.normalize import a\n",
        "reports/c.py": "from .d import y\n",
        "reports/d.py": "from . import c\n",
        "rules/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from diagnose.rules import f\n",
        "rules/f.py": "import diagnose.rules.e\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    assert sorted(cycles(import_graph(tmp_path))) == [["diagnose.normalize.a", "diagnose.normalize.b"],
                                                      ["diagnose.reports.c", "diagnose.reports.d"]]


# -- no report building in the normalisers ---------------------------------------------------------
def report_names() -> set[str]:
    """The names of the report's section records (reports/sections/model.py)."""
    tree = ast.parse((ROOT / "reports" / "sections" / "model.py").read_text(encoding="utf-8"))
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert {"Section", "Table", "Quantity", "Phrase"} <= names
    return names


def report_building(source: str, names: set[str]) -> list[str]:
    """What in ``source`` builds report data: an import of the reports package, a use of a section record,
    or a ``sections`` function (the old normaliser hook)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(("diagnose.reports", "reports")):
            found.append(f"line {n.lineno}: imports from {n.module}")
        elif isinstance(n, ast.Import):
            found += [f"line {n.lineno}: imports {a.name}" for a in n.names if a.name.startswith("diagnose.reports")]
        elif isinstance(n, ast.Name) and n.id in names:
            found.append(f"line {n.lineno}: uses {n.id}")
        elif isinstance(n, ast.Attribute) and n.attr in names:
            found.append(f"line {n.lineno}: uses .{n.attr}")
        elif isinstance(n, ast.alias) and (n.asname or n.name).split(".")[-1] in names:
            found.append(f"imports {n.name}")
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and "section" in n.name.lower():
            found.append(f"line {n.lineno}: defines {n.name}()")
    return found


@pytest.mark.parametrize("folder", REPORT_ONLY)
def test_normalisers_build_no_report_data(folder: str) -> None:
    names = report_names()
    files = sorted((ROOT / folder).glob("*.py"))
    assert len(files) >= 5
    bad = {str(p.relative_to(ROOT)): f for p in files if (f := report_building(p.read_text(encoding="utf-8"), names))}
    assert not bad, f"report data built outside reports/: {bad}"


def test_the_report_building_check_can_fail() -> None:
    names = report_names()
    assert report_building("from diagnose.reports.sections.model import Quantity\n", names)
    assert report_building("import diagnose.reports.formatting\n", names)
    assert report_building("def sections(tables):\n    return [Section('a', 'b', None)]\n", names)
    assert report_building("def f(m):\n    return m.Table((), ())\n", names)
    assert not report_building("import pandas as pd\ndef tables(bundle):\n    return {'x': pd.DataFrame()}\n", names)
