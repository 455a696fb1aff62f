"""Each flag's default is stated once: the configs built from koordlet's command line with no
flags equal the configs built with no arguments, so a default restated in a dataclass, a flag
or a fallback that drifts from the other fails here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from koord.koordlet import flags, metricsadvisor
from koord.koordlet.cgrouplayout import CgroupLayout
from koord.koordlet.prediction import PredictionConfig
from koord.koordlet.qosmanager import QOSConfig


def _place(layout: CgroupLayout) -> tuple[object, str]:
    return layout.root, layout.kube_dir


CONFIGS: dict[str, tuple[Callable[[argparse.Namespace], Any], Callable[[], Any]]] = {
    "metrics advisor": (metricsadvisor.from_args, metricsadvisor.AdvisorConfig),
    "QoS manager": (QOSConfig.from_args, QOSConfig),
    "prediction": (PredictionConfig.from_args, PredictionConfig),
    "cgroup layout": (lambda a: _place(CgroupLayout.from_args(a)), lambda: _place(CgroupLayout())),
}


@pytest.mark.parametrize("from_args, built", CONFIGS.values(), ids=CONFIGS.keys())
def test_no_flags_give_the_configs_defaults(monkeypatch: pytest.MonkeyPatch, from_args: Callable[
        [argparse.Namespace], Any], built: Callable[[], Any]) -> None:
    monkeypatch.delenv("agent_mode", raising=False)  # the DaemonSet's defaults are other paths
    assert from_args(flags.build_parser().parse_args([])) == built()
