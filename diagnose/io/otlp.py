"""OTLP trace payloads (protobuf or OTLP/JSON) -> normalised span records for the ``spans`` stream.

Shared by the OTLP receiver probe (probes/otel.py) and the post-mortem span-file reader
(diagnose/normalize/otel.py). A normalised span is a plain dict:
``{trace_id, span_id, parent_span_id, name, kind, start_unix_ns, end_unix_ns, attributes, resource,
scope, status, events, source}`` with hex ids, ``kind`` as "SERVER" / "CLIENT" / ..., and events reduced to
``{name, time_unix_ns}`` (event attributes can carry prompt text and are not kept).

Prompt and completion text that some instrumentations put in span attributes (``gen_ai.prompt``,
``gen_ai.input.messages``, ...) is dropped unless ``keep_text`` is set: diagnose never stores request text by
default.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

# Attribute keys (or key prefixes) that carry request/response text; dropped unless keep_text.
TEXT_ATTRIBUTE_PREFIXES = (
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.content",
    "llm.prompts",
    "llm.input_messages",
    "llm.output_messages",
    "input.value",
    "output.value",
)

_KIND_NAMES = {v: k.removeprefix("SPAN_KIND_") for k, v in Span.SpanKind.items()}
_STATUS_NAMES = {v: k.removeprefix("STATUS_CODE_") for k, v in Status.StatusCode.items()}
_HEX = re.compile(r"^[0-9a-fA-F]*$")


class OtlpDecodeError(ValueError):
    """A payload is not a valid OTLP trace export (garbage, wrong encoding, bad ids)."""


def _is_text_key(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") or key.startswith(p + "_") or key.startswith(p + "[")
               for p in TEXT_ATTRIBUTE_PREFIXES)


def any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return getattr(v, which)


def attributes(kvs: Iterable[KeyValue], keep_text: bool, dropped: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        if not keep_text and _is_text_key(kv.key):
            dropped[0] += 1
            continue
        out[kv.key] = any_value(kv.value)
    return out


def decode_request(req: ExportTraceServiceRequest, *, source: str, keep_text: bool = False
                   ) -> tuple[list[dict[str, Any]], int, int]:
    """Normalised spans of one export request, the number of invalid spans skipped, and text attrs dropped."""
    spans: list[dict[str, Any]] = []
    invalid = 0
    dropped = [0]
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes, keep_text, dropped)
        for ss in rs.scope_spans:
            scope = ss.scope.name or None
            for sp in ss.spans:
                if len(sp.trace_id) != 16 or len(sp.span_id) != 8 or not any(sp.trace_id):
                    invalid += 1
                    continue
                spans.append({
                    "trace_id": sp.trace_id.hex(),
                    "span_id": sp.span_id.hex(),
                    "parent_span_id": sp.parent_span_id.hex() if len(sp.parent_span_id) == 8 else None,
                    "name": sp.name,
                    "kind": _KIND_NAMES.get(sp.kind, str(sp.kind)),
                    "start_unix_ns": int(sp.start_time_unix_nano),
                    "end_unix_ns": int(sp.end_time_unix_nano),
                    "attributes": attributes(sp.attributes, keep_text, dropped),
                    "resource": resource,
                    "scope": scope,
                    "status": {"code": _STATUS_NAMES.get(sp.status.code, str(sp.status.code)),
                               "message": sp.status.message},
                    "events": [{"name": e.name, "time_unix_ns": int(e.time_unix_nano)} for e in sp.events],
                    "source": source,
                })
    return spans, invalid, dropped[0]


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise OtlpDecodeError(f"not an OTLP protobuf ExportTraceServiceRequest ({e})") from None
    return req


def _fix_id(value: Any, nbytes: int) -> Any:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping expects base64. Accept both."""
    if not isinstance(value, str) or value == "":
        return value
    if len(value) == 2 * nbytes and _HEX.match(value):
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise OtlpDecodeError(f"span id {value[:40]!r} is neither hex nor base64") from None
    return value


_ID_FIELDS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8, "parentSpanId": 8, "parent_span_id": 8}


def _fix_ids(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (_fix_id(v, _ID_FIELDS[k]) if k in _ID_FIELDS else _fix_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fix_ids(x) for x in obj]
    return obj


def parse_json_obj(obj: Any) -> ExportTraceServiceRequest:
    if not isinstance(obj, dict):
        raise OtlpDecodeError("OTLP/JSON payload must be an object with resourceSpans")
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_fix_ids(obj), req, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise OtlpDecodeError(f"not an OTLP/JSON trace export ({str(e)[:200]})") from None
    return req


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    import orjson

    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise OtlpDecodeError(f"not JSON ({e})") from None
    return parse_json_obj(obj)
