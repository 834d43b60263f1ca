"""`lustrain dashboard`: a local web page that follows every run of a stack live.

It serves 127.0.0.1 only (the standard library's HTTP server) and reads the stack with the operator's credentials,
as `lustrain runs` does. The page asks /api/runs every few seconds and redraws itself: each run's state, the state
machine's state it is in, attempt, place in the capacity queue, training job, steps done of the spec's max_steps
(the trainer's `step=` log lines, as `lustrain watch` counts them) and cost so far against its budget. A run's own
view (/run/<job id>) adds `lustrain report`'s plots and the last lines of its log.

What it asks of AWS: one look per REFRESH_S, however many pages are open. A look lists the runs (as `lustrain runs`)
and reads the status of each run still going, and its current job's first host's log (rank 0's, which logs the
steps) from where the last look stopped, its last lines at the first look (operate.log_tail: one stream whatever
the hosts, never a long log from its start); a run that had ended before the dashboard started is read only when its view is
opened, one that ends while it watches once more, then never again. A run's plots are drawn when its view is open,
again at most every PLOTS_EVERY_S while the run goes on, and once more when it has ended (from its whole log, as
`lustrain report` draws them). An AWS error is shown on
the page (beside what the last good look read) and the server serves on.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from lustrain_core.errors import LustrainError

from lustrain import operate

#: seconds between two looks at the stack, whatever the number of pages open
REFRESH_S = 5.0
#: seconds between two drawings of a live run's plots (a finished run's are drawn once more, then kept)
PLOTS_EVERY_S = 30.0
LOG_TAIL = 50
#: what a refresh may fail with and the page shows: AWS's errors, and lustrain's own (a run no longer found)
SHOWN_ERRORS = (BotoCoreError, ClientError, LustrainError)


@dataclass
class _Followed:
    """What the dashboard has read of one run beyond its summary."""

    status: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    step: int | None = None
    since_ms: int | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL))
    #: the run had finished (teardown included) when last read: nothing of it changes any more
    final: bool = False


@dataclass
class _Drawn:
    at: float
    finished: bool
    pngs: dict[str, Path]
    version: int


class Dashboard:
    """The stack's runs as the page shows them, read at most once per `refresh_s`."""

    def __init__(self, stack: operate.Stack, cache_dir: Path, refresh_s: float = REFRESH_S,
                 plots_every_s: float = PLOTS_EVERY_S) -> None:
        self.stack = dataclasses.replace(stack, session=_SharedClients(stack.session or boto3.Session()))
        self.cache_dir = cache_dir
        self.refresh_s = refresh_s
        self.plots_every_s = plots_every_s
        self._looking = threading.Lock()
        self._drawing = threading.Lock()  # pyplot draws one figure at a time
        self._looked_at = -float("inf")
        self._followed: dict[str, _Followed] = {}
        self._drawn: dict[str, _Drawn] = {}
        self._snapshot: dict[str, Any] = {"stack": stack.name, "read_at": None, "error": None, "runs": []}

    def overview(self) -> dict[str, Any]:
        """Every run of the stack with what the page shows of it; `error` says why the last look failed."""
        with self._looking:
            if time.monotonic() - self._looked_at >= self.refresh_s:
                try:
                    self._snapshot = {**self._look(), "error": None}
                except SHOWN_ERRORS as exc:
                    self._snapshot = {**self._snapshot, "error": _error_text(exc)}
                self._looked_at = time.monotonic()
            return self._snapshot

    def _look(self) -> dict[str, Any]:
        shown = []
        # newest first, as the CLI lists them
        for summary in sorted(operate.runs(self.stack), key=lambda r: r.created_at, reverse=True):
            followed = self._followed.get(summary.job_id)
            if followed is None:
                ended = summary.state in operate.FINISHED
                followed = self._followed[summary.job_id] = _Followed(final=ended)
            if not followed.final:
                self._follow(summary.job_id, summary.state, followed)
            shown.append({
                **summary.to_dict(),
                **followed.status,
                "step": followed.step,
                "max_steps": followed.max_steps,
            })
        return {"stack": self.stack.name, "read_at": time.strftime("%H:%M:%S"), "runs": shown}

    def _follow(self, job_id: str, state: str, followed: _Followed) -> None:
        """Read what changed of a run since the last look."""
        if not followed.status:
            followed.max_steps = operate.find_run(self.stack, job_id).max_steps
        now = operate.status(self.stack, job_id)
        going = [span.state for span in now.timeline if span.exited_at is None]
        followed.status = {
            "in_state": going[-1] if going and state == "RUNNING" else None,
            "queue_place": now.queue,
            "training_job": now.training_job,
        }
        lines = operate.log_tail(self.stack, job_id, since_ms=followed.since_ms, limit=LOG_TAIL)
        for line in lines:
            found = operate.STEP_IN_LOG.search(line.message)
            followed.step = int(found.group(1)) if found else followed.step
            followed.tail.append(f"[{line.host}] {line.message}")
        followed.since_ms = lines[-1].timestamp_ms if lines else followed.since_ms
        followed.final = state in operate.FINISHED

    def run(self, job_id: str) -> dict[str, Any] | None:
        """One run's view: its summary, its plots' addresses and its last log lines; None for no such run."""
        snapshot = self.overview()
        shown = next((r for r in snapshot["runs"] if r["job_id"] == job_id), None)
        if shown is None:
            return None
        error, tail = None, []
        try:
            with self._looking:
                followed = self._followed[job_id]
                if not followed.status:  # it had ended before the dashboard started: read it now, once
                    self._follow(job_id, shown["state"], followed)
                    shown = {**shown, **followed.status, "step": followed.step, "max_steps": followed.max_steps}
                tail = list(followed.tail)
            self._draw(job_id, finished=shown["state"] in operate.FINISHED)
        except SHOWN_ERRORS as exc:
            error = _error_text(exc)
        drawn = self._drawn.get(job_id)
        plots = [] if drawn is None else [
            {"name": name, "url": f"/plot/{quote(job_id, safe='')}/{name}.png?v={drawn.version}"}
            for name in drawn.pngs
        ]
        return {**shown, "plots": plots, "log": tail, "error": error}

    def _draw(self, job_id: str, finished: bool) -> None:
        from lustrain.report import build

        with self._drawing:
            drawn = self._drawn.get(job_id)
            fresh = drawn is not None and (
                drawn.finished or (not finished and time.monotonic() - drawn.at < self.plots_every_s)
            )
            if fresh:
                return
            version = drawn.version + 1 if drawn else 1
            # each drawing in a folder of its own: a page still loading the last one never reads a half-written PNG
            done = build(self.stack, job_id, self.cache_dir / str(version))
            self._drawn[job_id] = _Drawn(time.monotonic(), finished, dict(done.pngs), version)
            if drawn is not None:
                shutil.rmtree(self.cache_dir / str(drawn.version) / job_id, ignore_errors=True)

    def plot(self, job_id: str, name: str) -> bytes | None:
        """A plot's PNG as last drawn (only what `report.build` wrote: no path is made of the request)."""
        drawn = self._drawn.get(job_id)
        path = drawn.pngs.get(name) if drawn else None
        try:
            return path.read_bytes() if path is not None else None
        except FileNotFoundError:
            return None  # drawn again meanwhile: the page asks for the new one next


