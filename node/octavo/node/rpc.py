"""How the bookie's gRPC handlers are built: a request that does not parse gets INVALID_ARGUMENT with the
parser's message (grpc's own decoding failure would surface as UNKNOWN, and grpc would log a traceback for it)
and costs one rate-limited log line (ratelimitedlog.py); responses may come pre-encoded. Every service the bookie
serves, grpc's standard ones included (grpc_services.py), is built here."""

from __future__ import annotations

import errno
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from octavo.node.ratelimitedlog import RateLimitedLog

log = logging.getLogger(__name__)

# Every line a peer's bad request causes goes through this: a flood of them costs a bounded number of lines.
bad_requests = RateLimitedLog(log)
# Every line a failing disk causes in a request goes through this: a full disk fails every fence alike.
disk_failures = RateLimitedLog(log)


def disk_failure(error: OSError, data_dir: str, what: str) -> tuple[grpc.StatusCode, str]:
    """The status and message for a request whose disk work failed (the disk's fault, not the request's):
    RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE for another disk error, naming the data directory; one
    rate-limited line, never a traceback (grpc would answer UNKNOWN and log one per request)."""
    full = error.errno == errno.ENOSPC
    message = f"{what} failed: {'the disk is full' if full else 'disk error'} in {data_dir} ({error})"
    disk_failures.warning("disk_full" if full else "disk_error", message, event="disk_failure")
    return (grpc.StatusCode.RESOURCE_EXHAUSTED if full else grpc.StatusCode.UNAVAILABLE), message


class Malformed:
    """What the safe deserializer yields for bytes that are not a valid request: the handler turns it into an
    INVALID_ARGUMENT status (grpc's own decoding failure would surface as UNKNOWN)."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.type_name = type_name
        self.message = f"malformed {type_name}: {error}"


async def refuse_malformed(request: Malformed, context: grpc.aio.ServicerContext) -> NoReturn:
    """One rate-limited line (never a traceback), and INVALID_ARGUMENT with the parser's message."""
    bad_requests.warning(f"malformed {request.type_name}", f"bad request from {context.peer()}: {request.message}",
                         event="bad_request")
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
    raise AssertionError("context.abort returned")  # it raises; this line says so to the type checker


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
            await refuse_malformed(request, context)
        return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                               response_serializer=serialize)


def stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in request_iterator:
                if isinstance(request, Malformed):
                    await refuse_malformed(request, context)
                yield request

        async for response in behavior(checked(), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                                 response_serializer=response_type.SerializeToString)


def unary_stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    """`behavior` yields its responses, or is a coroutine that writes them with context.write (grpc's health
    Watch)."""
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await refuse_malformed(request, context)
        async for response in behavior(request, context):
            yield response

    async def handle_writing(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, Malformed):
            await refuse_malformed(request, context)
        await behavior(request, context)

    if inspect.iscoroutinefunction(behavior):
        return grpc.unary_stream_rpc_method_handler(handle_writing, request_deserializer=safe_parser(request_type),
                                                    response_serializer=response_type.SerializeToString)
    return grpc.unary_stream_rpc_method_handler(handle, request_deserializer=safe_parser(request_type),
                                                response_serializer=response_type.SerializeToString)


class GrpcServicerErrors(logging.Filter):
    """A safety net on grpc's own logger for exceptions that escape a servicer (none should: every service is
    built here). Each such line goes through the bad-request limit, by its message (exception type and method);
    a request grpc could not parse (DecodeError) keeps one line and loses its traceback, anything else keeps
    its traceback (it is a bug to fix)."""

    LOGGER = "grpc._cython.cygrpc"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Unexpected ["):
            return True
        if bad_requests.limit.admit(message[:200], bad_requests.clock()) is None:
            return False
        if record.exc_info and isinstance(record.exc_info[1], DecodeError):
            record.msg, record.args = f"{message}: {record.exc_info[1]}", None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def limit_grpc_servicer_errors() -> None:
    """Install GrpcServicerErrors once on grpc's logger (idempotent)."""
    logger = logging.getLogger(GrpcServicerErrors.LOGGER)
    if not any(isinstance(f, GrpcServicerErrors) for f in logger.filters):
        logger.addFilter(GrpcServicerErrors())
