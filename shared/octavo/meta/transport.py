"""The transport seam: where a client's gRPC channel to an address comes from, and how an unused endpoint is
probed. Production uses gRPC over the network (GrpcTransport); the deterministic simulation (octavo.sim)
installs an in-memory network for the length of a run. The etcd client and the bookie client take their
channels from here, so everything above the channel (their retries, timeouts, failover, error mapping) runs
unchanged on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from octavo.meta.tls import TlsFiles, aio_channel


class Transport(Protocol):
    def channel(self, address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """An asyncio channel (or an object that behaves as one) to `address`."""

    async def probe(self, address: str, timeout_s: float) -> str | None:
        """None if `address` accepts a connection now, else why not, in words."""


class GrpcTransport:
    """gRPC over TCP: the production transport."""

    def channel(self, address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        return aio_channel(address, tls, options=options)

    async def probe(self, address: str, timeout_s: float) -> str | None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
        except TimeoutError:
            return f"no answer within {timeout_s:g}s"
        except socket.gaierror:
            return f"cannot resolve {host!r}"
        except ConnectionRefusedError:
            return "connection refused"
        except OSError as e:
            return e.strerror or str(e)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None


_transport: Transport = GrpcTransport()


def current() -> Transport:
    return _transport


def install(transport: Transport) -> Transport:
    """Use `transport` for every channel made from now on; returns the one it replaces (to put back)."""
    global _transport
    previous, _transport = _transport, transport
    return previous
