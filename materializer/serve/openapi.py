"""The query server's OpenAPI 3.1 description (``GET /openapi.json``), written by hand and kept small:
the paths, their parameters and the shapes of their answers."""

from __future__ import annotations

from typing import Any

from materializer.serve import answers

__all__ = ["openapi_document"]


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


_TOPIC = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}}
_KEY_ENCODING = {"name": "key_encoding", "in": "query", "required": False,
                 "description": "utf8 (default): keys are UTF-8 text; base64: keys are standard base64 of the key bytes",
                 "schema": {"type": "string", "enum": list(answers.KEY_ENCODINGS), "default": "utf8"}}
_COMMON = {"401": _error("a bearer token is required"), "404": _error("unknown topic"),
           "502": _error("the member holding the key refused this member's token, redirected, or answered "
                         "another 4xx than a key's absence (forwarding: check its serving URL)"),
           "503": _error("cannot answer now (not caught up, no owner in a rebalance, an owner that does not "
                         "answer, a forwarded request for a partition not served here, the store fails); see "
                         "Retry-After; 'reason' names the kind (stale, incomplete, schema_registry, store; tls, "
                         "timeout, refused, reset, unresolved, bad_answer, unreachable for an owner)")}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document as a JSON-compatible dict."""
    entry = {"type": "object", "properties": {
        "key": {"type": "string"}, "value": {"description": "decoded by the topic's value format: str a string, "
                                             "json the document, avro the datum, bytes base64"},
        "partition": {"type": "integer"}, "offset": {"type": "integer"},
        "timestamp": {"type": "integer", "description": "the record's timestamp, ms since the epoch"}}}
    served_by = {"type": "object", "properties": {"address": {"type": ["string", "null"]},
                                                  "group_id": {"type": ["string", "null"]},
                                                  "member_id": {"type": ["string", "null"]}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "kafka-materializer query server", "version": "1"},
        "paths": {
            "/v1/topics": {"get": {"summary": "The topics served", "responses": {"200": {"description": "topics"}}}},
            "/v1/topics/{topic}/keys/{key}": {"get": {
                "summary": "The live value of one key",
                "parameters": [_TOPIC, {"name": "key", "in": "path", "required": True, "schema": {"type": "string"},
                                        "description": "the key, percent-encoded as one path segment ('/' is %2F)"},
                               _KEY_ENCODING],
                "responses": {"200": {"description": "the value", "content": {"application/json": {"schema": {
                    "allOf": [{"$ref": "#/components/schemas/Entry"},
                              {"type": "object", "properties": {"topic": {"type": "string"},
                                                                "served_by": served_by}}]}}}},
                              "400": _error("bad key encoding"),
                              "413": _error(f"key over {answers.MAX_KEY_BYTES} bytes"), **_COMMON}}},
            "/v1/topics/{topic}/keys:batch": {"post": {
                "summary": f"The live values of up to {answers.MAX_BATCH_KEYS} keys",
                "parameters": [_TOPIC, _KEY_ENCODING],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "array", "items": {"type": "string"}, "maxItems": answers.MAX_BATCH_KEYS}}}},
                "responses": {"200": {"description": "one result per key, in order, each with its own status "
                                                     "(200, 404 or 503 and an error)"},
                              "400": _error("not a JSON list of strings"),
                              "413": _error(f"over {answers.MAX_BATCH_KEYS} keys or {answers.MAX_BODY_BYTES} bytes"),
                              **_COMMON}}},
            "/v1/topics/{topic}/scan": {"get": {
                "summary": "Live entries in key byte order, a page at a time",
                "parameters": [_TOPIC, _KEY_ENCODING,
                               *({"name": n, "in": "query", "required": False, "schema": {"type": "string"},
                                  "description": d} for n, d in (
                                   ("prefix", "keys starting with it"), ("start", "keys >= it"),
                                   ("end", "keys < it"), ("cursor", "next_cursor of the previous page"))),
                               {"name": "limit", "in": "query", "required": False,
                                "schema": {"type": "integer", "minimum": 1, "maximum": answers.MAX_SCAN_LIMIT,
                                           "default": answers.DEFAULT_SCAN_LIMIT}}],
                "responses": {"200": {"description": "items (each an Entry plus key_b64, the exact key bytes in "
                                                     "standard base64), next_cursor (null on the last page), "
                                                     "partitions (group mode: those served here) and partial"},
                              "400": _error("bad parameter"), **_COMMON}}},
        },
        "components": {"schemas": {
            "Entry": entry,
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        }},
    }
