"""CRI List* answers decoded item by item, so one unreadable record never hides the rest.

containerd stores whatever bytes a client sent: a sandbox or container name that is not
UTF-8 is accepted, and from then on every ListPodSandbox / ListContainers answer carries
it.  No protobuf string field decodes it, so decoding the whole answer fails; grpc then
hands the caller ``None`` (asyncio API) or an INTERNAL error (sync API).  Here each item
(field 1 of the answer) is decoded alone, and an item that does not decode still yields
its id (field 1 of the item) for the caller to name in its log line.
"""

from __future__ import annotations

from typing import TypeVar

from cri_api.v1 import api_pb2 as cri
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

_Item = TypeVar("_Item", cri.PodSandbox, cri.Container)


class ListError(Exception):
    """The answer is not a protobuf message at all."""


def decode_items(raw: bytes, item_type: type[_Item]) -> tuple[list[_Item], list[str]]:
    """(the items that decode, the ids of those that do not; "" when even the id is unreadable)."""
    try:
        fields = _fields(raw)
    except DecodeError:
        raise ListError(f"not a {item_type.DESCRIPTOR.name} list: the answer is not a protobuf message") from None
    items: list[_Item] = []
    unreadable: list[str] = []
    for field in fields:
        if field.field_number != 1 or not isinstance(field.data, bytes):
            continue
        try:
            items.append(item_type.FromString(field.data))
        except DecodeError:
            unreadable.append(_id_of(field.data))
    return items, unreadable


def _fields(data: bytes) -> list:
    """The top-level fields of a serialized message, undecoded; DecodeError when it is not protobuf."""
    fields = UnknownFieldSet(empty_pb2.Empty.FromString(data))
    return [fields[i] for i in range(len(fields))]


def _id_of(data: bytes) -> str:
    try:
        fields = _fields(data)
    except DecodeError:
        return ""
    return next((f.data.decode("utf-8", "replace") for f in fields
                 if f.field_number == 1 and isinstance(f.data, bytes)), "")
