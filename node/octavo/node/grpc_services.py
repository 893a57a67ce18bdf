"""gRPC's standard services on the bookie, health checking and reflection, served through our own handlers
(rpc.py) instead of the generated ones: a request that does not parse gets INVALID_ARGUMENT and one rate-limited
log line, where grpc's generated handlers answer UNKNOWN and log a traceback for each. Valid requests reach
grpc's own servicers unchanged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from octavo.node.rpc import stream, unary, unary_stream


def health_handler(servicer: health.aio.HealthServicer) -> Any:
    """grpc.health.v1.Health (Check and Watch, as kubelet probes and grpc_health_probe call them)."""
    return grpc.method_handlers_generic_handler(health.SERVICE_NAME, {
        "Check": unary(servicer.Check, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
        "Watch": unary_stream(servicer.Watch, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
    })


def reflection_handler(service_names: Iterable[str]) -> Any:
    """grpc.reflection.v1alpha.ServerReflection listing `service_names` (reflection's own name is added)."""
    servicer = reflection.aio.ReflectionServicer([*service_names, reflection.SERVICE_NAME])
    return grpc.method_handlers_generic_handler(reflection.SERVICE_NAME, {
        "ServerReflectionInfo": stream(servicer.ServerReflectionInfo, reflection_pb2.ServerReflectionRequest,
                                       reflection_pb2.ServerReflectionResponse),
    })
