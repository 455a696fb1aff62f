"""An NRI plugin built with koord.pluginsdk.nri: marks every container it sees created.

Each new container gets the env var ``KOORD_NRI_POD=<pod name>`` and the annotation
``koord.sh/nri-plugin=<plugin name>``. Runs against any NRI-enabled runtime (containerd
2.x has NRI on by default, its socket at /var/run/nri/nri.sock)::

    sudo .venv/bin/python examples/nri_env_plugin.py [--socket PATH]
"""

from __future__ import annotations

import argparse
import logging

from koord.pluginsdk.nri import DEFAULT_SOCKET_PATH, NriPlugin, api

ENV_NAME = "KOORD_NRI_POD"
ANNOTATION = "koord.sh/nri-plugin"


def build(socket_path: str = DEFAULT_SOCKET_PATH, name: str = "koord-env") -> NriPlugin:
    plugin = NriPlugin(name, index="50", socket_path=socket_path)

    @plugin.create_container
    def mark(pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        adjust = api.ContainerAdjustment()
        adjust.env.add(key=ENV_NAME, value=pod.name)
        adjust.annotations[ANNOTATION] = name
        return adjust

    return plugin


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=DEFAULT_SOCKET_PATH, help="the runtime's NRI socket")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    build(parser.parse_args().socket).serve()
