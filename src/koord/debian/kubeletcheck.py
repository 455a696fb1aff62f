"""Run by the package's prerm on removal: does kubelet still talk to the proxy's socket?

Removing the package stops koord-runtime-proxy; a kubelet whose container runtime endpoint is
the proxy's socket then loses its runtime (no pod starts or stops, the node goes NotReady).
kubelet's flags live where Debian and kubeadm nodes keep them; each file that names the proxy's
socket is reported with the steps that point kubelet back at the runtime. The check only
prints: a prerm that failed would leave the package half-removed and block every later apt
run, while the message tells the administrator what to do (and the same steps undo it after
the fact).
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from koord.runtimeproxy.config import DEFAULT_PROXY_ENDPOINT

FLAG_FILES = ("var/lib/kubelet/kubeadm-flags.env", "etc/default/kubelet")
DROPIN_DIRS = ("etc/systemd/system/kubelet.service.d", "usr/lib/systemd/system/kubelet.service.d",
               "lib/systemd/system/kubelet.service.d")
CONFIG_FILE = "var/lib/kubelet/config.yaml"
MAX_BYTES = 1 << 20
"""Far above any real kubelet flags or config file; a larger one is not read."""

# The flag as a shell line, a unit's ExecStart or an Environment= value writes it:
# --container-runtime-endpoint=VALUE or --container-runtime-endpoint VALUE, maybe quoted.
FLAG = re.compile(r"""--container-runtime-endpoint(?:=|\s+)["']?([^\s"'\\]+)""")


class Unreadable(ValueError):
    """A kubelet file that exists but cannot be read or parsed; says which and why."""


def endpoints_in_flags(text: str) -> list[str]:
    """Every ``--container-runtime-endpoint`` value in a flags file or a unit drop-in."""
    return FLAG.findall(text)


def endpoint_in_config(text: str, name: str) -> str | None:
    """KubeletConfiguration's ``containerRuntimeEndpoint``; None when the file does not set it."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise Unreadable(f"{name}: not YAML ({err.__class__.__name__})") from None
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise Unreadable(f"{name}: not a KubeletConfiguration mapping")
    value = doc.get("containerRuntimeEndpoint")
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unreadable(f"{name}: containerRuntimeEndpoint is not a string")
    return value


def names_socket(endpoint: str, socket: str) -> bool:
    """``endpoint`` (``unix://PATH`` or a bare path) is ``socket``, /var/run being /run."""

    def canonical(path: str) -> str:
        path = posixpath.normpath(path.removeprefix("unix://"))
        return "/run" + path.removeprefix("/var/run") if path.startswith("/var/run/") else path

    return canonical(endpoint) == canonical(socket)


def _read(path: Path, name: str) -> str | None:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise Unreadable(f"{name}: larger than {MAX_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise Unreadable(f"{name}: {err.__class__.__name__}: {err}") from None


def findings(root: Path, socket: str) -> Iterator[tuple[str, str]]:
    """``(file, endpoint)`` for each kubelet file under ``root`` naming ``socket``, and
    ``(file, "")`` for a file that could not be read (the check then cannot tell)."""
    flag_files = [*FLAG_FILES, *(f"{d}/{p.name}" for d in DROPIN_DIRS
                                 for p in sorted((root / d).glob("*.conf")))]
    for name in [*flag_files, CONFIG_FILE]:
        try:
            text = _read(root / name, "/" + name)
            if text is None:
                continue
            found = [endpoint_in_config(text, "/" + name)] if name == CONFIG_FILE else endpoints_in_flags(text)
        except Unreadable as err:
            yield str(err), ""
            continue
        for endpoint in found:
            if endpoint is not None and names_socket(endpoint, socket):
                yield "/" + name, endpoint


def steps(found: Sequence[tuple[str, str]], socket: str) -> str:
    """What the administrator reads: which files point kubelet at the proxy, and how to undo it."""
    named = [f"  {name}: {endpoint}" for name, endpoint in found if endpoint]
    unreadable = [f"  {name}" for name, endpoint in found if not endpoint]
    lines = []
    if named:
        lines += [f"koord-runtime: kubelet's container runtime endpoint is still the proxy's socket ({socket}):",
                  *named,
                  "Removing the package stops koord-runtime-proxy, and kubelet loses its container runtime.",
                  "Point kubelet back at the runtime now:",
                  "  1. in each file above, set the endpoint to the runtime's own socket, e.g.",
                  "     --container-runtime-endpoint=unix:///run/containerd/containerd.sock",
                  "     (config.yaml: containerRuntimeEndpoint: unix:///run/containerd/containerd.sock)",
                  "  2. systemctl daemon-reload && systemctl restart kubelet",
                  "  3. crictl --runtime-endpoint unix:///run/containerd/containerd.sock ps   # pods still listed",
                  "The removal goes on; running containers are not touched."]
    if unreadable:
        lines += ["koord-runtime: could not check these kubelet files for the proxy's socket:", *unreadable]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koord.debian.kubeletcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/"), help="the root dpkg works on ($DPKG_ROOT)")
    parser.add_argument("--socket", default=DEFAULT_PROXY_ENDPOINT, help="the proxy's socket")
    args = parser.parse_args(argv)
    message = steps(list(findings(args.root, args.socket)), args.socket)
    if message:
        print(message, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
