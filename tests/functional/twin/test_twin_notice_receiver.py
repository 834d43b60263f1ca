"""The twin's chat receiver run alone, as docs/operating.md's "Team features on the twin" starts it: it says the
`--webhook` to give `local up`, and prints each notice posted to it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_run_alone_it_prints_each_notice_posted_to_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lustrain.twin.notice_receiver", "--port", str(port), "--for-seconds", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == f"notices: lustrain local up --webhook http://127.0.0.1:{port}/hook"
        notice = {"source": "lustrain", "kind": "end", "job_id": "tiny-1", "text": "lustrain run tiny-1 succeeded."}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/hook", data=json.dumps(notice).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        assert proc.stdout.readline().strip() == "lustrain run tiny-1 succeeded."
    finally:
        proc.terminate()
        proc.wait(timeout=30)
