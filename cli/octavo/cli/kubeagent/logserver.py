"""The kubelet's HTTPS endpoint, as far as `kubectl logs` needs it: the API server proxies
GET /api/v1/namespaces/<ns>/pods/<pod>/log to GET /containerLogs/<ns>/<pod>/<container> on the node's
InternalIP and kubeletEndpoint port. Query: follow, tailLines, previous, limitBytes. Only clients with a
certificate of the cluster CA are served (the API server's kubelet client). One server serves every node of
the agent (the path names the pod)."""

from __future__ import annotations

import http.server
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLLOW_POLL_S = 0.2
CHUNK_BYTES = 64 * 1024

# (namespace, pod, container, previous) -> (log file, is the container running) or None when unknown
Find = Callable[[str, str, str, bool], "tuple[Path, Callable[[], bool]] | None"]


def tail(data: bytes, lines: int) -> bytes:
    """The last `lines` lines of `data` (a last line without its newline counts)."""
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class LogServer:
    def __init__(self, host: str, port: int, cert_file: str, key_file: str, ca_file: str, find: Find) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        context.load_verify_locations(ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
        handler = type("Handler", (_Handler,), {"find": staticmethod(find)})
        self.server = http.server.ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="kubelet-endpoint", daemon=True)

    def start(self) -> LogServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    find: Find
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if url.path == "/healthz":
            return self._answer(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._answer(404, f"the octavo node agent serves /containerLogs only, not {url.path}".encode())
        _, namespace, pod, container = parts
        previous = query.get("previous") in ("true", "1")
        found = self.find(namespace, pod, container, previous)
        if found is None or not found[0].exists():
            what = "previous terminated container" if previous else "container"
            return self._answer(404, f"{what} {container!r} of pod {namespace}/{pod} not found on this node".encode())
        path, running = found
        data = path.read_bytes()
        if "tailLines" in query:
            data = tail(data, int(query["tailLines"]))
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        if limit is not None:
            data = data[:limit]
        if query.get("follow") not in ("true", "1") or previous:
            return self._answer(200, data)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(data)
        offset = path.stat().st_size
        try:
            while True:
                with open(path, "rb") as f:
                    f.seek(offset)
                    more = f.read(CHUNK_BYTES)
                if more:
                    offset += len(more)
                    self._chunk(more)
                    continue
                if not running():
                    break
                time.sleep(FOLLOW_POLL_S)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, FileNotFoundError):
            pass

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
