"""The twin's stand-in for a team's chat: a webhook on 127.0.0.1 that keeps what the run's notices post to it
(steps/notices.py), answering with the statuses a test asks for. Run alone, it prints each notice as it arrives:

    python -m lustrain.twin.notice_receiver --port 8008      # then: lustrain local up --webhook http://127.0.0.1:8008/hook
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """What was posted (each body as JSON), answered with `answers` in turn (the last one from then on)."""

    def __init__(self, answers: list[int] | None = None, port: int = 0, say: Any = None) -> None:
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
                    if say is not None:
                        say(receiver.posts[-1])
                    receiver.headers.append(dict(self.headers))
                    status = receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/B000/secret-part"


@contextmanager
def receiver(answers: list[int] | None = None, port: int = 0, say: Any = None) -> Iterator[Receiver]:
    found = Receiver(answers, port, say)
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()
        thread.join()


def _show(notice: dict[str, Any]) -> None:
    """One notice as a chat shows it: its text (the json format's), else the whole body."""
    print(notice.get("text") or json.dumps(notice), flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="a chat webhook on 127.0.0.1 that prints the notices posted to it")
    parser.add_argument("--port", type=int, default=8008, help="the port on 127.0.0.1 (default 8008)")
    parser.add_argument("--for-seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    args = parser.parse_args(argv)
    with receiver(port=args.port, say=_show) as found:
        print(f"notices: lustrain local up --webhook http://127.0.0.1:{found.server.server_address[1]}/hook", flush=True)
        with suppress(KeyboardInterrupt):
            threading.Event().wait(args.for_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
