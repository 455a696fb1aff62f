"""Kubernetes objects read from files (YAML or JSON), bounded before they are built.

NodeSLO and Node files are written by whoever can write the node's config dir or a
ConfigMap.  PyYAML builds nested values recursively, so a 50,000-deep list raised
RecursionError (and killed the thread that read it), and a 5 MB document took 14 s to
parse.  Here a document is checked on PyYAML's event stream, which is iterative, before
anything is built: size, nesting depth, node count, and no aliases (Kubernetes objects
never use them, and they are how a small YAML expands into a huge value).
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 2 << 20
"""Above the largest object the API server stores (~1.5 MiB); a real NodeSLO or Node is a few KiB."""

MAX_DEPTH = 64
"""A NodeSLO nests about 6 levels deep, a Node about 8."""

MAX_NODES = 100_000
"""Scalars, lists and maps together."""

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster
_PyLoader: type = yaml.SafeLoader


class DocumentError(ValueError):
    """The document is too large, too deep, uses aliases, or is not YAML/JSON; says which."""


def load_object(raw: bytes) -> dict[str, Any]:
    """One mapping from ``raw``; DocumentError otherwise, never another exception."""
    if len(raw) > MAX_BYTES:
        raise DocumentError(f"{len(raw)} bytes, more than the {MAX_BYTES} allowed")
    try:
        try:
            _check_shape(raw, _Loader)
        except yaml.YAMLError:
            # libyaml reads ahead and stops at its own limits (1000 flow levels) before the
            # events that break ours reach us; PyYAML's own parser yields event by event, so it
            # names the first rule the document breaks, or raises the same syntax error.
            _check_shape(raw, _PyLoader)
        value = yaml.load(raw, Loader=_Loader)  # noqa: S506 - a safe loader, shape checked above
    except DocumentError:
        raise
    except yaml.YAMLError as exc:
        raise DocumentError("invalid YAML/JSON: " + " ".join(str(exc).split())) from None
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:
        raise DocumentError(f"cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(value, dict):
        raise DocumentError("expected an object (a mapping), got "
                            + (type(value).__name__ if value is not None else "an empty document"))
    return value


def _check_shape(raw: bytes, loader: type) -> None:
    depth = nodes = documents = 0
    for event in yaml.parse(raw, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise DocumentError("uses a YAML alias (*name); Kubernetes objects have none")
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise DocumentError("holds more than one YAML document")
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise DocumentError(f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_NODES:
                raise DocumentError(f"more than {MAX_NODES} values")
