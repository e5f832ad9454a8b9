"""docs/json-schemas.md's table of JSON documents, for the tests that check a document the CLI wrote against it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "json-schemas.md"


def table() -> dict[str, dict[str, Any]]:
    """Document name -> {"version": int, "required": set of keys, "optional": set of keys}."""
    text = DOC.read_text()
    rows = text.split("<!-- schema-table", 1)[1].splitlines()
    out: dict[str, dict[str, Any]] = {}
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[2].isdigit():
            continue
        keys = re.findall(r"`([^`]+)`", cells[3])
        out[cells[0]] = {"version": int(cells[2]),
                         "required": {k for k in keys if not k.endswith("?")},
                         "optional": {k[:-1] for k in keys if k.endswith("?")}}
    return out


def check_document(name: str, path: Path, *, first: bool = True, line: bool = False) -> dict[str, Any]:
    """The document at ``path`` (its first line with ``line``) is the table's ``name``: its schema_version (the
    first key when ``first``) is the table's, it has every required key and no key the table does not list."""
    raw = path.read_text().splitlines()[0] if line else path.read_text()
    doc = json.loads(raw)
    assert isinstance(doc, dict), path
    row = table()[name]
    assert doc.get("schema_version") == row["version"], (path, doc.get("schema_version"))
    if first:
        assert next(iter(doc)) == "schema_version" and raw.lstrip("{ \n").startswith('"schema_version"'), path
    keys = set(doc)
    assert row["required"] <= keys, (name, sorted(row["required"] - keys))
    assert keys <= row["required"] | row["optional"], (name, sorted(keys - row["required"] - row["optional"]))
    return doc
