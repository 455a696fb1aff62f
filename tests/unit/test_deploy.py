"""deploy/: the manifests are valid Kubernetes objects and every koordlet flag they pass exists."""

import configparser
import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from koord.koordlet import flags

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30.0"


def manifests():
    return [d for d in yaml.safe_load_all((DEPLOY / "koordlet.yaml").read_text()) if d]


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_against_the_kubernetes_schema(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validator_rejects_a_broken_daemonset():
    """The check above can fail: a misspelt field is an error under strict validation."""
    ds = next(d for d in manifests() if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def _daemonset():
    return next(d for d in manifests() if d["kind"] == "DaemonSet")


@pytest.fixture
def node_parser(monkeypatch):
    """koordlet's parser as on the node: the host dirs exist there, not here."""
    monkeypatch.setattr(flags, "existing_dir", Path)
    return flags.build_parser()


def test_daemonset_args_parse_and_point_at_mounted_host_paths(node_parser, monkeypatch):
    """The image sets agent_mode=dsMode: upstream's /host-* defaults, each mounted from the host."""
    monkeypatch.setenv("agent_mode", "dsMode")
    spec = _daemonset()["spec"]["template"]["spec"]
    container = spec["containers"][0]
    args = flags.parse_args(container["args"])
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path", "").rstrip("/") for v in spec["volumes"]}
    expected = {
        args.cgroup_root_dir: "/sys/fs/cgroup", args.sys_fs_root_dir: "/sys/fs", args.sys_root_dir: "/sys",
        Path(args.runtime_hooks_addr).parent: "/var/run/koordlet",
        args.runtime_hooks_config_path: "/etc/runtime/hookserver.d",
        Path(args.containerd_endpoint.removeprefix("unix://")).parent.parent: "/var/run",
        args.var_run_root_dir: "/var/run", args.tsdb_path: "",  # an emptyDir
    }
    for path, host_path in expected.items():
        name = mounts.get(str(path).rstrip("/"))
        assert name is not None, f"{path} is not mounted"
        assert host[name] == host_path, f"{path} is mounted from {host[name]!r}"
    assert args.runtime_hooks_host_endpoint.startswith("/var/run/koordlet/")  # what the proxy dials
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}} \
        in container["env"]
    assert spec["hostPID"] is True and args.proc_root_dir == Path("/proc")


