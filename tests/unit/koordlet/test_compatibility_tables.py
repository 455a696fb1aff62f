"""docs/compatibility.md's upstream inventory against the code's own lists, so the tables
cannot drift: every upstream hook, strategy, collector, flag and gate (the names in
tests/data/upstream-koordlet-a7a1b76b.json, read from upstream at that commit) has exactly
one row; a row that says complete or differs names something the code registers, a row that
says missing names nothing it registers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from koord.koordlet import features, flags, upstreamflags
from koord.koordlet.metricsadvisor.collectors import COLLECTORS
from koord.koordlet.qosmanager.manager import STRATEGIES
from koord.koordlet.runtimehooks.plugins import REGISTRY, implemented_gates

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "compatibility.md"
UPSTREAM = json.loads((ROOT / "tests" / "data" / "upstream-koordlet-a7a1b76b.json").read_text())
STATUSES = ("complete", "differs", "missing")
PRESENT = ("complete", "differs")


def section(text: str, heading: str) -> str:
    """The body of ``### heading`` up to the next heading of any level."""
    match = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^#)", text, re.M | re.S)
    assert match, f"docs/compatibility.md has no '### {heading}' section"
    return match.group(1)


def table(text: str, heading: str) -> dict[str, list[str]]:
    """First cell's backticked name -> the row's other cells, of the section's table."""
    rows: dict[str, list[str]] = {}
    for line in section(text, heading).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not (m := re.fullmatch(r"`([^`]+)`", cells[0])):
            continue
        assert m.group(1) not in rows, f"{heading}: {m.group(1)} listed twice"
        rows[m.group(1)] = cells[1:]
    return rows


def status(cells: list[str]) -> str:
    word = re.match(r"\w+", cells[-1])
    assert word and word.group(0) in STATUSES, f"status {cells[-1]!r} is not one of {STATUSES}"
    return word.group(0)


def here_name(cells: list[str]) -> str | None:
    """The ``here`` cell's first backticked name; None for ``none``."""
    m = re.search(r"`([^`]+)`", cells[0])
    return None if cells[0] == "none" else (m.group(1) if m else cells[0])


def parser_flags() -> set[str]:
    return {o[2:] for a in flags.build_parser()._actions for o in a.option_strings if o.startswith("--")}


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.mark.parametrize("heading,upstream_key,registered", [
    ("Runtime hooks", "hooks", {cls.name for cls in REGISTRY.plugins}),
    ("QoS strategies", "strategies", {cls.name for cls in STRATEGIES}),  # type: ignore[attr-defined]
    ("Metrics collectors", "collectors", {cls.name for cls in COLLECTORS}),
])
def test_component_tables(doc: str, heading: str, upstream_key: str, registered: set[str]) -> None:
    rows = table(doc, heading)
    assert sorted(rows) == sorted(UPSTREAM[upstream_key]), f"{heading}: rows are not upstream's {upstream_key}"
    named = set()
    for name, cells in rows.items():
        here = here_name(cells)
        if status(cells) in PRESENT:
            assert here in registered, f"{heading}: {name} says {status(cells)} but {here!r} is not registered"
            named.add(here)
        else:
            assert here is None, f"{heading}: {name} is missing but names {here!r}"
    assert registered <= named, f"{heading}: registered but in no row: {sorted(registered - named)}"


def test_flags_table_is_upstreams_flags(doc: str) -> None:
    rows = table(doc, "Flags")
    assert sorted(rows) == sorted(UPSTREAM["flags"] + UPSTREAM["klog_flags"])


def test_flag_rows_match_the_parser(doc: str) -> None:
    known = parser_flags()
    for name, cells in table(doc, "Flags").items():
        text = cells[-1]
        if status(cells) in PRESENT:
            assert name in known and name not in upstreamflags.NOT_IMPLEMENTED, f"-{name}: {text}"
        elif text.startswith("missing: ignored"):
            assert name in upstreamflags.NOT_IMPLEMENTED, f"-{name} is not in NOT_IMPLEMENTED"
        elif text.startswith("missing: refused unless at upstream's default"):
            assert name in upstreamflags.REFUSED_UNLESS_DEFAULT, f"-{name} is not in REFUSED_UNLESS_DEFAULT"
        else:
            assert text.startswith("missing: not accepted"), f"-{name}: {text!r}"
            assert name not in known
    ignored = {n for n, c in table(doc, "Flags").items() if c[-1].startswith("missing: ignored")}
    assert set(upstreamflags.NOT_IMPLEMENTED) == ignored
    refused = {n for n, c in table(doc, "Flags").items() if c[-1].startswith("missing: refused")}
    assert set(upstreamflags.REFUSED_UNLESS_DEFAULT) == refused


def test_flags_refused_unless_at_upstreams_default_exit_2_otherwise(doc: str) -> None:
    refused = [n for n, c in table(doc, "Flags").items() if c[-1].startswith("missing: refused")]
    assert refused, "the table refuses no flag; drop this test's premise"
    for name in refused:
        kind, default, _ = upstreamflags.REFUSED_UNLESS_DEFAULT[name]
        other = {"bool": "true" if default == "false" else "false", "int": "12345", "duration": "7s",
                 "map": "x=y"}.get(kind, default + "-other")
        with pytest.raises(SystemExit) as exc:
            flags.parse_args([f"-{name}={other}"])
        assert exc.value.code == 2, name


def test_our_own_flags_are_listed(doc: str) -> None:
    """The sentence after the flags table names exactly the flags upstream has not."""
    sentence = re.search(r"Flags of this koordlet that upstream has not:(.*?)\(", section(doc, "Flags"), re.S)
    assert sentence
    listed = set(re.findall(r"`-([a-z0-9_-]+)`", sentence.group(1)))
    upstream = set(UPSTREAM["flags"]) | set(UPSTREAM["klog_flags"])
    assert listed == parser_flags() - upstream - {"help"}


def test_gates_table_is_upstream_gates(doc: str) -> None:
    rows = table(doc, "Feature gates")
    assert sorted(rows) == sorted(features.UPSTREAM_GATES) == sorted(UPSTREAM["gates"])
    for name, cells in rows.items():
        built = name in implemented_gates()
        assert (status(cells) in PRESENT) == built, f"gate {name}: {cells[-1]!r} but built={built}"


def test_no_gate_without_a_feature_is_on_by_default() -> None:
    """The Feature gates section says so: the start-up warning names nothing by default."""
    assert features.not_implemented(dict(features.ALL_GATE_DEFAULTS), implemented_gates()) == []
