"""JSON carried in Kubernetes annotations and objects, read with errors that name the annotation and field.

Koordinator's scheduler and node agents talk through JSON annotations; a malformed one
must fail with a message naming the annotation (and the object that carries it), so users
see what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_ANNOTATION_BYTES = 256 * 1024
"""Kubernetes caps all of an object's annotations together at 256 KiB."""

_JSON_KINDS: dict[type, str] = {dict: "object", list: "list"}


def json_annotation(annotations: Mapping[str, str], key: str, want: type = dict,
                    error: type[Exception] = ValueError, owner: str = "pod") -> Any:
    """The JSON value of annotation ``key``, or None when it is absent, empty or JSON ``null``
    (Go writes an empty list as ``null`` and reads it back as none); ``error`` when malformed."""
    text = annotations.get(key)
    if not text:
        return None
    if not isinstance(text, str):
        raise error(f"{owner} annotation {key}: want a JSON string value, got {text!r}")
    if len(text) > MAX_ANNOTATION_BYTES:
        raise error(f"{owner} annotation {key}: {len(text)} characters, more than Kubernetes allows")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{owner} annotation {key}: bad JSON: {exc.msg}") from None
    except (RecursionError, ValueError) as exc:
        raise error(f"{owner} annotation {key}: bad JSON: {exc}") from None
    if value is None:
        return None
    if not isinstance(value, want):
        raise error(f"{owner} annotation {key}: want a JSON {_JSON_KINDS.get(want, want.__name__)}, got {text!r}")
    return value


def json_document(raw: str | bytes, what: str, error: type[Exception] = ValueError) -> dict[str, Any]:
    """A JSON object parsed from ``raw`` (a request body, a runtime's verbose info, an API answer);
    anything else, nesting too deep for the parser included, is ``error`` naming ``what``."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise error(f"{what}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise error(f"{what}: not a JSON object (got a {type(value).__name__})")
    return value


def json_object(value: Any, where: str, error: type[Exception] = ValueError) -> dict[str, Any]:
    """``value`` as a JSON object; None (absent, or null as in Go) is ``{}``; anything else is ``error``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{where}: want an object, got {type(value).__name__}")
    return value