def test_rbac_allows_what_koordlet_calls():
    role = next(d for d in manifests() if d["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    for resource, group in (("nodes", ""), ("nodeslos", "slo.koordinator.sh"),
                            ("nodemetrics", "slo.koordinator.sh")):
        for verb in ("list", "watch"):
            assert (group, resource, verb) in granted
    assert ("slo.koordinator.sh", "nodemetrics/status", "update") in granted


def unit_command(name: str, opts: str = "") -> list[str]:
    """A unit's ExecStart as systemd runs it: ``$KOORDLET_OPTS`` split on whitespace, as systemd
    splits an unbraced variable."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((DEPLOY / name).read_text().replace("\\\n", " "))
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[-1] == "$KOORDLET_OPTS"
    return command[:-1] + opts.split()


def test_systemd_unit_flags_parse(node_parser):
    command = unit_command("koordlet.service")
    assert command[0] == "/usr/bin/koordlet"
    args = node_parser.parse_args(command[1:])
    assert args.node_metric_file == Path("/etc/koordlet/nodemetric.yaml") and args.addr == ":9316"


@pytest.mark.parametrize(("opts", "addr"), [("", ":9316"), ("--addr=:9317", ":9317"),
                                            ("--log-level=debug --addr=:9400", ":9400")])
def test_default_file_flags_come_last_and_win(node_parser, opts, addr):
    """/etc/default/koordlet's KOORDLET_OPTS override the unit's own flags."""
    unit = (DEPLOY / "koordlet.service").read_text()
    assert "EnvironmentFile=-/etc/default/koordlet" in unit
    default = (DEPLOY / "debian" / "koordlet.default").read_text()
    assert re.search(r'^KOORDLET_OPTS=""$', default, re.M), "the shipped default adds no flag"
    assert node_parser.parse_args(unit_command("koordlet.service", opts)[1:]).addr == addr


def _cluster_role():
    return next(d for d in manifests() if d["kind"] == "ClusterRole")


# Every API call koordlet's code makes (kubernetes client method -> permission it needs); a
# new call fails test_every_api_call_of_the_code_is_mapped until it is listed here.
API_CALLS = {
    "list_node": ("", "nodes", "list"),
    "list_cluster_custom_object": ("slo.koordinator.sh", "nodeslos", "list"),
    "replace_cluster_custom_object_status": ("slo.koordinator.sh", "nodemetrics/status", "update"),
    "get_cluster_custom_object": ("topology.node.k8s.io", "noderesourcetopologies", "get"),
    "create_cluster_custom_object": ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    "replace_cluster_custom_object": ("topology.node.k8s.io", "noderesourcetopologies", "update"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "create_namespaced_event": ("", "events", "create"),
}
EXTRA = [  # list-watch of every kind listed, and the kubelet reached through nodes/proxy
    ("", "nodes", "watch"), ("slo.koordinator.sh", "nodeslos", "watch"),
    ("slo.koordinator.sh", "nodemetrics", "list"), ("slo.koordinator.sh", "nodemetrics", "watch"),
    ("", "nodes/proxy", "get"),
]


def test_every_api_call_of_the_code_is_mapped():
    src = Path(__file__).resolve().parents[2] / "src" / "koord" / "koordlet"
    called = set()
    for path in src.rglob("*.py"):
        called |= set(re.findall(r"\.(list_node|[a-z_]*custom_object[a-z_]*|create_namespaced_pod_eviction"
                                 r"|create_namespaced_event)\b", path.read_text()))
    assert called == set(API_CALLS)


def test_rbac_grants_every_call_and_upstreams_reference_permissions():
    from koord_testing import rbac

    upstream = [("", "pods/eviction", "create"), ("", "nodes/proxy", "get"), ("", "nodes", "get"),
                ("", "nodes/status", "patch"), ("slo.koordinator.sh", "nodeslos", "get"),
                ("slo.koordinator.sh", "nodemetrics", "create"), ("slo.koordinator.sh", "nodemetrics", "update"),
                ("slo.koordinator.sh", "nodemetrics/status", "patch"),
                ("topology.node.k8s.io", "noderesourcetopologies", "patch")]
    assert rbac.missing([*API_CALLS.values(), *EXTRA, *upstream], _cluster_role()) == []
    assert rbac.missing([("", "secrets", "get")], _cluster_role()) == [("", "secrets", "get")]


def test_namespace_skip_label_and_sys_fs_mount(monkeypatch):
    docs = manifests()
    assert {"kind": "Namespace", "name": "koordinator-system"} in [
        {"kind": d["kind"], "name": d["metadata"]["name"]} for d in docs]
    template = _daemonset()["spec"]["template"]
    assert template["metadata"]["labels"]["runtimeproxy.koordinator.sh/skip-hookserver"] == "true"
    container = template["spec"]["containers"][0]
    monkeypatch.setenv("agent_mode", "dsMode")
    monkeypatch.setattr(flags, "existing_dir", Path)
    args = flags.parse_args(container["args"])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"].rstrip("/") == str(args.sys_fs_root_dir)]
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"].rstrip("/") == "/sys/fs" and not mount.get("readOnly")  # resctrl


EXAMPLES = DEPLOY.parent / "examples" / "koordlet"


def test_systemd_unit_reads_the_example_input_files(node_parser):
    """The package installs examples/koordlet/*.yaml where koordlet.service looks for them."""
    args = node_parser.parse_args(unit_command("koordlet.service")[1:])
    named = {args.node_file, args.node_slo_file, args.node_metric_file}
    assert {p.parent for p in named} == {Path("/etc/koordlet")}
    assert {p.name for p in named} == {p.name for p in EXAMPLES.glob("*.yaml")}


def test_example_input_files_are_what_koordlet_accepts():
    """Each example goes through the readers koordlet uses for it; a typo in a field is an error here."""
    from koord.koordlet import slo
    from koord.koordlet.qosmanager import nodeinfo
    from koord.koordlet.runtimehooks.plugins import parse_rules
    from koord.koordlet.statesinformer.objects import load_object_file
    from koord.koordlet.statesinformer.specs import merged_node_slo, node_metric_collect_policy

    node = load_object_file(EXAMPLES / "node.yaml", "Node")
    node_slo = load_object_file(EXAMPLES / "nodeslo.yaml", "NodeSLO")
    node_metric = load_object_file(EXAMPLES / "nodemetric.yaml", "NodeMetric")
    kubernetes_validate.validate(node, K8S_VERSION, strict=True)
    assert nodeinfo.capacity_milli_cpu(node) == 4000 and nodeinfo.capacity_memory(node) == 8 << 30
    thresholds = slo.threshold_config(merged_node_slo(node_slo))
    assert thresholds is not None and thresholds.enable is False
    assert thresholds.cpu_suppress_threshold_percent == 65 and thresholds.memory_evict_threshold_percent == 70
    parse_rules(merged_node_slo(node_slo), node)
    policy = node_metric_collect_policy(node_metric)
    assert policy["reportIntervalSeconds"] == 60 and policy["aggregateDurationSeconds"] == 300
    assert {o["metadata"]["name"] for o in (node, node_slo, node_metric)} == {"node-1"}