class _SharedClients:
    """The operator's session, making one client per service for the dashboard's life: a look at a stack asks for
    a client at each call (operate.Stack.client), and making one costs more CPU than the call it makes."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._clients: dict[str, Any] = {}
        self._making = threading.Lock()

    def client(self, service: str) -> Any:
        with self._making:  # a boto3 session is not thread-safe; its clients are
            if service not in self._clients:
                self._clients[service] = self._session.client(service)
            return self._clients[service]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Handler(BaseHTTPRequestHandler):
    server: Server
    #: a connection a browser opened ahead of need and never used is let go after this long
    timeout = 30

    def do_GET(self) -> None:
        if self.headers.get("Host") not in self.server.hosts:
            # a page of another site that resolves its name to 127.0.0.1 (DNS rebinding) must not read the stack
            self._send(HTTPStatus.FORBIDDEN, b"this dashboard answers at 127.0.0.1 only\n", "text/plain")
            return
        path = unquote(urlsplit(self.path).path)
        board = self.server.dashboard
        if path == "/" or path.startswith("/run/"):
            self._send(HTTPStatus.OK, page(board.stack.name, board.refresh_s).encode(), "text/html; charset=utf-8")
        elif path == "/api/runs":
            self._json(HTTPStatus.OK, board.overview())
        elif path.startswith("/api/run/"):
            job_id = path.removeprefix("/api/run/")
            shown = board.run(job_id)
            if shown is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"stack {board.stack.name} has no run {job_id}"})
            else:
                self._json(HTTPStatus.OK, shown)
        elif path.startswith("/plot/") and path.endswith(".png"):
            job_id, _, name = path.removeprefix("/plot/").removesuffix(".png").rpartition("/")
            png = board.plot(job_id, name)
            if png is None:
                self._send(HTTPStatus.NOT_FOUND, b"no such plot\n", "text/plain")
            else:
                self._send(HTTPStatus.OK, png, "image/png")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _json(self, code: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(code, json.dumps(body, default=str).encode(), "application/json")

    def _send(self, code: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a page asks every few seconds, and the terminal is the user's."""


