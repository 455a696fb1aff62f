"""koordlet's metrics pages as a scraper reads them, for tests that check what a module recorded."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from koord.koordlet.metrics import KoordletMetrics


def scrape(metrics: KoordletMetrics, path: str) -> str:
    """The text ``path`` (``/internal-metrics``, ``/external-metrics``, ``/metrics``) serves."""
    body = metrics.pages()[path]({"REQUEST_METHOD": "GET"}, lambda status, headers: None)
    return b"".join(body).decode()


def samples(metrics: KoordletMetrics, path: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples named ``name`` (a histogram's ``<name>_count``, say) on ``path``, by their labels."""
    return {frozenset(s.labels.items()): s.value for family in text_string_to_metric_families(scrape(metrics, path))
            for s in family.samples if s.name == name}


def labelled(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())
