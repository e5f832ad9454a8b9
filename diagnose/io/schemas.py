"""The version of every JSON document diagnose writes (docs/json-schemas.md lists each one and its keys).

Each document carries ``schema_version`` at its top level. A version is raised when a key is removed or renamed
or changes meaning; a new key does not raise it (readers ignore keys they do not know). Two documents keep
their version where it was before this registry: the bundle manifest (diagnose.io.bundle.SCHEMA_VERSION, which
readers check) and ``analyze --json`` (reports/document.JSON_SCHEMA_VERSION); tests/test_json_schemas.py checks
that the docs list every document with its version and its top-level keys.
"""

from __future__ import annotations

from collections.abc import Mapping

COMPARISON = 1  # compare --json
VERIFICATION = 1  # verify --json; experiment's and attach --verify's verify.json (with "experiment" added)
EXPERIMENT = 1  # experiment.json (experiment, attach --verify): the launch, the plan, the captures' tries
SEARCH = 1  # attach --find-max-goodput: search.json
PARQUET_SCHEMA = 1  # export --format parquet: schema.json beside the tables
PERFETTO = 1  # export --format perfetto (Chrome JSON trace: other top-level keys are the trace's metadata)
SPEEDSCOPE = 1  # export --format speedscope (speedscope's file format allows other keys)
WORKLOAD_FILE = 1  # the header line of a workload file (diagnose workload; also its diagnose_workload key)
READINESS = 1  # diagnose readiness: readiness.json (the readiness card, its checks and their measurements)


def versioned(version: int, doc: Mapping[str, object]) -> dict[str, object]:
    """``doc`` with ``schema_version`` as its first key (a key of that name in ``doc`` is replaced)."""
    return {"schema_version": version, **{k: v for k, v in doc.items() if k != "schema_version"}}


def dumps(doc: Mapping[str, object], option: int = 0) -> bytes:
    """``orjson.dumps(doc, option=option)`` with ``schema_version`` written first even under OPT_SORT_KEYS (a
    reader can tell the version from the file's first bytes). ``doc`` must carry ``schema_version``."""
    import orjson

    if "schema_version" not in doc:
        raise ValueError("dumps: the document has no schema_version")
    head = orjson.dumps({"schema_version": doc["schema_version"]}, option=option)
    body = orjson.dumps({k: v for k, v in doc.items() if k != "schema_version"}, option=option)
    if body.strip() == b"{}":
        return head
    return head.rstrip().removesuffix(b"}").rstrip() + b"," + body.lstrip()[1:]
