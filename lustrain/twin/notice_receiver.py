"""The twin's stand-in for a team's chat: a webhook on 127.0.0.1 that keeps what the run's notices post to it
(steps/notices.py), answering with the statuses a test asks for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """What was posted (each body as JSON), answered with `answers` in turn (the last one from then on)."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.posts: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.answers = list(answers or [200])
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.posts.append(json.loads(body))
                    receiver.headers.append(dict(self.headers))
                    status = receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/B000/secret-part"


@contextmanager
def receiver(answers: list[int] | None = None) -> Iterator[Receiver]:
    found = Receiver(answers)
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()
        thread.join()
