"""koordlet's metrics in Prometheus' text format as upstream's Go client writes it.

Dashboards and alerts written against upstream koordlet match on exact sample names, so
koordlet's pages differ from prometheus_client's own exposition where the two clients
differ: a counter's samples carry the family's name (upstream's counters have no
``_total``), no ``_created`` series, families that hold no series are left out, families
come sorted by name, each series' labels sorted by name (``le`` last) and numbers written
as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` (``3``, not ``3.0``; ``1.7e+09``).

Three pages, as upstream's HTTP handler: ``/internal-metrics`` (koordlet's own state),
``/external-metrics`` (what it measured on the node and its pods) and ``/metrics``, both
merged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from koord.health import WSGIApp

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What upstream's promhttp answers a scraper that does not ask for protobuf or OpenMetrics."""


def go_float(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(value, 'g', -1, 64)`` writes it: the shortest
    digits that read back as ``value``, in exponent form when the decimal exponent is below
    -4 or at least 6 (``1e+06``, ``1.7327e+09``, ``1e-05``), else written out (``100000``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"  # Go's writer tests f == 0, which -0 passes
    if 1e-4 <= abs(value) < 1e6:  # most samples: Python's repr has Go's digits, without exponent
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite: NaN and Inf returned above
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # digits[:point] is the integer part
    exp = point - 1
    out = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{out}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{out}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return out + digits + "0" * (point - len(digits))
    return f"{out}{digits[:point]}.{digits[point:]}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _series(name: str, labels: Mapping[str, str], value: float) -> str:
    keys = sorted(k for k in labels if k != "le")
    if "le" in labels:
        keys.append("le")
    body = ",".join(f'{k}="{_escape_label(labels[k])}"' for k in keys)
    return f"{name}{{{body}}} {go_float(value)}\n" if body else f"{name} {go_float(value)}\n"


def _lines(family: Metric) -> Iterator[str]:
    samples = [s for s in family.samples if not s.name.endswith("_created")]
    if not samples:
        return
    yield f"# HELP {family.name} {_escape_help(family.documentation)}\n"
    yield f"# TYPE {family.name} {family.type}\n"
    count = None  # a histogram's _count, written after its _sum as Go writes them
    for s in samples:
        if s.name == family.name + "_count" and family.type == "histogram":
            count = s
            continue
        name = family.name if family.type == "counter" and s.name == family.name + "_total" else s.name
        yield _series(name, s.labels, s.value)
        if count is not None and s.name == family.name + "_sum":
            yield _series(count.name, count.labels, count.value)
            count = None


def render(registries: Iterable[CollectorRegistry]) -> bytes:
    """Every family of ``registries``, merged and sorted by name as upstream's gatherer does."""
    families = sorted((f for r in registries for f in r.collect()), key=lambda f: f.name)
    return "".join(line for family in families for line in _lines(family)).encode()


def page(registries: Iterable[CollectorRegistry]) -> WSGIApp:
    """A WSGI app answering every request with ``render(registries)``."""
    held = tuple(registries)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = render(held)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app
