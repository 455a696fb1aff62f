"""The hook protocol (runtime.v1alpha1): generated messages and gRPC stubs."""

from . import api_pb2, api_pb2_grpc

__all__ = ["api_pb2", "api_pb2_grpc"]
