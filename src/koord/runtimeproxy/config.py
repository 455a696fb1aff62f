"""Command-line options of koord-runtime-proxy, parsed and validated in one place.

Flag names and defaults are the upstream binary's, so install steps written for it work
verbatim.
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path

from koord import klog
from koord.apis.extension import LABEL_RUNTIME_PROXY_SKIP
from koord.commonflags import PrintVersion, log_level
from koord.hookapi import durations, endpoints

DEFAULT_PROXY_ENDPOINT = "/var/run/koord-runtimeproxy/runtimeproxy.sock"
DEFAULT_RUNTIME_ENDPOINT = "/var/run/containerd/containerd.sock"
DEFAULT_DOCKER_ENDPOINT = "/var/run/docker.sock"
DEFAULT_HOOK_CONFIG_DIR = "/etc/runtime/hookserver.d"
DEFAULT_SKIP_VAL = "true"
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9319"
DEFAULT_HOOK_TIMEOUT = 5.0
DEFAULT_DATA_PLANE_START_TIMEOUT = 30.0
DEFAULT_DATA_PLANE_IDLE_TIMEOUT = 24 * 3600.0
MAX_DATA_PLANE_IDLE_TIMEOUT = 596 * 3600.0
"""596 h: with the data plane's 10 s margin, under HAProxy's largest timeout (2**31 - 1 ms, 24.8 days)."""
"""HAProxy serves its socket ~50 ms after it starts on a normal node, seconds on a starved or emulated one."""


class BackendMode(enum.StrEnum):
    CONTAINERD = "Containerd"
    DOCKER = "Docker"


class DataPlane(enum.StrEnum):
    """Who serves kubelet's socket: HAProxy (Python only for hooked calls), Python alone,
    or HAProxy when it is installed."""

    AUTO = "auto"
    HAPROXY = "haproxy"
    PYTHON = "python"


class OptionError(ValueError):
    """A flag value is wrong; the message names the flag."""


@dataclass(frozen=True)
class Options:
    proxy_endpoint: str
    runtime_endpoint: str
    image_endpoint: str
    backend_mode: BackendMode
    skip_key: str
    skip_val: str
    hook_config_dir: Path
    metrics_address: str
    hook_timeout: float
    log_level: str | None
    verbosity: int
    logging_format: str
    data_plane: DataPlane = DataPlane.AUTO
    data_plane_start_timeout: float = DEFAULT_DATA_PLANE_START_TIMEOUT
    data_plane_idle_timeout: float = DEFAULT_DATA_PLANE_IDLE_TIMEOUT


def unix_socket_path(value: str, flag: str) -> str:
    """Accepts ``/path`` or ``unix:///path``; anything else is a flag error."""
    try:
        return endpoints.unix_socket_path(value)
    except ValueError as exc:
        raise OptionError(f"{flag}: {exc}") from None


def parse_duration(value: str, flag: str) -> float:
    """Seconds from ``5``, ``2.5``, ``500ms``, ``5s`` or ``1m`` (Go duration style), > 0."""
    try:
        seconds = durations.parse_duration(value, bare_seconds=True)
    except ValueError as exc:
        raise OptionError(f"{flag}: {exc}") from None
    if seconds <= 0:
        raise OptionError(f"{flag}: must be a positive duration, got {value!r}")
    return seconds


