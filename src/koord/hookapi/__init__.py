"""The runtime hook protocol as both sides speak it: hook points, failure policy, registration files,
and the parsers every box shares (durations, endpoints, cpu lists, quantities, JSON annotations).

The proxy (``koord.runtimeproxy``), koordlet (``koord.koordlet``), the plugin SDK
(``koord.pluginsdk``) and the test plugins (``koord_testing``) import these instead of
writing their own, so the two ends of the protocol cannot drift apart.
"""

from .annotations import json_annotation, json_document, json_object
from .cpuset import MAX_CPU_ID, cpuset_value, format_cpuset, parse_cpuset
from .durations import parse_duration
from .endpoints import SOCKET_MODE, UNIX_PATH_MAX, parse_bind_address, prepare_socket, unix_socket_path
from .hookpoints import (
    SERVICE,
    ContainerHookRequest,
    ContainerHookResponse,
    FailurePolicy,
    HookPoint,
    HookRequest,
    HookResponse,
    PodHookRequest,
    PodHookResponse,
)
from .quantity import parse_quantity
from .registration import Registration, RegistrationError, display_name

__all__ = [
    "MAX_CPU_ID", "SERVICE", "SOCKET_MODE", "UNIX_PATH_MAX", "ContainerHookRequest", "ContainerHookResponse",
    "FailurePolicy", "HookPoint", "HookRequest", "HookResponse", "PodHookRequest", "PodHookResponse", "Registration",
    "RegistrationError", "cpuset_value", "display_name", "format_cpuset", "json_annotation", "json_document",
    "json_object", "parse_bind_address", "parse_cpuset", "parse_duration", "parse_quantity", "prepare_socket",
    "unix_socket_path",
]
