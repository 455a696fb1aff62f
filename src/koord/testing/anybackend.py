"""A CRI backend that answers every method with an empty message, for tests of the proxy's
own behaviour (start-up, outages, very large messages) where containerd's answers do not
matter.  An empty message decodes as the default of every CRI response type.
"""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

MAX_MESSAGE_BYTES = 64 << 20


class AnyAnswerBackend:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.calls = 0
        handler = grpc.unary_unary_rpc_method_handler(self._answer)

        class _Any(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                return handler

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self._server.add_generic_rpc_handlers((_Any(),))
        self._server.add_insecure_port(f"unix://{socket}")
        self._server.start()

    def _answer(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        return b""

    def stop(self) -> None:
        self._server.stop(0).wait()
        self.socket.unlink(missing_ok=True)
