"""The prerm's kubelet check: which kubelet files still point kubelet at the proxy's socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.debian import kubeletcheck
from koord.debian.kubeletcheck import Unreadable, endpoint_in_config, endpoints_in_flags, findings, names_socket

PROXY = "/var/run/koord-runtimeproxy/runtimeproxy.sock"
CONTAINERD = "unix:///run/containerd/containerd.sock"


@pytest.mark.parametrize(("text", "expected"), [
    (f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix://{PROXY} --pod-infra-container-image=x"',
     [f"unix://{PROXY}"]),
    (f"KUBELET_EXTRA_ARGS=--container-runtime-endpoint {PROXY}", [PROXY]),
    ("Environment=\"KUBELET_EXTRA_ARGS=--container-runtime-endpoint='unix:///run/x.sock'\"", ["unix:///run/x.sock"]),
    ("ExecStart=/usr/bin/kubelet \\\n  --container-runtime-endpoint=unix:///a.sock \\\n  --v=2", ["unix:///a.sock"]),
    ("# --container-runtime=remote only", []),
    ("", []),
])
def test_endpoints_in_flag_files(text, expected):
    assert endpoints_in_flags(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    (f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix://{PROXY}\n", f"unix://{PROXY}"),
    ("kind: KubeletConfiguration\n", None),
    ("", None),
])
def test_endpoint_in_config(text, expected):
    assert endpoint_in_config(text, "/c.yaml") == expected


@pytest.mark.parametrize(("text", "why"), [
    ("- a list", "not a KubeletConfiguration mapping"),
    ("containerRuntimeEndpoint: [1]", "containerRuntimeEndpoint is not a string"),
    ("a: [unclosed", "not YAML"),
])
def test_bad_config_is_named(text, why):
    with pytest.raises(Unreadable, match=f"^/c.yaml: {why}"):
        endpoint_in_config(text, "/c.yaml")


@pytest.mark.parametrize(("endpoint", "same"), [
    (f"unix://{PROXY}", True),
    (PROXY, True),
    ("unix:///run/koord-runtimeproxy/runtimeproxy.sock", True),
    ("unix:///run/koord-runtimeproxy//./runtimeproxy.sock", True),
    (CONTAINERD, False),
    ("unix:///var/run/koord-runtimeproxy/runtimeproxy.sock.bak", False),
])
def test_names_socket(endpoint, same):
    assert names_socket(endpoint, PROXY) is same


@given(st.text(max_size=300))
def test_any_flags_text_gives_endpoints_without_blanks(text):
    for endpoint in endpoints_in_flags(text):
        assert endpoint and not any(c.isspace() or c in "\"'" for c in endpoint)


@given(st.text(max_size=300))
def test_any_config_text_is_an_endpoint_none_or_a_named_error(text):
    try:
        got = endpoint_in_config(text, "/c.yaml")
    except Unreadable as err:
        assert str(err).startswith("/c.yaml: ")
    else:
        assert got is None or isinstance(got, str)


def write(root: Path, name: str, text: str) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


@pytest.mark.parametrize(("files", "expected"), [
    ({"var/lib/kubelet/kubeadm-flags.env": f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix://{PROXY}"'},
     [("/var/lib/kubelet/kubeadm-flags.env", f"unix://{PROXY}")]),
    ({"etc/default/kubelet": f"KUBELET_EXTRA_ARGS=--container-runtime-endpoint={CONTAINERD}"}, []),
    ({"etc/systemd/system/kubelet.service.d/20-proxy.conf":
      f'[Service]\nEnvironment="KUBELET_EXTRA_ARGS=--container-runtime-endpoint={PROXY}"\n',
      "etc/systemd/system/kubelet.service.d/10-kubeadm.conf": "[Service]\n"},
     [("/etc/systemd/system/kubelet.service.d/20-proxy.conf", PROXY)]),
    ({"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: unix:///run/koord-runtimeproxy/runtimeproxy.sock\n"},
     [("/var/lib/kubelet/config.yaml", "unix:///run/koord-runtimeproxy/runtimeproxy.sock")]),
    ({"var/lib/kubelet/config.yaml": "- not a mapping\n"},
     [("/var/lib/kubelet/config.yaml: not a KubeletConfiguration mapping", "")]),
    ({}, []),
])
def test_findings_under_a_root(tmp_path, files, expected):
    for name, text in files.items():
        write(tmp_path, name, text)
    assert list(findings(tmp_path, PROXY)) == expected


def test_main_prints_the_steps_and_succeeds(tmp_path, capsys):
    write(tmp_path, "var/lib/kubelet/kubeadm-flags.env", f"KUBELET_KUBEADM_ARGS=--container-runtime-endpoint={PROXY}")
    assert kubeletcheck.main(["--root", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"/var/lib/kubelet/kubeadm-flags.env: {PROXY}" in err
    assert "systemctl restart kubelet" in err and "The removal goes on" in err


def test_main_is_silent_when_kubelet_uses_the_runtime(tmp_path, capsys):
    write(tmp_path, "var/lib/kubelet/kubeadm-flags.env",
          f"KUBELET_KUBEADM_ARGS=--container-runtime-endpoint={CONTAINERD}")
    assert kubeletcheck.main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr() == ("", "")


def test_a_file_that_is_not_text_is_named_and_the_others_still_checked(tmp_path):
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/kubelet").write_bytes(b"\xff\xfe--container")
    write(tmp_path, "var/lib/kubelet/config.yaml", f"containerRuntimeEndpoint: {PROXY}\n")
    got = list(findings(tmp_path, PROXY))
    assert got[0][0].startswith("/etc/default/kubelet: UnicodeDecodeError") and got[0][1] == ""
    assert got[1:] == [("/var/lib/kubelet/config.yaml", PROXY)]
