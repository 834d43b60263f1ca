"""What a job's stand-ins for AWS endpoints share (secrets.py, objects.py): a small HTTP server on 127.0.0.1 that the
job's SDK is pointed at, and an address where nothing listens for a service its network cannot reach (the SDK's
connection fails, as it times out on AWS)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def unused_address() -> str:
    """An address of this machine where nothing listens (a port bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """`handler` served on a free port of 127.0.0.1 by threads of its own, until `close`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def address(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def close(server: ThreadingHTTPServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
