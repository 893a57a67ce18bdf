"""Who may call the admin plane (docs/security.md). With `admin_identities` or `admin_token_file` set, every
BookieAdmin call must come from a client certificate whose common name or a subject alternative name (DNS or
URI) is listed, or carry `authorization: Bearer <token>` with the token of the file (for the CLI: compared in
constant time; the file is read again when it changes). Without either setting the admin plane serves every
client the transport accepts (with mutual TLS: any certificate of the CA), as before.

Refusals: UNAUTHENTICATED when the call brings no identity at all, PERMISSION_DENIED when its identity is not an
admin; the message names what was missing, never a token."""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from typing import Any

import grpc

BEARER = "bearer "


class AdminAuthorizer:
    def __init__(self, identities: Sequence[str], token_file: str) -> None:
        self.identities = frozenset(i.strip() for i in identities if i.strip())
        self.token_file = token_file
        self._token = b""
        self._stamp: tuple[int, int] | None = None
        if token_file:
            self._load()

    @property
    def enforced(self) -> bool:
        return bool(self.identities or self.token_file)

    def _load(self) -> bytes:
        """The token, read again when its file changed (a rotated Secret)."""
        try:
            st = os.stat(self.token_file)
        except OSError as e:
            raise ValueError(f"admin_token_file: cannot read {self.token_file}: {e.strerror or e}") from e
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with open(self.token_file, "rb") as f:
                token = f.read().strip()
            if not token:
                raise ValueError(f"admin_token_file: {self.token_file} is empty")
            self._token, self._stamp = token, stamp
        return self._token

    def check(self, context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
        """None if the caller is an admin, else the status and message to refuse it with."""
        if not self.enforced:
            return None
        names = peer_identities(context.auth_context())
        token = next((value for key, value in context.invocation_metadata() or ()
                      if key == "authorization"), None)
        if token is not None and self.token_file:
            text = token if isinstance(token, str) else token.decode(errors="replace")
            if text.lower().startswith(BEARER):
                try:
                    expected = self._load()
                except ValueError:
                    expected = b""
                if expected and hmac.compare_digest(text[len(BEARER):].strip().encode(), expected):
                    return None
            return grpc.StatusCode.PERMISSION_DENIED, "the admin token is not this bookie's admin_token_file token"
        if names & self.identities:
            return None
        if not names:
            return grpc.StatusCode.UNAUTHENTICATED, (
                "the admin plane needs a client certificate named in admin_identities or an admin token "
                "(authorization: Bearer; OCTAVO_ADMIN_TOKEN_FILE for the CLI); the call brought neither")
        auth = context.auth_context()
        return grpc.StatusCode.PERMISSION_DENIED, (
            f"the client certificate (CN {', '.join(_values(auth, 'x509_common_name')) or '-'}; SANs "
            f"{', '.join(_values(auth, 'x509_subject_alternative_name')) or '-'}) is not in this bookie's "
            "admin_identities: the admin plane refuses it")


def _values(auth: Any, key: str) -> list[str]:
    return sorted(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in (auth or {}).get(key, ()))


def peer_identities(auth: Any) -> frozenset[str]:
    return frozenset(_values(auth, "x509_common_name") + _values(auth, "x509_subject_alternative_name"))
