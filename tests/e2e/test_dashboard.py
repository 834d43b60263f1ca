"""`lustrain dashboard`: what its page shows, read from the page itself in a headless Chromium.

The live test runs while the load's runs go on (tests/e2e/test_load.py: six runs against a quota of three on
`lustrain local up`, some training while the others wait their turn): the suite's files are spread over workers
one whole file each, and a second twin with runs of its own would cost the suite a minute. `watch_the_dashboard`
is what that test does while the runs go on: it starts `lustrain dashboard` as a user would, against the twin's
endpoint, opens its page in Debian's Chromium (through Playwright; `make test` installs the browser), and notes
what the page showed. The tests here need no twin: an AWS error on the page, the stack's name escaped, and the
page answering at 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.stub import Stubber

from lustrain import dashboard, operate
from lustrain.twin.rehearse import REGION, STACK_NAME

CHROMIUM = os.environ.get("LUSTRAIN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: the longest any one thing the page should show may take to show: the twin's runs, not a guess, decide when
#: it does (a run waits in the queue while the first three train for their 20 s)
SHOWS_WITHIN_MS = 180_000


@dataclass
class Seen:
    """What the dashboard's page showed while the load's runs went on, each as the page's own text."""

    names: list[str] = field(default_factory=list)
    waiting: str = ""
    training: str = ""
    #: (job id, its progress before, its progress after it moved)
    progress: tuple[str, str, str] = ("", "", "")
    run_url: str = ""
    run_title: str = ""
    #: each plot of the run's view, by name, and its width as the browser decoded it
    plots: dict[str, int] = field(default_factory=dict)
    log: str = ""
    #: a run named with markup, as the table shows it, and the elements its name made (none, escaped)
    hostile_name: str = ""
    hostile_elements: int = -1
    exit_code: int | None = None
    failure: str | None = None


