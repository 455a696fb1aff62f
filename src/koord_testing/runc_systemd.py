"""runc as containerd's systemd cgroup driver drives it, for machines where systemd does not run.

With ``SystemdCgroup = true`` containerd names a container's cgroup ``<pod slice>:cri-containerd:<id>``
and passes ``--systemd-cgroup``, and runc asks systemd to create the slice and scope units.
The cgroup v2 test guest (and many CI machines) have no systemd, so the test containerd runs
this program as its runc binary instead: it drops ``--systemd-cgroup`` and rewrites the bundle's
``linux.cgroupsPath`` to the directory systemd would have made,
``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope``,
before it execs the real runc with the cgroupfs driver. Pods then sit exactly where kubelet's
systemd driver puts them, which is what koordlet has to find.

Run as ``python -m koord_testing.runc_systemd <real runc> <runc arguments...>``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from koord_testing.cgroups import systemd_slice_path

SYSTEMD_FLAG = "--systemd-cgroup"


def scope_path(cgroups_path: str) -> str:
    """``slice:prefix:name`` as the cgroupfs path systemd creates; other paths unchanged."""
    parts = cgroups_path.split(":")
    if len(parts) != 3 or not parts[0].endswith(".slice"):
        return cgroups_path
    slice_name, prefix, name = parts
    return f"/{systemd_slice_path(slice_name)}/{prefix}-{name}.scope"


def bundle_of(args: list[str]) -> Path | None:
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return None


def rewrite_bundle(bundle: Path) -> None:
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    linux = config.get("linux") or {}
    path = linux.get("cgroupsPath", "")
    new = scope_path(path)
    if new != path:
        linux["cgroupsPath"] = new
        config_path.write_text(json.dumps(config))


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m koord_testing.runc_systemd <real runc> <runc arguments...>")
    real, args = argv[1], [a for a in argv[2:] if a != SYSTEMD_FLAG]
    if "create" in args or "run" in args:
        bundle = bundle_of(args)
        if bundle is not None:
            rewrite_bundle(bundle)
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv)
