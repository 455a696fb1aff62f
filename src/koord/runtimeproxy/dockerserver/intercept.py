"""The interception path of Docker mode: which Docker API calls hooks ride on, and what each does.

Each handler reads top to bottom like its CRI counterpart in ``criserver``: build the hook
request (``dockerjson``) -> Pre hooks (``RuntimeDispatcher``, same plugins, order, timeouts,
failure policy and merge rules) -> forward to dockerd -> store -> Post hooks.  When no
plugin changed anything the client's own body is forwarded unchanged.

| call | hook points |
|---|---|
| ``POST /containers/create`` of a sandbox | PreRunPodSandbox |
| ``POST /containers/create`` of a container | PreCreateContainer |
| ``POST /containers/{id}/start`` | PreStartContainer (resources via ``/update``), PostStartContainer |
| ``POST /containers/{id}/update`` | PreUpdateContainerResources |
| ``POST /containers/{id}/stop`` | PostStopContainer or PostStopPodSandbox |
| ``DELETE /containers/{id}`` | (the store record is removed) |

``{id}`` is what docker clients send: a full id, a unique prefix or a name.  Containers
Kubernetes did not make (no ``io.kubernetes.docker.type`` label) pass without hooks.

The store is the containerd mode's: pods keyed by sandbox id, containers by container id.
It is rebuilt from dockerd's containers and labels at start (``rebuild``) and filled on
demand (``_lookup``) for containers created behind the proxy's back.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote

from koord.apis.runtime.v1alpha1 import api_pb2 as hook
from koord.hookapi import ContainerHookRequest, HookPoint, PodHookRequest
from koord.hookapi.fromcri import container_hook_request

from ..dispatcher import RuntimeDispatcher, Target
from ..store import ContainerRecord, Store
from . import dockerjson as dj
from .backend import BackendError, DockerBackend
from .server import DockerCall, Handler, Reply

log = logging.getLogger(__name__)

_VERSION_PREFIX = re.compile(rb"^/v[0-9]{1,3}(\.[0-9]{1,3})?(?=/)")
_CONTAINER_CALL = re.compile(rb"^/containers/([^/?]+)(?:/(start|update|stop))?$")
_LIST_FILTER = '{"label":["io.kubernetes.docker.type"]}'


def split_target(target: bytes) -> tuple[bytes, bytes]:
    """(path without the ``/vX.Y`` prefix, query) of a request target."""
    path, _, query = target.partition(b"?")
    return _VERSION_PREFIX.sub(b"", path, count=1), query


class Interceptor:
    def __init__(self, backend: DockerBackend, store: Store, dispatcher: RuntimeDispatcher,
                 skip_label: tuple[str, str]) -> None:
        self.backend = backend
        self.store = store
        self.dispatcher = dispatcher
        self.skip_key, self.skip_val = skip_label
        self._names: dict[str, str] = {}
        """Container name (without ``/``) -> id, for the records in the store."""

    # ------------------------------------------------------------ routing

    def route(self, method: bytes, target: bytes) -> Handler | None:
        """The handler for a lifecycle call; None (relayed as it streams) for everything else.

        start and stop are only intercepted when a plugin wants their hooks: without one
        they change nothing the store keeps.
        """
        if method not in (b"POST", b"DELETE"):
            return None
        path, query = split_target(target)
        if method == b"POST" and path == b"/containers/create":
            return lambda call: self.create(call, _query_value(query, "name"))
        match = _CONTAINER_CALL.match(path)
        if match is None or match.group(1) == b"create":
            return None
        ref = unquote(match.group(1).decode("utf-8", "replace"))
        action = match.group(2)
        if method == b"DELETE":
            return None if action else (lambda call: self.delete(call, ref))
        if action == b"start" and self.dispatcher.has_plugins(HookPoint.PRE_START_CONTAINER,
                                                              HookPoint.POST_START_CONTAINER):
            return lambda call: self.start(call, ref)
        if action == b"update":
            return lambda call: self.update(call, ref)
        if action == b"stop" and self.dispatcher.has_plugins(HookPoint.POST_STOP_CONTAINER,
                                                             HookPoint.POST_STOP_POD_SANDBOX):
            return lambda call: self.stop(call, ref)
        return None

    # ------------------------------------------------------------ handlers

    async def create(self, call: DockerCall, name: str) -> Reply:
        try:
            body = dj.decode_object(call.body, "container create body")
            view = dj.ContainerView.of_create(body, name)
            kind = view.kind
            if kind == dj.SANDBOX_TYPE:
                changed = await self._create_sandbox(view)
            elif kind == dj.CONTAINER_TYPE:
                changed = await self._create_container(view)
            else:
                return await call.forward()  # not Kubernetes': no hooks, nothing to keep
        except dj.DockerJSONError as exc:
            # dockerd answers what it cannot parse; a Kubernetes create it accepts is fetched on demand.
            log.info("container create %r passes without hooks: %s", name[:100], exc)
            return await call.forward()
        reply = await call.forward(dj.encode(body) if changed else None)
        if reply.status == 201:
            try:
                container_id = dj.decode_object(reply.body, "dockerd's create answer").get("Id")
            except dj.DockerJSONError as exc:
                log.warning("%s; %r not kept in the store", exc, name[:100])
                return reply
            if isinstance(container_id, str) and container_id:
                self._keep(container_id, view)
        return reply

    async def _create_sandbox(self, view: dj.ContainerView) -> bool:
        """PreRunPodSandbox; True when the body changed."""
        pod = dj.pod_request(view)
        if not self._hooked(pod):
            return False
        before = PodHookRequest()
        before.CopyFrom(pod)
        if not await self.dispatcher.run_pre(HookPoint.PRE_RUN_POD_SANDBOX, pod, _target(pod)):
            return False
        dj.apply_pod(view, before, pod)
        return True

    async def _create_container(self, view: dj.ContainerView) -> bool:
        """PreCreateContainer with the pod's info from the store; True when the body changed."""
        container = dj.container_record(view)
        pod = await self._pod(view.sandbox_id)
        if pod is None or not self._hooked(pod):
            return False
        request = container_hook_request(pod, container)
        before = ContainerHookRequest()
        before.CopyFrom(request)
        target = _target(pod, container.container_meta.name)
        if not await self.dispatcher.run_pre(HookPoint.PRE_CREATE_CONTAINER, request, target):
            return False
        dj.apply_container(view, before, request)
        return True

    async def start(self, call: DockerCall, ref: str) -> Reply:
        found = await self._lookup(ref)
        if found is None or found.record is None or found.pod is None or not self._hooked(found.pod):
            return await call.forward()  # not Kubernetes', a sandbox (RunPodSandbox covered it), or skipped
        record, pod = found.record, found.pod
        request = container_hook_request(pod, record.info)
        target = _target(pod, record.info.container_meta.name)
        if await self.dispatcher.run_pre(HookPoint.PRE_START_CONTAINER, request, target):
            changes = dj.update_body(record.info.container_resources, request.container_resources)
            if changes:
                # The container exists already: resources can only change through an update.
                status, answer = await self.backend.call("POST", f"/containers/{found.id}/update", changes)
                if status != 200:
                    return Reply.error(status if status >= 400 else 500,
                                       f"koord-runtime-proxy: applying PreStartContainer resources to "
                                       f"{found.id}: dockerd answered {status}: "
                                       f"{answer[:500].decode(errors='replace')}")
                record.info.container_resources.CopyFrom(request.container_resources)
        reply = await call.forward()
        if reply.status < 300:
            await self.dispatcher.run_post(HookPoint.POST_START_CONTAINER, request, target)
        return reply

    async def update(self, call: DockerCall, ref: str) -> Reply:
        found = await self._lookup(ref) if self.dispatcher.has_plugins(
            HookPoint.PRE_UPDATE_CONTAINER_RESOURCES) else self._cached(ref)
        if found is None or found.record is None:
            return await call.forward()
        record, pod = found.record, found.pod
        try:
            body = dj.decode_object(call.body, "container update body")
            asked = dj.resources_from(body, "update body", dj.UPDATE_KEYS)
        except dj.DockerJSONError as exc:
            log.info("container update of %s passes without hooks: %s", ref[:100], exc)
            return await call.forward()
        wanted = hook.LinuxContainerResources()
        wanted.CopyFrom(record.info.container_resources)
        for key, field in dj.UPDATE_KEYS:
            if key in body and body[key] is not None:
                setattr(wanted, field, getattr(asked, field))
        changed = False
        if pod is not None and self._hooked(pod) and self.dispatcher.has_plugins(
                HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            request = container_hook_request(pod, record.info)
            request.container_resources.CopyFrom(wanted)
            if await self.dispatcher.run_pre(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, request,
                                             _target(pod, record.info.container_meta.name)):
                dj.apply_update(body, wanted, request.container_resources)
                wanted.CopyFrom(request.container_resources)
                changed = True
        reply = await call.forward(dj.encode(body) if changed else None)
        if reply.status == 200:
            record.info.container_resources.CopyFrom(wanted)
        return reply

    async def stop(self, call: DockerCall, ref: str) -> Reply:
        found = await self._lookup(ref)
        reply = await call.forward()
        if found is None or reply.status >= 400:
            return reply
        record, pod = found.record, found.pod
        if pod is None or not self._hooked(pod):
            return reply
        if record is not None:
            await self.dispatcher.run_post(HookPoint.POST_STOP_CONTAINER, container_hook_request(pod, record.info),
                                           _target(pod, record.info.container_meta.name))
        else:
            await self.dispatcher.run_post(HookPoint.POST_STOP_POD_SANDBOX, pod, _target(pod))
        return reply

    async def delete(self, call: DockerCall, ref: str) -> Reply:
        found = self._cached(ref)
        reply = await call.forward()
        if found is not None and reply.status < 300:
            if found.record is not None:
                self.store.delete_container(found.id)
            else:
                self.store.delete_pod(found.id)  # with its containers, as dockerd's sandbox removal
            self._names = {n: i for n, i in self._names.items() if self._known(i)}
        return reply

    # ------------------------------------------------------------ store

    def _hooked(self, pod: PodHookRequest) -> bool:
        return pod.labels.get(self.skip_key) != self.skip_val

    def _keep(self, container_id: str, view: dj.ContainerView) -> None:
        """Stores what went to dockerd (after hooks), as a restart would rebuild it from inspect."""
        if view.kind == dj.SANDBOX_TYPE:
            self.store.put_pod(container_id, dj.pod_request(view))
        else:
            self.store.put_container(container_id, ContainerRecord(view.sandbox_id,
                                                                   dj.container_record(view, container_id)))
        self._names[view.name.removeprefix("/")] = container_id

    def _cached(self, ref: str) -> Found | None:
        """The store's record for a full id, a name or a unique id prefix; None when it has none."""
        container_id = ref if self._known(ref) else self._names.get(ref.removeprefix("/"))
        if container_id is None and ref:
            matches = [i for i in self._names.values() if i.startswith(ref)]
            container_id = matches[0] if len(matches) == 1 else None
        if container_id is None:
            return None
        pod = self.store.get_pod(container_id)
        if pod is not None:
            return Found(container_id, None, pod)
        record = self.store.get_container(container_id)
        if record is None:
            return None
        return Found(container_id, record, self.store.get_pod(record.sandbox_id))

    def _known(self, container_id: str) -> bool:
        return self.store.get_pod(container_id) is not None or self.store.get_container(container_id) is not None

    async def _lookup(self, ref: str) -> Found | None:
        """Like ``_cached``, else from dockerd's inspect (and kept); None for containers that are not Kubernetes'."""
        found = self._cached(ref)
        if found is None:
            try:
                container_id = await self._load(ref)
            except (BackendError, dj.DockerJSONError) as exc:
                log.warning("no info for container %s, hooks skipped: %s", ref[:100], exc)
                return None
            found = self._cached(container_id) if container_id is not None else None
        if found is not None and found.record is not None and found.pod is None:
            found.pod = await self._pod(found.record.sandbox_id)
        return found

    async def _pod(self, sandbox_id: str) -> PodHookRequest | None:
        pod = self.store.get_pod(sandbox_id)
        if pod is not None or not sandbox_id:
            return pod
        try:
            await self._load(sandbox_id)
        except (BackendError, dj.DockerJSONError) as exc:
            log.warning("no info for sandbox %s, hooks skipped: %s", sandbox_id[:100], exc)
        return self.store.get_pod(sandbox_id)

    async def _load(self, ref: str) -> str | None:
        """Inspects one container at dockerd and stores it if Kubernetes made it; returns its id."""
        status, answer = await self.backend.json_object("GET", f"/containers/{_quote(ref)}/json")
        if status == 404:
            return None
        if status != 200:
            raise BackendError(f"inspect {ref[:100]}: dockerd answered {status}")
        container_id = answer.get("Id")
        if not isinstance(container_id, str) or not container_id:
            raise dj.DockerJSONError(f"inspect {ref[:100]}: no Id in dockerd's answer")
        view = dj.ContainerView.of_inspect(answer)
        if view.kind not in (dj.SANDBOX_TYPE, dj.CONTAINER_TYPE):
            return None
        self._keep(container_id, view)
        return container_id

    async def rebuild(self, parallel: int = 16) -> int:
        """Fills the store with every Kubernetes container dockerd has; returns how many.

        Raises BackendError when dockerd cannot be listed (the caller retries); one container
        that cannot be read is logged and skipped (it is fetched on demand later).
        """
        status, raw = await self.backend.call("GET", f"/containers/json?all=1&filters={_quote(_LIST_FILTER)}")
        if status != 200:
            raise BackendError(f"listing containers: dockerd answered {status}")
        try:
            items = dj.decode_object(b'{"items":' + raw + b"}", "dockerd's container list")["items"]
        except dj.DockerJSONError as exc:
            log.error("store rebuild: %s; starting with an empty store (records are fetched on demand)", exc)
            return 0
        ids = [item.get("Id") for item in items if isinstance(item, dict)] if isinstance(items, list) else []
        limit = asyncio.Semaphore(parallel)

        async def load(container_id: str) -> None:
            async with limit:
                try:
                    await self._load(container_id)
                except (BackendError, dj.DockerJSONError) as exc:
                    log.warning("store rebuild: skipping container %s: %s", container_id[:64], exc)

        await asyncio.gather(*(load(i) for i in ids if isinstance(i, str) and i))
        return len(self._names)


@dataclass(slots=True)
class Found:
    """A store record found by a client's reference: a container (``record``) or a sandbox (``record`` None)."""

    id: str
    record: ContainerRecord | None
    pod: PodHookRequest | None


def _target(pod: PodHookRequest, container: str = "") -> Target:
    return Target(f"{pod.pod_meta.namespace}/{pod.pod_meta.name}", container)


def _query_value(query: bytes, key: str) -> str:
    values = parse_qs(query.decode("utf-8", "replace")).get(key)
    return values[0] if values else ""


def _quote(value: str) -> str:
    return quote(value, safe="")
