"""deploy/ against upstream's manifests (kept in tests/data/upstream-manifests/ with their
commits): applied over an upstream install, our objects replace upstream's in place, select
the same pods, run the same command and arguments with the same host mounts, and ask the API
server for no permission upstream's koordlet-role does not grant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "data" / "upstream-manifests"

LEFT_OUT_VOLUMES = {
    # name -> why our DaemonSet does not mount it
    "pod-resources-proxy": "the kubelet pod-resources proxy (upstream's PodResourcesProxy gate) is not built here",
    "xpu-device-infos": "accelerator device reports (xpu) are not built here",
    "host-vgpu-containers": "vGPU containers' directory (Accelerators with HAMi) is not built here",
}


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str) -> dict[str, Any]:
    found = [d for d in docs(path) if d["kind"] == kind]
    assert len(found) == 1, f"{path.name}: {len(found)} {kind}s"
    return found[0]


OURS = ROOT / "deploy" / "koordlet.yaml"
CHART = UPSTREAM / "chart-v1.8.0-koordlet.yaml"
MANAGER = UPSTREAM / "manager-koordlet.yaml"


def pod_spec(path: Path) -> dict[str, Any]:
    return one(path, "DaemonSet")["spec"]["template"]["spec"]


def container(path: Path) -> dict[str, Any]:
    return pod_spec(path)["containers"][0]


@pytest.mark.parametrize("upstream", [CHART, MANAGER], ids=["chart", "config-manager"])
def test_the_daemonset_selects_and_labels_as_upstreams(upstream: Path) -> None:
    ours, theirs = one(OURS, "DaemonSet"), one(upstream, "DaemonSet")
    assert ours["metadata"]["name"] == theirs["metadata"]["name"] == "koordlet"
    assert ours["metadata"]["labels"] == theirs["metadata"]["labels"]
    assert ours["spec"]["selector"] == theirs["spec"]["selector"] == {"matchLabels": {"koord-app": "koordlet"}}
    assert ours["spec"]["template"]["metadata"]["labels"] == theirs["spec"]["template"]["metadata"]["labels"]
    assert ours["spec"]["updateStrategy"] == theirs["spec"]["updateStrategy"]
    for key in ("hostNetwork", "hostPID", "serviceAccountName", "tolerations", "terminationGracePeriodSeconds"):
        assert pod_spec(OURS)[key] == pod_spec(upstream)[key], key


def test_min_ready_seconds_command_args_and_security_are_the_charts() -> None:
    assert one(OURS, "DaemonSet")["spec"]["minReadySeconds"] == one(CHART, "DaemonSet")["spec"]["minReadySeconds"]
    ours, chart = container(OURS), container(CHART)
    for key in ("name", "command", "args", "env", "securityContext"):
        assert ours[key] == chart[key], key
    assert container(MANAGER)["command"] == ["/koordlet"]


def _mounts(path: Path) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(path)["volumeMounts"]}


def _volumes(path: Path) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(path)["volumes"]}


def test_every_mount_is_the_charts_and_only_unbuilt_features_are_left_out() -> None:
    ours, chart = _mounts(OURS), _mounts(CHART)
    assert set(chart) - set(ours) == set(LEFT_OUT_VOLUMES)
    assert set(ours) <= set(chart), f"mounts upstream's chart does not have: {sorted(set(ours) - set(chart))}"
    for name, mount in ours.items():
        assert mount == chart[name], name
    ours_v, chart_v = _volumes(OURS), _volumes(CHART)
    assert set(ours_v) == set(ours)
    for name, volume in ours_v.items():
        assert volume == chart_v[name], name


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def _granted_by(grants: set[tuple[str, str, str]], group: str, resource: str, verb: str) -> bool:
    return any(g == group and r in (resource, "*") and v in (verb, "*") for g, r, v in grants)


def test_rbac_has_upstreams_names_and_asks_for_nothing_upstream_does_not_grant() -> None:
    rbac = UPSTREAM / "rbac-koordlet.yaml"
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert one(OURS, kind)["metadata"]["name"] == one(rbac, kind)["metadata"]["name"], kind
    assert one(OURS, "ClusterRoleBinding")["roleRef"] == one(rbac, "ClusterRoleBinding")["roleRef"]
    upstream = _grants(one(rbac, "ClusterRole"))
    extra = sorted(g for g in _grants(one(OURS, "ClusterRole")) if not _granted_by(upstream, *g))
    assert not extra, f"permissions upstream's koordlet-role does not grant: {extra}"


def test_rbac_check_can_fail() -> None:
    upstream = _grants(one(UPSTREAM / "rbac-koordlet.yaml", "ClusterRole"))
    assert _granted_by(upstream, "slo.koordinator.sh", "nodemetrics", "create")
    assert not _granted_by(upstream, "", "secrets", "get")


@pytest.mark.parametrize("kind", ["Service", "ServiceMonitor"])
def test_the_optional_service_and_monitor_are_the_charts(kind: str) -> None:
    ours = one(ROOT / "deploy" / "koordlet-servicemonitor.yaml", kind)
    chart = one(UPSTREAM / f"chart-v1.8.0-koordlet-{kind.lower()}.yaml", kind)
    assert ours == chart
    port = container(OURS)["ports"][0]
    if kind == "Service":
        assert ours["spec"]["ports"][0]["targetPort"] == port["containerPort"]
    else:
        assert ours["spec"]["endpoints"][0]["port"] == port["name"]
