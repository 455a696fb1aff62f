"""JSON annotations and objects: absent is None, malformed is the caller's error naming the annotation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.hookapi import json_annotation, json_object
from koord.hookapi.annotations import MAX_ANNOTATION_BYTES

KEY = "scheduling.koordinator.sh/resource-status"


class PluginError(Exception):
    pass


@pytest.mark.parametrize("annotations, want, value", [
    ({}, dict, None), ({KEY: ""}, dict, None), ({KEY: '{"cpuset":"0"}'}, dict, {"cpuset": "0"}),
    ({KEY: "[1, 2]"}, list, [1, 2]),
])
def test_good(annotations: dict, want: type, value: object) -> None:
    assert json_annotation(annotations, KEY, want=want, error=PluginError) == value


@pytest.mark.parametrize("text, want, problem", [
    ("{not json", dict, "bad JSON"), ("[1]", dict, "want a JSON object"), ('{"a":1}', list, "want a JSON list"),
    ("[" * 100000, dict, "bad JSON"), ("NaN", dict, "want a JSON object"),
    (" " * (MAX_ANNOTATION_BYTES + 1), dict, "more than Kubernetes allows"),
])
def test_bad_names_the_owner_and_annotation(text: str, want: type, problem: str) -> None:
    with pytest.raises(PluginError) as info:
        json_annotation({KEY: text}, KEY, want=want, error=PluginError, owner="node")
    assert str(info.value).startswith(f"node annotation {KEY}: ") and problem in str(info.value)


@given(st.text(max_size=300))
def test_any_text_is_a_value_or_the_callers_error(text: str) -> None:
    try:
        value = json_annotation({KEY: text}, KEY, error=PluginError)
    except PluginError:
        return
    assert value is None or isinstance(value, dict)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                 max_size=3), max_leaves=10))
def test_json_object(value: object) -> None:
    try:
        got = json_object(value, "where", PluginError)
    except PluginError as exc:
        assert "where: want an object" in str(exc) and not isinstance(value, dict) and value is not None
        return
    assert got == ({} if value is None else value)
    json.dumps(got)
