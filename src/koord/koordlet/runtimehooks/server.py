"""gRPC server for runtime.v1alpha1.RuntimeHookService (koordlet's Proxy mode).

Each request becomes a typed context once, the hooks framework runs the stage's
plugin functions on it, and the context becomes the response once. What the proxy
cannot apply (group identity's ``cpu.bvt_warp_ns``, pod-level resources, which the
upstream proxy drops) is written here to the pod's cgroup when that cgroup already
exists; otherwise the reconciler writes it on its next round.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from koord.hookapi import SERVICE, SOCKET_MODE, HookPoint, prepare_socket

from ..resourceexecutor.executor import CgroupError, CgroupExecutor, cgroup_dir_exists
from .hooks import HookError, Hooks, InvalidInput, describe
from .protocol import ContainerContext, HookContext, PodContext

log = logging.getLogger(__name__)


class Network:
    UNIX = "unix"
    TCP = "tcp"


def grpc_target(network: str, addr: str) -> str:
    """The address in grpc's syntax, for both servers and clients."""
    if network == Network.UNIX:
        return "unix:" + addr.removeprefix("unix://")
    if network == Network.TCP:
        return addr
    raise ValueError(f"unknown network {network!r}: expected unix or tcp")


class RuntimeHookServer:
    """Serves the seven hook RPCs from a :class:`Hooks` registry.

    ``executor`` is None for servers that never touch cgroups (plugins built with the SDK).
    """

    def __init__(self, hooks: Hooks, *, network: str = Network.UNIX, addr: str,
                 executor: CgroupExecutor | None = None,
                 disabled_stages: Iterable[HookPoint] = (), max_workers: int = 8,
                 observe: Callable[[HookPoint, grpc.StatusCode], None] | None = None) -> None:
        self.hooks = hooks
        self.observe = observe
        """Told the status of every answered call (OK, INVALID_ARGUMENT, INTERNAL); e.g. for metrics."""
        self.network = network
        self.addr = addr.removeprefix("unix://") if network == Network.UNIX else addr
        self.executor = executor
        self.disabled_stages = frozenset(disabled_stages)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._port = 0

    @property
    def endpoint(self) -> str:
        """Where clients reach the server: the socket path, or host:port with the bound port."""
        if self.network == Network.TCP and self._port:
            host = self.addr.rpartition(":")[0]
            return f"{host}:{self._port}"
        return self.addr

    def stages(self) -> set[HookPoint]:
        """Stages worth registering with the proxy: at least one function, not disabled."""
        return self.hooks.stages() - self.disabled_stages

    def start(self) -> None:
        target = grpc_target(self.network, self.addr)
        if self.network == Network.UNIX:
            prepare_socket(Path(self.addr))
        server = grpc.server(futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="hook-server"))
        server.add_generic_rpc_handlers((_generic_handler(self),))
        self._port = server.add_insecure_port(target)
        if not self._port:
            raise OSError(f"cannot listen on {self.network} {self.addr}")
        server.start()
        if self.network == Network.UNIX:
            os.chmod(self.addr, SOCKET_MODE)
        self._server = server
        log.info("runtime hook server listening on %s %s, stages %s (disabled: %s)",
                 self.network, self.endpoint, ",".join(HookPoint.ordered(self.stages())) or "none",
                 ",".join(HookPoint.ordered(self.disabled_stages)) or "none")

    def stop(self, grace: float = 2.0) -> None:
        if self._server is None:
            return
        self._server.stop(grace).wait()
        self._server = None
        if self.network == Network.UNIX:
            Path(self.addr).unlink(missing_ok=True)
        log.info("runtime hook server on %s stopped", self.endpoint)

    def handle(self, stage: HookPoint, request: Message, context: grpc.ServicerContext) -> Message:
        """Answers one hook call; every failure is a status with a message, never a crash.

        A request koordlet must not act on (a path field leaving the cgroup root, an
        annotation a plugin rejects under the Fail policy) is INVALID_ARGUMENT naming the
        field; a plugin failing otherwise is INTERNAL; anything unexpected is logged and
        INTERNAL too, instead of grpc's bare "Exception calling application".
        """
        try:
            response = self._answer(stage, request)
        except _Refused as exc:
            code, message = exc.code, str(exc)
        except Exception as exc:
            log.exception("%s: unexpected error", stage)
            code, message = grpc.StatusCode.INTERNAL, f"koordlet {stage}: {type(exc).__name__}: {exc}"
        else:
            self._observe(stage, grpc.StatusCode.OK)
            return response
        self._observe(stage, code)
        context.abort(code, message)
        raise AssertionError("grpc's abort returned")  # it raises; said for the type checker

    def _observe(self, stage: HookPoint, code: grpc.StatusCode) -> None:
        if self.observe is None:
            return
        try:
            self.observe(stage, code)
        except Exception:  # metrics must never change an answer
            log.exception("hook server observer failed at %s", stage)

    def _answer(self, stage: HookPoint, request: Any) -> Message:
        if stage in self.disabled_stages:
            return stage.response_type()
        ctx: HookContext = (PodContext.from_proto(request) if stage.is_pod
                            else ContainerContext.from_proto(request))
        problems = ctx.request.problems()
        if problems:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"{stage} for {describe(ctx)}: bad request: {'; '.join(problems)}")
        try:
            self.hooks.run(stage, ctx)
        except HookError as exc:
            bad_input = isinstance(exc.__cause__, InvalidInput)
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT if bad_input else grpc.StatusCode.INTERNAL,
                           str(exc)) from None
        if self.executor is not None:
            self._write_node_side(stage, ctx)
        response = ctx.to_proto()
        log.debug("%s for %s answered: %s", stage, describe(ctx), _short(response))
        return response

    def _write_node_side(self, stage: HookPoint, ctx: HookContext) -> None:
        """Cgroup writes the proxy cannot do; best effort, the reconciler retries them."""
        assert self.executor is not None
        write_node_side(self.executor, f"{stage}", ctx, through_proxy=True)


