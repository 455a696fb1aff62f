"""Rule: the framework that turns the states informer's objects into the immutable rules
the plugins read, as upstream's ``rule.Register``.

A plugin owns its rules: its module defines each one (``Rule``: a name, the object it is
parsed from, a parse function), and the plugin class lists them in ``RuntimePlugin.rules_read``.
The plugin registry (``plugins/__init__.py``) parses every registered plugin's rules at each
NodeSLO, Node or topology update into one ``Rules`` value that every plugin receives.

Rules are frozen values, so a plugin compares old and new rules to learn whether existing
pods need a refresh (``RuntimePlugin.update_rules``), and a half-parsed NodeSLO can never
leak into a plugin: ``parse`` either returns complete rules or raises RuleError naming the
field that was wrong.

A NodeSLO rule parses the spec merged over upstream's defaults
(``statesinformer.specs.DEFAULT_NODE_SLO_SPEC``), so no rule keeps defaults of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar, cast

from koord.hookapi import json_object

from ..statesinformer.specs import DEFAULT_NODE_SLO_SPEC, merge_over

T = TypeVar("T")


class RuleError(ValueError):
    """NodeSLO, Node or a pod annotation holds a value the rules cannot use; names the field."""


rule_object = partial(json_object, error=RuleError)
"""A JSON object field of a rule's input: None is ``{}``, a non-object a RuleError naming it."""


class Source(enum.Enum):
    """What a rule is parsed from, and what its parse function is given."""

    NODE_SLO = "NodeSLO"
    """The NodeSLO's spec merged over upstream's defaults; without a NodeSLO the rule is ``absent``."""
    NODE = "Node"
    """The Node's annotations (``{}`` without a Node)."""
    NODE_TOPOLOGY = "NodeResourceTopology"
    """The annotations of the topology koordlet computed (as upstream reads them); the Node's
    while there is none yet (a Node file written by hand)."""


@dataclass(frozen=True, eq=False)
class Rule(Generic[T]):
    """One rule a plugin owns; compared by identity, named uniquely among registered rules."""

    name: str
    source: Source
    parse: Callable[[dict[str, Any]], T]
    absent: T
    """The value before anything was parsed (no NodeSLO yet, or rules built by hand in a
    test): for Node and topology rules, what ``parse({})`` gives."""


@dataclass(frozen=True)
class Rules:
    """Every registered rule's value: ``rules[GROUP_IDENTITY]``; a rule never parsed reads
    as its ``absent`` value."""

    items: tuple[tuple[str, Any], ...] = ()
    """(rule name, value) pairs sorted by name: what rules compare and hash by, so a plugin
    learns from ``!=`` whether anything changed."""
    _values: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        self._values.update(self.items)

    @classmethod
    def of(cls, values: Mapping[Rule[Any], Any]) -> Rules:
        """Rules holding ``values`` (tests and the parser build them this way)."""
        return cls(tuple(sorted((rule.name, value) for rule, value in values.items())))

    def __getitem__(self, rule: Rule[T]) -> T:
        return cast(T, self._values.get(rule.name, rule.absent))


def merged_spec(node_slo: dict) -> dict[str, Any]:
    """The NodeSLO (the object or its ``spec``) with its spec merged over upstream's defaults.

    A null section reads as an empty one (as ``json_object`` reads it), so it keeps its
    defaults; a null value replaces its default and the rule that reads it refuses it.
    """
    spec = node_slo.get("spec", node_slo) if isinstance(node_slo, dict) else node_slo
    if not isinstance(spec, dict):
        raise RuleError(f"NodeSLO spec: want an object, got {type(spec).__name__}")
    received = _null_sections_dropped(DEFAULT_NODE_SLO_SPEC, spec)
    return cast(dict[str, Any], merge_over(DEFAULT_NODE_SLO_SPEC, received))


def _null_sections_dropped(default: Any, received: Any) -> Any:
    if not isinstance(default, dict) or not isinstance(received, dict):
        return received
    return {key: _null_sections_dropped(default.get(key), value) for key, value in received.items()
            if value is not None or not isinstance(default.get(key), dict)}


DEFAULT_SPEC = merged_spec({})
"""Upstream's default NodeSLO spec: what a NodeSLO rule's ``absent`` value is parsed from
when the rule has a value before any NodeSLO."""


def node_annotations(obj: dict | None, what: str) -> dict[str, str]:
    """The annotations of a Node or topology object; RuleError when malformed."""
    if obj is None:
        return {}
    meta = rule_object(rule_object(obj, what).get("metadata"), f"{what} metadata")
    return rule_object(meta.get("annotations"), f"{what} metadata.annotations")


def parse(rules: Iterable[Rule[Any]], node_slo: dict | None, node: dict | None,
          topology: dict | None = None) -> Rules:
    """Every rule of ``rules`` parsed from the NodeSLO (the object or its ``spec``), the Node
    and this node's NodeResourceTopology."""
    spec = merged_spec(node_slo) if node_slo is not None else None
    annotations = node_annotations(node, "Node")
    inputs = {Source.NODE_SLO: spec, Source.NODE: annotations,
              Source.NODE_TOPOLOGY: node_annotations(topology, "NodeResourceTopology")
              if topology is not None else annotations}
    values: dict[Rule[Any], Any] = {}
    for rule in rules:
        given = inputs[rule.source]
        values[rule] = rule.absent if given is None else rule.parse(given)
    return Rules.of(values)
