"""A third-party runtime plugin built with koord.pluginsdk: tells containers which GPUs they got.

The scheduler records the GPUs allocated to a pod in the annotation
``scheduling.koordinator.sh/device-allocated`` (``{"gpu":[{"minor":0},{"minor":1}]}``);
the NVIDIA container runtime reads ``NVIDIA_VISIBLE_DEVICES``.

    python examples/gpu_env_plugin.py --endpoint /run/gpu-env.sock --config-dir /etc/runtime/hookserver.d
"""

import argparse
import json

from koord.pluginsdk import ContainerRequest, ContainerResponse, RuntimePluginServer

DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--endpoint", default="/run/gpu-env.sock")
parser.add_argument("--config-dir", default="/etc/runtime/hookserver.d")
args = parser.parse_args()

plugin = RuntimePluginServer("gpu-env", endpoint=args.endpoint, failure_policy="Ignore")


@plugin.pre_create_container
def inject_visible_devices(req: ContainerRequest) -> ContainerResponse | None:
    allocated = json.loads(req.pod_annotations.get(DEVICE_ALLOCATED) or "{}")
    minors = [str(gpu["minor"]) for gpu in allocated.get("gpu", [])]
    if not minors:
        return None
    return ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(minors)})


plugin.serve(config_dir=args.config_dir)