def check_bind_address(value: str, flag: str) -> str:
    """``host:port`` (``:9319`` = all interfaces, ``[::1]:9319``); empty disables."""
    if value == "":
        return value
    try:
        endpoints.parse_bind_address(value)
    except ValueError as exc:
        raise OptionError(f"{flag}: {exc}") from None
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="koord-runtime-proxy", allow_abbrev=False,  # pflag has no abbreviations
        description="CRI proxy between kubelet and containerd that calls runtime plugins "
        "before and after pod and container lifecycle calls.",
    )
    p.add_argument("--koord-runtimeproxy-endpoint", default=DEFAULT_PROXY_ENDPOINT,
                   help="unix socket the proxy serves CRI on; point kubelet's "
                   "--container-runtime-endpoint here (default: %(default)s)")
    p.add_argument("--remote-runtime-service-endpoint", default=None,
                   help=f"backend runtime service socket (default: {DEFAULT_RUNTIME_ENDPOINT}; "
                   f"dockerd's {DEFAULT_DOCKER_ENDPOINT} in Docker mode)")
    p.add_argument("--remote-image-service-endpoint", default=None,
                   help="backend image service socket (default: the runtime endpoint; "
                   "not for Docker mode)")
    p.add_argument("--backend-runtime-mode", default=BackendMode.CONTAINERD.value,
                   help="Containerd or Docker (default: %(default)s)")
    p.add_argument("--runtime-hook-server-key", default=LABEL_RUNTIME_PROXY_SKIP,
                   help="pod label key that makes the proxy skip all hooks for the pod "
                   "(default: %(default)s)")
    p.add_argument("--runtime-hook-server-val", default=DEFAULT_SKIP_VAL,
                   help="value of that label (default: %(default)s)")
    p.add_argument("--runtime-hook-config-dir", default=DEFAULT_HOOK_CONFIG_DIR,
                   help="directory of *.json plugin registrations, watched for changes "
                   "(default: %(default)s)")
    p.add_argument("--metrics-bind-address", default=DEFAULT_METRICS_ADDRESS,
                   help="host:port serving /metrics, /healthz and /readyz; empty disables "
                   "(default: %(default)s)")
    p.add_argument("--hook-timeout", default=str(DEFAULT_HOOK_TIMEOUT),
                   help="default time a plugin has to answer one hook call, e.g. 5s or 500ms; "
                   "a registration's timeout-seconds overrides it (default: 5s)")
    p.add_argument("--data-plane", default=DataPlane.AUTO.value, choices=[d.value for d in DataPlane],
                   help="haproxy: HAProxy serves the socket and sends only the hooked lifecycle calls "
                   "to Python; python: Python serves every call; auto: haproxy when the haproxy "
                   "binary is on PATH, else python (default: %(default)s)")
    p.add_argument("--data-plane-start-timeout", default=f"{DEFAULT_DATA_PLANE_START_TIMEOUT:g}s",
                   help="time HAProxy has to serve the socket after it starts before the proxy gives up "
                   "and exits 1, e.g. 30s (default: %(default)s)")
    p.add_argument("--data-plane-idle-timeout", default="24h",
                   help="how long a call or stream may carry nothing before the proxy ends it: a quiet "
                   "GetContainerEvents stream then ends with UNAVAILABLE and the client reopens it; "
                   "HAProxy gives other calls (a StopContainer with a long grace period) 10s more; "
                   "from 1s to 596h (default: %(default)s)")
    p.add_argument("--log-level", default=None, type=log_level, metavar="debug|info|warning|error",
                   help="log verbosity, any case (default: info, or debug with --v=4 and above)")
    klog.add_flags(p.add_argument)
    p.add_argument("--version", action=PrintVersion,
                   help="print the version and the upstream version followed, then exit")
    return p


def parse_options(argv: list[str] | None = None) -> Options:
    """Parses and validates; raises OptionError naming the bad flag."""
    ns = build_parser().parse_args(argv)
    try:
        mode = BackendMode(ns.backend_runtime_mode)
    except ValueError:
        raise OptionError(f"--backend-runtime-mode: expected Containerd or Docker, "
                          f"got {ns.backend_runtime_mode!r}") from None
    default_runtime = DEFAULT_DOCKER_ENDPOINT if mode is BackendMode.DOCKER else DEFAULT_RUNTIME_ENDPOINT
    runtime = unix_socket_path(ns.remote_runtime_service_endpoint or default_runtime,
                               "--remote-runtime-service-endpoint")
    image = runtime
    if ns.remote_image_service_endpoint is not None and mode is BackendMode.DOCKER:
        raise OptionError("--remote-image-service-endpoint: has no meaning with --backend-runtime-mode=Docker "
                          "(dockerd serves images on its one socket); remove it")
    if ns.data_plane == DataPlane.HAPROXY and mode is BackendMode.DOCKER:
        raise OptionError("--data-plane=haproxy: Docker mode serves the Docker API from Python only; "
                          "use auto or python")
    if ns.remote_image_service_endpoint:
        image = unix_socket_path(ns.remote_image_service_endpoint, "--remote-image-service-endpoint")
    if not ns.runtime_hook_server_key:
        raise OptionError("--runtime-hook-server-key: must not be empty")
    return Options(
        proxy_endpoint=unix_socket_path(ns.koord_runtimeproxy_endpoint, "--koord-runtimeproxy-endpoint"),
        runtime_endpoint=runtime,
        image_endpoint=image,
        backend_mode=mode,
        skip_key=ns.runtime_hook_server_key,
        skip_val=ns.runtime_hook_server_val,
        hook_config_dir=Path(ns.runtime_hook_config_dir),
        metrics_address=check_bind_address(ns.metrics_bind_address, "--metrics-bind-address"),
        hook_timeout=parse_duration(ns.hook_timeout, "--hook-timeout"),
        log_level=ns.log_level,
        verbosity=ns.v,
        logging_format=ns.logging_format,
        data_plane=DataPlane(ns.data_plane),
        data_plane_start_timeout=parse_duration(ns.data_plane_start_timeout, "--data-plane-start-timeout"),
        data_plane_idle_timeout=_idle_timeout(ns.data_plane_idle_timeout),
    )


def _idle_timeout(value: str) -> float:
    seconds = parse_duration(value, "--data-plane-idle-timeout")
    if seconds < 1 or seconds > MAX_DATA_PLANE_IDLE_TIMEOUT:
        raise OptionError(f"--data-plane-idle-timeout: must be from 1s to 596h (HAProxy's limit), got {value!r}")
    return seconds