class Server(ThreadingHTTPServer):
    """The dashboard on 127.0.0.1:`port` (0: a free one), answering each request in a thread of its own."""

    daemon_threads = True
    block_on_close = False  # Ctrl-C stops it at once, whatever a page was being answered

    def __init__(self, dashboard: Dashboard, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.dashboard = dashboard
        self.hosts = {f"127.0.0.1:{self.server_port}", f"localhost:{self.server_port}"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # not a page that went away mid-answer
            super().handle_error(request, client_address)


def serve(stack: operate.Stack, port: int, for_seconds: float | None = None, as_json: bool = False) -> int:
    """Serve the dashboard of `stack` on 127.0.0.1:`port` (0: a free one) until Ctrl-C or SIGTERM, or for
    `for_seconds`; its plots live in a temporary directory, removed when it stops."""
    with tempfile.TemporaryDirectory(prefix="lustrain-dashboard-", ignore_cleanup_errors=True) as cache:
        try:
            server = Server(Dashboard(stack, Path(cache)), port)
        except OSError as exc:
            print(f"lustrain: cannot serve on 127.0.0.1:{port}: {exc.strerror} (--port 0 picks a free port)",
                  file=sys.stderr)
            return 2
        print(json.dumps({"url": server.url}) if as_json else f"dashboard: {server.url}", flush=True)
        stop = threading.Timer(for_seconds or 0, server.shutdown)
        stop.daemon = True
        if for_seconds:
            stop.start()
        # a process manager's stop ends it as Ctrl-C does (its temporary directory removed); and Ctrl-C stops it even
        # where whatever started it ignores SIGINT (a shell's background job, a test runner's worker), which Python
        # would otherwise keep ignoring
        on_main = threading.current_thread() is threading.main_thread()
        previous = (
            {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGINT)}
            if on_main
            else {}
        )
        try:
            server.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            stop.cancel()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.server_close()
    return 0


def page(stack_name: str, refresh_s: float) -> str:
    """The page: static but for the stack's name; every figure is put into it by its script, as text."""
    return (
        _PAGE.replace("{{stack}}", html.escape(stack_name))
        .replace("{{refresh_ms}}", str(int(refresh_s * 1000)))
    )


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lustrain: {{stack}}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; }
.banner { background: #fde2e1; border: 1px solid #e0a09c; padding: .5em .8em; margin: .5em 0; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: .25em .6em; border-bottom: 1px solid #ddd; vertical-align: top; }
tbody tr { cursor: pointer; } tbody tr:hover, tr.chosen { background: #eef4fb; }
[data-state=SUCCEEDED] { color: #17692c; }
[data-state=FAILED], [data-state=TIMED_OUT], [data-state=ABORTED] { color: #a3211a; }
progress { width: 8em; vertical-align: middle; margin-right: .4em; }
#plots { display: flex; flex-wrap: wrap; align-items: flex-start; gap: .5em; }
#plots img { max-width: 49%; border: 1px solid #ddd; }
pre { background: #f6f6f6; padding: .6em; max-height: 30em; overflow: auto; white-space: pre-wrap; }
#read { color: #666; }
</style></head>
<body>
<h1>lustrain runs of stack {{stack}} <span id="read"></span></h1>
<div id="error" class="banner" hidden></div>
<table><thead><tr><th>run</th><th>name</th><th>state</th><th>started (UTC)</th><th>in state</th><th>attempt</th><th>queue</th>
<th>training job</th><th>progress</th><th>elapsed</th><th>cost so far</th></tr></thead>
<tbody id="runs"><tr><td colspan="11">reading the stack...</td></tr></tbody></table>
<section id="run" hidden>
<h2 id="run-title"></h2><p><a href="/" id="all">all runs</a></p>
<div id="run-error" class="banner" hidden></div>
<div id="plots"></div>
<h2>log (last lines)</h2><pre id="log"></pre>
</section>
<script>
"use strict";
const REFRESH_MS = {{refresh_ms}};
const byId = (id) => document.getElementById(id);
let chosen = (location.pathname.match(/^\\/run\\/(.+)$/) || [null, null])[1];
chosen = chosen && decodeURIComponent(chosen);

function ago(s) {
  s = Math.floor(s || 0);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.floor(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function started(iso) { return (iso || "").replace("T", " ").slice(0, 16); }
function usd(x) { return "$" + Number(x).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2}); }
function banner(el, text) { el.textContent = text || ""; el.hidden = !text; }

function queueText(run) {
  const q = run.queue_place || {};
  if (q.state === "queued" && run.state === "RUNNING") {
    return "waiting in " + q.pool + ": place " + q.position + ", " + (q.ahead_instances || 0) +
      " instance(s) ahead, " + ago(q.queued_s) + " so far";
  }
  return q.admitted_at ? "admitted after " + ago(q.queued_s) : "";
}
function progressCell(td, run) {
  if (run.step === null && !run.training_job) return;
  if (run.max_steps) {
    const bar = document.createElement("progress");
    bar.max = run.max_steps; bar.value = run.step || 0;
    td.append(bar);
  }
  td.append(run.step === null ? "no step logged yet"
    : "step " + run.step + (run.max_steps ? " of " + run.max_steps : ""));
}

function render(snapshot) {
  banner(byId("error"), snapshot.error &&
    "reading the stack failed: " + snapshot.error + (snapshot.read_at ? " (shown: as read at " + snapshot.read_at + ")" : ""));
  byId("read").textContent = snapshot.read_at ? "read at " + snapshot.read_at : "";
  const rows = snapshot.runs.map((run) => {
    const tr = document.createElement("tr");
    tr.dataset.jobId = run.job_id;
    tr.classList.toggle("chosen", run.job_id === chosen);
    tr.addEventListener("click", () => choose(run.job_id));
    const job = run.training_job;
    const cost = usd(run.cost_so_far_usd) + (run.budget_usd === null ? "" : " of " + usd(run.budget_usd));
    const cells = [
      ["run", run.job_id], ["name", run.name], ["state", run.state + (run.error ? " (" + run.error + ")" : "")],
      ["started", started(run.created_at)], ["in-state", run.in_state || ""],
      ["attempt", run.attempt ? String(run.attempt) : "-"], ["queue", queueText(run)],
      ["training", job ? job.status + (job.secondary_status ? " (" + job.secondary_status + ")" : "") : ""],
      ["progress", null], ["elapsed", ago(run.elapsed_s)], ["cost", cost],
    ];
    for (const [name, text] of cells) {
      const td = tr.insertCell();
      td.className = name;
      if (name === "progress") progressCell(td, run); else td.textContent = text;
    }
    tr.cells[2].dataset.state = run.state;
    return tr;
  });
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = tr.insertCell(); td.colSpan = 11; td.textContent = "no runs in this stack yet";
    rows.push(tr);
  }
  byId("runs").replaceChildren(...rows);
}

function showRun(shown) {
  byId("run").hidden = false;
  byId("run-title").textContent = "run " + shown.job_id + " (" + shown.name + "): " + shown.state;
  banner(byId("run-error"), shown.error && "reading the run failed: " + shown.error);
  const plots = byId("plots");
  const kept = new Map([...plots.children].map((img) => [img.dataset.plot, img]));
  plots.replaceChildren(...shown.plots.map((plot) => {
    const img = kept.get(plot.name) || document.createElement("img");
    img.dataset.plot = plot.name; img.alt = plot.name; img.title = plot.name;
    if (img.getAttribute("src") !== plot.url) img.src = plot.url;
    return img;
  }));
  byId("log").textContent = shown.log.length ? shown.log.join("\\n") : "(no log lines yet)";
}

async function ask(path) {
  const answer = await fetch(path, {cache: "no-store"});
  const body = await answer.json().catch(() => ({error: "the dashboard answered HTTP " + answer.status}));
  if (!answer.ok) throw new Error(body.error || "HTTP " + answer.status);
  return body;
}

async function lookAtRuns() {
  try {
    render(await ask("/api/runs"));
  } catch (exc) {
    banner(byId("error"), "the dashboard does not answer: " + exc.message);
  } finally {
    setTimeout(lookAtRuns, REFRESH_MS);
  }
}

async function lookAtRun() {
  const wanted = chosen;
  if (wanted === null) { byId("run").hidden = true; return; }
  try {
    const shown = await ask("/api/run/" + encodeURIComponent(wanted));
    if (wanted === chosen) showRun(shown);
  } catch (exc) {
    if (wanted === chosen) { byId("run").hidden = false; banner(byId("run-error"), exc.message); }
  }
}
async function followRun() {
  await lookAtRun();
  setTimeout(followRun, REFRESH_MS);
}

function choose(jobId) {
  chosen = jobId;
  history.pushState(null, "", jobId === null ? "/" : "/run/" + encodeURIComponent(jobId));
  for (const tr of byId("runs").rows) tr.classList.toggle("chosen", tr.dataset.jobId === jobId);
  byId("plots").replaceChildren(); byId("log").textContent = "";
  lookAtRun();
}
byId("all").addEventListener("click", (event) => { event.preventDefault(); choose(null); });
window.addEventListener("popstate", () => {
  const found = location.pathname.match(/^\\/run\\/(.+)$/);
  chosen = found ? decodeURIComponent(found[1]) : null;
  lookAtRun();
});
lookAtRuns();
followRun();
</script>
</body></html>
"""
