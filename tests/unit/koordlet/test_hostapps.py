"""NodeSLO host applications: their cgroup dirs (upstream's GetHostAppCgroupRelativePath
table), hostile entries, and CPUSetAllocator's cpuset for them through the reconciler."""

from __future__ import annotations

import pytest

from koord.hookapi import FailurePolicy, parse_cpuset
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import KubeQoS
from koord.koordlet.runtimehooks.hooks import Hooks, PluginEnv
from koord.koordlet.runtimehooks.hostapps import HOST_APPS
from koord.koordlet.runtimehooks.plugins import parse_rules
from koord.koordlet.runtimehooks.plugins.cpuset import CPUSetAllocator
from koord.koordlet.runtimehooks.reconciler import Reconciler
from koord.koordlet.runtimehooks.rule import RuleError
from koord.koordlet.slo import HostApp, parse_host_apps
from koord_testing.cgroupfs import make_fake_v1_cgroup

POOLS = {"node.koordinator.sh/cpu-shared-pools":
         '[{"socket":0,"node":0,"cpuset":"0-1"},{"socket":0,"node":1,"cpuset":"4-5"}]'}


def slo(*apps: dict) -> dict:
    return {"spec": {"hostApplications": list(apps)}}


@pytest.mark.parametrize("app, want", [
    ({"name": "nginx", "qos": "LS"}, HostApp("nginx", "LS", None, "host-latency-sensitive/nginx")),
    ({"name": "nginx", "qos": "LSR"}, HostApp("nginx", "LSR", None, "host-latency-sensitive/nginx")),
    ({"name": "nginx", "qos": "BE"}, HostApp("nginx", "BE", None, "host-best-effort/nginx")),
    ({"name": "nginx"}, HostApp("nginx", "", None, "nginx")),
    ({"name": "nginx", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "parentDir": "test-ls/",
                                                   "relativePath": "nginx/"}},
     HostApp("nginx", "LS", None, "test-ls/nginx")),
    ({"name": "nginx", "qos": "LS", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "nginx"}},
     HostApp("nginx", "LS", KubeQoS.BESTEFFORT, "nginx")),
    ({"name": "nginx", "qos": "LS", "cgroupPath": {"base": "Kubepods", "parentDir": "a/b"}},
     HostApp("nginx", "LS", KubeQoS.GUARANTEED, "a/b")),
])
def test_host_app_cgroup_dir(app: dict, want: HostApp) -> None:
    assert parse_host_apps(slo(app)["spec"]) == (want,)
    assert parse_rules(slo(app), None)[HOST_APPS] == (want,)


@pytest.mark.parametrize("apps, field", [
    ("nginx", "spec.hostApplications: want a list"),
    ([3], r"hostApplications\[0\]: want an object"),
    ([{"qos": "LS"}], r"hostApplications\[0\]\.name"),
    ([{"name": "../etc"}], r"hostApplications\[0\]\.name"),
    ([{"name": "a/b"}], r"hostApplications\[0\]\.name"),
    ([{"name": "ok"}, {"name": "x", "qos": 3}], r"hostApplications\[1\]\.qos"),
    ([{"name": "x", "cgroupPath": "root"}], r"hostApplications\[0\]\.cgroupPath: want an object"),
    ([{"name": "x", "cgroupPath": {"base": "Host"}}], r"cgroupPath\.base"),
    ([{"name": "x", "cgroupPath": {"parentDir": "../../etc"}}], r"cgroupPath\.parentDir"),
    ([{"name": "x", "cgroupPath": {"relativePath": 7}}], r"cgroupPath\.relativePath"),
    ([{"name": "x", "cgroupPath": {}}], "names the cgroup root itself"),
])
def test_bad_host_applications_name_the_field(apps: object, field: str) -> None:
    with pytest.raises(RuleError, match=field):
        parse_rules({"spec": {"hostApplications": apps}}, None)


@pytest.mark.parametrize("qos, want", [
    # upstream's getHostAppCpuset: LS gets every share pool; other classes are left alone
    ("LS", "0-1,4-5"),
    ("LSR", None),
    ("BE", None),
])
def test_reconciler_gives_ls_host_apps_the_share_pools(fake_cri, tmp_path, qos: str, want: str | None) -> None:
    rel = "host-latency-sensitive/nginx" if qos != "BE" else "host-best-effort/nginx"
    make_fake_v1_cgroup(tmp_path, rel)
    (tmp_path / "cpuset" / rel / "cpuset.cpus").write_text("0-7\n")
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    plugin = CPUSetAllocator(PluginEnv(executor, tmp_path, tmp_path))
    plugin.update_rules(parse_rules(slo({"name": "nginx", "qos": qos}), {"metadata": {"annotations": POOLS}}))
    hooks = Hooks(FailurePolicy.IGNORE)
    plugin.register(hooks)
    report = Reconciler(hooks, executor, [plugin], fake_cri.endpoint, interval=3600).reconcile_once()
    assert report.errors == []
    cpus = (tmp_path / "cpuset" / rel / "cpuset.cpus").read_text()
    assert parse_cpuset(cpus) == parse_cpuset(want or "0-7")
    assert (f"{rel}:cpuset_cpus" in report.written) == (want is not None)


def test_missing_host_app_cgroup_is_skipped(fake_cri, tmp_path) -> None:
    make_fake_v1_cgroup(tmp_path, "kubepods")
    executor = CgroupExecutor(CgroupLayout(tmp_path, version=1))
    plugin = CPUSetAllocator(PluginEnv(executor, tmp_path, tmp_path))
    plugin.update_rules(parse_rules(slo({"name": "nginx", "qos": "LS"}), {"metadata": {"annotations": POOLS}}))
    hooks = Hooks(FailurePolicy.IGNORE)
    plugin.register(hooks)
    report = Reconciler(hooks, executor, [plugin], fake_cri.endpoint, interval=3600).reconcile_once()
    assert report.errors == [] and report.written == []
