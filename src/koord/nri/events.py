"""NRI event subscription masks, and which events a given runtime can be subscribed to.

ConfigureResponse.events has bit ``1 << (event - 1)`` set for each enumerated Event the
plugin wants. An NRI runtime rejects the whole plugin if a bit names an event it does not
know, so the mask is cut down to the runtime's events: NRI before v0.10.0 (containerd 2.0,
2.1, 1.7) knows RUN_POD_SANDBOX..REMOVE_CONTAINER; v0.10.0 added UPDATE_POD_SANDBOX and
POST_UPDATE_POD_SANDBOX; v0.12.0 added VALIDATE_CONTAINER_ADJUSTMENT and began to report its
version in ConfigureRequest.NRI_version. Before v0.12 the version is inferred from the
runtime's name and version, as upstream's stub does; only containerd's mapping is kept (2.2
was the first release with NRI v0.10), any other runtime that does not report a version gets
the pre-v0.10 events only.
"""

from __future__ import annotations

import re

from koord.nri import api_pb2 as api

Event = api.Event


def bit(event: int) -> int:
    return 1 << (event - 1)


def mask(*events: int) -> int:
    """The subscription mask of ``events`` (api.Event values)."""
    out = 0
    for event in events:
        out |= bit(event)
    return out


def names(events: int) -> list[str]:
    """The Event names whose bits are set in ``events``, for log lines."""
    out = []
    for index in range(32):
        if events & (1 << index):
            event = index + 1
            out.append(api.Event.Name(event) if event in api.Event.values() else f"event {event}")
    return out


LEGACY_EVENTS = mask(*range(api.RUN_POD_SANDBOX, api.REMOVE_CONTAINER + 1))
"""What NRI v0.8.0 (containerd 2.0 and 2.1) and earlier accept."""
V010_EVENTS = LEGACY_EVENTS | mask(api.UPDATE_POD_SANDBOX, api.POST_UPDATE_POD_SANDBOX)
ALL_EVENTS = mask(*range(api.RUN_POD_SANDBOX, api.LAST))
"""Every event of the vendored API (v0.12.2)."""

_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def _version(text: str) -> tuple[int, int] | None:
    match = _VERSION.match(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def runtime_events(request: api.ConfigureRequest) -> int:
    """The events the runtime sending ``request`` accepts in a subscription."""
    nri = _version(request.NRI_version)
    if nri is None and request.runtime_name == "containerd":
        runtime = _version(request.runtime_version)
        if runtime is not None and runtime >= (2, 2):
            nri = (0, 10)
    if nri is None or nri < (0, 10):
        return LEGACY_EVENTS
    if nri < (0, 12):
        return V010_EVENTS
    return ALL_EVENTS
