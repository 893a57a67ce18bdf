"""TLS for every gRPC connection of ours: server credentials that pick up renewed certificate files without a
restart, and channel credentials for clients (docs/security.md).

A server's certificate and key are read again when either file changes (cert-manager renews them in place):
gRPC asks for the configuration at each new handshake, and a changed file is read then. Connections already
open keep their session, so in-flight streams are not failed by a renewal. A client's certificate is read when
its channel is made: a renewed client certificate is used by the next connection.

Every certificate failure surfaces in gRPC as UNAVAILABLE, the same code as a peer that is down; the clients
say in the message when TLS is on so that a misconfiguration does not read as an outage.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

CLIENT_AUTH_REQUIRE = "require"  # the default when TLS is on: a client without a certificate of the CA is refused
CLIENT_AUTH_NONE = "none"        # server-side TLS only (clients check the server; the server does not check them)
CLIENT_AUTH_MODES = (CLIENT_AUTH_REQUIRE, CLIENT_AUTH_NONE)


class TlsError(ValueError):
    """A TLS setting that cannot be used; the message names the setting or the file."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: this process's certificate chain and key, and the CA bundle it trusts for its peers."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.ca_file)

    def check(self, what: str = "tls") -> TlsFiles:
        """Raise TlsError unless the files make sense together and can be read."""
        if bool(self.cert_file) != bool(self.key_file):
            raise TlsError(f"{what}_cert_file and {what}_key_file go together: set both or neither")
        for name, path in (("cert_file", self.cert_file), ("key_file", self.key_file), ("ca_file", self.ca_file)):
            if path:
                _read(f"{what}_{name}", path)
        return self

    @staticmethod
    def from_env(environ: dict[str, str] | None = None, prefix: str = "OCTAVO_TLS_") -> TlsFiles:
        env = os.environ if environ is None else environ
        return TlsFiles(env.get(prefix + "CERT_FILE", ""), env.get(prefix + "KEY_FILE", ""),
                        env.get(prefix + "CA_FILE", ""))


def _read(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TlsError(f"{setting}: cannot read {path}: {e.strerror or e}") from e
    if b"-----BEGIN " not in data:
        raise TlsError(f"{setting}: {path} holds no PEM block")
    return data


class ReloadingServerCredentials:
    """Server credentials whose certificate and key are read again when their files change."""

    def __init__(self, tls: TlsFiles, client_auth: str = CLIENT_AUTH_REQUIRE) -> None:
        if not tls.cert_file:
            raise TlsError("tls_cert_file and tls_key_file are needed to serve TLS")
        if client_auth not in CLIENT_AUTH_MODES:
            raise TlsError(f"tls_client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}, got {client_auth!r}")
        if client_auth == CLIENT_AUTH_REQUIRE and not tls.ca_file:
            raise TlsError("tls_client_auth=require needs tls_ca_file: the CA whose client certificates are accepted")
        self.tls = tls
        self.client_auth = client_auth
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        self.reloads = 0
        self.last_error = ""
        initial = self._configuration()
        self.credentials = grpc.dynamic_ssl_server_credentials(
            initial, self._fetch, require_client_authentication=client_auth == CLIENT_AUTH_REQUIRE)

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in (self.tls.cert_file, self.tls.key_file, self.tls.ca_file):
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append((st.st_mtime_ns, st.st_size) if st else (0, 0))
        return tuple(out)

    def _configuration(self) -> Any:
        key = _read("tls_key_file", self.tls.key_file)
        chain = _read("tls_cert_file", self.tls.cert_file)
        ca = _read("tls_ca_file", self.tls.ca_file) if self.tls.ca_file else None
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def _fetch(self) -> Any:
        """Called by gRPC at each new handshake: a new configuration when a file changed, else None."""
        stamp = self._stamps()
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                configuration = self._configuration()
            except TlsError as e:  # half-written files: keep serving the old certificate, try next time
                self.last_error = str(e)
                return None
            self._stamp = stamp
            self.reloads += 1
            self.last_error = ""
            return configuration


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    ca = _read("tls_ca_file", tls.ca_file) if tls.ca_file else None
    key = _read("tls_key_file", tls.key_file) if tls.key_file else None
    chain = _read("tls_cert_file", tls.cert_file) if tls.cert_file else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=chain)


def aio_channel(address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = (),
                metadata: Sequence[tuple[str, str]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to `address`: over TLS when `tls` is enabled, else plaintext; `metadata` (an admin
    token) goes with every call."""
    interceptors = [_AioMetadata(metadata)] if metadata else None
    if tls is not None and tls.enabled:
        return grpc.aio.secure_channel(address, channel_credentials(tls), options=list(options),
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def sync_channel(address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = (),
                 metadata: Sequence[tuple[str, str]] = ()) -> grpc.Channel:
    """A blocking channel to `address`: over TLS when `tls` is enabled, else plaintext; `metadata` (an admin
    token) goes with every call."""
    if tls is not None and tls.enabled:
        channel = grpc.secure_channel(address, channel_credentials(tls), options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(channel, _SyncMetadata(metadata)) if metadata else channel


def admin_token_metadata(token_file: str) -> tuple[tuple[str, str], ...]:
    """`authorization: Bearer <token>` from a token file (empty name: no metadata)."""
    if not token_file:
        return ()
    token = _read_token(token_file)
    return (("authorization", f"Bearer {token}"),)


def _read_token(path: str) -> str:
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise TlsError(f"admin token file {path}: cannot read it: {e.strerror or e}") from e
    if not token:
        raise TlsError(f"admin token file {path} is empty")
    return token


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: Sequence[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = [*(base.metadata or ()), *metadata]
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _SyncMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.metadata = list(metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_CallDetails(details, self.metadata), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_CallDetails(details, self.metadata), request)


class _AioMetadata(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.metadata = list(metadata)

    def _details(self, details: Any) -> Any:
        return grpc.aio.ClientCallDetails(details.method, details.timeout,
                                          grpc.aio.Metadata(*(details.metadata or ()), *self.metadata),
                                          details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)
