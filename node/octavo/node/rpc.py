"""How the bookie's gRPC handlers are built: a request that does not parse gets INVALID_ARGUMENT with the
parser's message (grpc's own decoding failure would surface as UNKNOWN), and responses may come pre-encoded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class Malformed:
    """What the safe deserializer yields for bytes that are not a valid request: the handler turns it into an
    INVALID_ARGUMENT status (grpc's own decoding failure would surface as UNKNOWN)."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.message = f"malformed {type_name}: {error}"


def safe_parser(message_type: Any) -> Any:
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as e:
            return Malformed(message_type.DESCRIPTOR.full_name, e)

    return parse


def serialize(message: Any) -> bytes:
    """Responses may come pre-encoded (bytes) from a handler that encodes its payloads itself."""
    return message if isinstance(message, bytes) else message.SerializeToString()  # type: ignore[no-any-return]


def unary(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                               response_serializer=serialize)


def stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in request_iterator:
                if isinstance(request, Malformed):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                yield request

        async for response in behavior(checked(), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                                 response_serializer=response_type.SerializeToString)


def unary_stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        async for response in behavior(request, context):
            yield response

    return grpc.unary_stream_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                                response_serializer=response_type.SerializeToString)