def write_node_side(executor: CgroupExecutor, what: str, ctx: HookContext, *, through_proxy: bool) -> None:
    """What the runtime's call cannot carry (``ctx.cgroup_update``), written by koordlet where the
    cgroup exists; a cgroup not there yet or a failed write is left to the reconciler's next round."""
    update = ctx.cgroup_update(executor, through_proxy=through_proxy)
    if update is None:
        return
    if not cgroup_dir_exists(executor, update.cgroup_dir, update.resources):
        log.debug("%s for %s: cgroup %s does not exist yet, left to the reconciler",
                  what, describe(ctx), update.cgroup_dir)
        return
    try:
        written = executor.apply(update.cgroup_dir, update.resources)
    except CgroupError as exc:
        log.warning("%s for %s: %s; the reconciler retries", what, describe(ctx), exc)
        return
    if written:
        log.info("%s for %s: wrote %s to cgroup %s", what, describe(ctx), ", ".join(written), update.cgroup_dir)


class _Refused(Exception):
    """A hook call answered with a gRPC error status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _generic_handler(server: RuntimeHookServer) -> grpc.GenericRpcHandler:
    """One handler per hook point, derived from HookPoint: the RPC names and message types are written once."""
    def serve(stage: HookPoint) -> Callable[[Any, grpc.ServicerContext], Any]:
        return lambda request, context: server.handle(stage, request, context)

    return grpc.method_handlers_generic_handler(SERVICE, {
        stage.rpc: grpc.unary_unary_rpc_method_handler(
            serve(stage), request_deserializer=stage.request_type.FromString,
            response_serializer=stage.response_type.SerializeToString)
        for stage in HookPoint})


def _short(msg: object) -> str:
    return str(msg).replace("\n", " ").strip() or "no changes"