def watch_the_dashboard(endpoint: str, ready: threading.Event, seen: Seen) -> None:
    """Serve `lustrain dashboard` against the twin at `endpoint`, and once its page shows its first look at the
    stack, set `ready` (the runs start then); look at the page until it has shown every thing `Seen` holds, then
    stop it with Ctrl-C. Never raises: a failure is kept, with what the page showed."""
    shown = ""
    try:
        if not Path(CHROMIUM).is_file():
            raise FileNotFoundError(
                f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium (or set LUSTRAIN_CHROMIUM to "
                "a Chromium or Chrome binary)"
            )
        from playwright.sync_api import sync_playwright

        served = _serve(endpoint)
        try:
            url = _url_of(served)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page()
                try:
                    page.goto(url)
                    page.wait_for_function(
                        "() => document.getElementById('read').textContent.startsWith('read at')",
                        timeout=SHOWS_WITHIN_MS,
                    )
                    ready.set()
                    _look(page, seen)
                except BaseException:
                    shown = page.inner_text("body")
                    raise
                finally:
                    browser.close()
        finally:
            served.send_signal(signal.SIGINT)
            try:
                seen.exit_code = served.wait(timeout=60)
            finally:
                served.kill()  # nothing, once it has stopped
    except BaseException:
        seen.failure = traceback.format_exc() + (f"\nthe page showed:\n{shown}" if shown else "")


def _serve(endpoint: str) -> subprocess.Popen[str]:
    # as docs/operating.md tells a user of `lustrain local up`: its endpoint, a region, any credentials
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "twin",
        "AWS_SECRET_ACCESS_KEY": "twin",
    }
    env.pop("AWS_SESSION_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "lustrain.cli", "dashboard", "--stack", STACK_NAME, "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _url_of(served: subprocess.Popen[str], timeout_s: float = 120) -> str:
    """The URL the dashboard prints on its first line (it has found the stack by then)."""
    assert served.stdout is not None
    with selectors.DefaultSelector() as ready:
        ready.register(served.stdout, selectors.EVENT_READ)
        if not ready.select(timeout_s):
            raise TimeoutError(f"`lustrain dashboard` printed nothing within {timeout_s:.0f} s")
    line = served.stdout.readline()
    if not line.startswith("dashboard: http://127.0.0.1:"):
        served.kill()
        raise AssertionError(f"`lustrain dashboard` printed {line + served.stdout.read()!r}")
    # what it prints after its URL (a traceback, if it had one) must not fill the pipe and stop it
    threading.Thread(target=served.stdout.read, daemon=True).start()
    return line.removeprefix("dashboard: ").strip()


def _texts(page: Any, column: str) -> dict[str, str]:
    return dict(
        page.eval_on_selector_all(
            f"#runs tr[data-job-id] td.{column}",
            "cells => cells.map(td => [td.parentElement.dataset.jobId, td.textContent])",
        )
    )


def _look(page: Any, seen: Seen) -> None:
    wait = {"timeout": SHOWS_WITHIN_MS, "polling": 500}

    def first(cells: str, starting: str) -> str:
        """The text of the first of the page's `cells` that starts so, once one does."""
        return str(page.wait_for_function(
            "([cells, starting]) => [...document.querySelectorAll(cells)].map(td => td.textContent)"
            "  .find(text => text.startsWith(starting))",
            arg=[cells, starting],
            **wait,
        ).json_value())

    # a run waiting its turn in the capacity queue, and one training meanwhile
    seen.waiting = first("#runs td.queue", "waiting")
    seen.training = first("#runs td.training", "InProgress")
    # progress moving: a run's steps, as the page shows them now, then as it shows them once they moved on
    before = _texts(page, "progress")
    moved = page.wait_for_function(
        """before => [...document.querySelectorAll('#runs tr[data-job-id]')]
             .map(tr => [tr.dataset.jobId, tr.querySelector('td.progress').textContent])
             .find(([id, text]) => text.startsWith('step') && text !== (before[id] ?? ''))""",
        arg=before,
        **wait,
    ).json_value()
    seen.progress = (moved[0], before.get(moved[0], ""), moved[1])
    seen.names = sorted(_texts(page, "name").values())
    # the run's own view: open it as a user does, by its row
    page.click(f"#runs tr[data-job-id='{moved[0]}']")
    # every plot the report draws, each image loaded (a PNG the browser could decode has a width)
    seen.plots = page.wait_for_function(
        """() => { const images = [...document.querySelectorAll('#plots img')];
                   return images.length > 0 && images.every(img => img.complete && img.naturalWidth > 0)
                     && Object.fromEntries(images.map(img => [img.dataset.plot, img.naturalWidth])); }""",
        **wait,
    ).json_value()
    seen.log = page.wait_for_function(
        "() => document.getElementById('log').textContent.includes('step=') && "
        "document.getElementById('log').textContent",
        **wait,
    ).json_value()
    seen.run_url, seen.run_title = page.url, page.inner_text("#run-title")
    # a run named with markup (a refused spec's run is named by its S3 key, which may hold anything): the page
    # gets it from its JSON, as the stack would give it
    hostile = {
        "stack": STACK_NAME, "read_at": "now", "error": None,
        "runs": [{**_a_run(), "job_id": "x<b>1</b>", "name": "<img src=x onerror=\"document.title='owned'\">"}],
    }
    page.route("**/api/runs", lambda route: route.fulfill(json=hostile))
    page.wait_for_function("() => document.querySelector(\"#runs tr[data-job-id='x<b>1</b>']\")", **wait)
    seen.hostile_name = page.inner_text("#runs td.name")
    seen.hostile_elements = page.eval_on_selector_all("#runs img, #runs b", "found => found.length")
    page.unroute("**/api/runs")


def _a_run() -> dict[str, Any]:
    """A run as /api/runs lists it: a queued one, one instance."""
    return {
        "job_id": "r", "name": "r", "execution": "r", "state": "RUNNING", "attempt": 0, "instances": 1,
        "instance_type": "ml.p4d.24xlarge", "created_at": "2025-01-01T00:00:00Z", "elapsed_s": 3.0,
        "cost_so_far_usd": 0.0, "budget_usd": None, "error": None, "kind": "train", "in_state": None,
        "queue_place": {}, "training_job": None, "step": None, "max_steps": None,
    }


# ------------------------------------------------------------------------------------------------- no twin


LOOKS = 2


class _RefusingSession:
    """AWS as an operator without the right to read the jobs table sees it: every Scan is AccessDenied."""

    def client(self, service: str) -> Any:
        client = boto3.client(service, region_name=REGION)
        stub = Stubber(client)
        for _ in range(LOOKS):
            stub.add_client_error("scan", "AccessDeniedException", "not authorized to perform: dynamodb:Scan")
        stub.activate()
        return client


def _get(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_an_aws_error_shows_on_the_page_and_the_dashboard_serves_on(tmp_path):
    stack = operate.Stack(
        name="<b>team</b>-stack",
        state_machine_arn="arn:aws:states:us-east-1:123456789012:stateMachine:jobs",
        jobs_table="jobs",
        jobs_bucket="jobs",
        artifacts_bucket="artifacts",
        session=_RefusingSession(),
    )
    server = dashboard.Server(dashboard.Dashboard(stack, tmp_path, refresh_s=0), 0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        for _ in range(LOOKS):  # each look fails, and each is answered
            code, body = _get(server.url + "api/runs")
            assert code == 200
            assert "AccessDeniedException" in json.loads(body)["error"]
        code, page = _get(server.url + "run/anything")
        assert code == 200
        assert "&lt;b&gt;team&lt;/b&gt;-stack" in page and "<b>team</b>" not in page
        # only as 127.0.0.1: a page of another site whose name resolves here is refused
        assert _get(server.url + "api/runs", host="attacker.example:80")[0] == 403
    finally:
        server.shutdown()
        server.server_close()
