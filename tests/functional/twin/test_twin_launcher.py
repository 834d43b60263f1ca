"""The twin's fork server starts a job's Python as a fresh interpreter would, only without importing torch again.

Each test runs the same command both ways, forked (launcher.start) and as a process of its own (fork_server off:
subprocess.Popen), and compares what the program sees and what the twin sees of it: argv, working directory,
environment, sys.path, session, niceness, signal handlers, streams, exit status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lustrain.twin.simulator import launcher
from lustrain.twin.simulator.lifecycle import Settings, kill

PROBE = """\
import importlib.util, json, os, signal, sys
import lustrain_trainer
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path[:3], "variable": os.environ.get("PROBE"),
    "home": os.environ.get("HOME"), "own_session": os.getsid(0) == os.getpid(), "nice": os.nice(0),
    "sigterm": int(signal.getsignal(signal.SIGTERM)), "sigint": signal.getsignal(signal.SIGINT).__name__,
    "stdin": sys.stdin.read(), "name": __name__, "file": __file__, "trainer": lustrain_trainer.WHOSE,
    "torch_imported": "torch" in sys.modules, "twin_modules": importlib.util.find_spec("fork_server") is not None,
    "threads": __import__("torch").get_num_threads(),
}))
print("to stderr", file=sys.stderr)
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "raise":
    raise ValueError("boom")
if what == "exit":
    sys.exit(3)
if what == "wait":
    print("waiting", flush=True)
    signal.pause()
"""


#: OMP_NUM_THREADS of each probe: one thread (the twin's jobs' default), and more than the machine's cores, which
#: torch takes at most
THREADS = {"entry point": "1", "module": str((os.cpu_count() or 1) + 1)}


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """A job's source directory: the probe, and a lustrain_trainer of its own (the project's is installed too)."""
    folder = tmp_path / "code"
    (folder / "lustrain_trainer").mkdir(parents=True)
    (folder / "lustrain_trainer" / "__init__.py").write_text('WHOSE = "the job\'s own"\n')
    (folder / "probe.py").write_text(PROBE)
    (folder / "probe_module.py").write_text(PROBE)
    return folder


def run(
    code: Path, args: list[str], *, forked: bool, niceness: int = 3, threads: str = "1"
) -> tuple[Any, int, str, str]:
    command = [sys.executable, *args]
    env = {
        "PROBE": "set",
        "PATH": os.environ["PATH"],
        "PYTHONUNBUFFERED": "1",
        "HOME": str(code),
        "OMP_NUM_THREADS": threads,
    }
    before = launcher.forked_count()
    process = launcher.start(command, cwd=code, env=env, niceness=niceness, fork_server=forked)
    assert launcher.forked_count() == before + forked
    assert isinstance(process, launcher.Forked) == forked
    assert process.stdout is not None and process.stderr is not None
    out, err = process.stdout.read().decode(), process.stderr.read().decode()
    code_ = process.wait(timeout=60)
    return json.loads(out.splitlines()[0]), code_, out, err


@pytest.mark.parametrize("args", [["probe.py"], ["-m", "probe_module"]], ids=["entry point", "module"])
def test_a_forked_program_sees_what_a_fresh_interpreter_sees(
    code: Path, args: list[str], request: pytest.FixtureRequest
) -> None:
    threads = THREADS[request.node.callspec.id]
    forked, forked_code, _, forked_err = run(code, [*args, "a", "b"], forked=True, threads=threads)
    own, own_code, _, own_err = run(code, [*args, "a", "b"], forked=False, threads=threads)

    assert forked_code == own_code == 0
    assert forked_err == own_err == "to stderr\n"
    assert forked.pop("torch_imported") is True and own.pop("torch_imported") is False
    if args[0] == "probe.py":  # python names a script's argv[0] as given; the fork, by its absolute path
        assert (forked["argv"][0], own["argv"][0]) == (str(code / "probe.py"), "probe.py")
        forked["argv"][0] = own["argv"][0]
    assert forked == own
    assert own["argv"][1:] == ["a", "b"] and own["name"] == "__main__" and own["cwd"] == str(code)
    assert own["path"][0] == str(code) and own["trainer"] == "the job's own"
    assert own["variable"] == "set" and own["home"] == str(code) and own["stdin"] == ""
    assert own["own_session"] is True and own["nice"] == 3
    assert own["sigterm"] == int(signal.SIG_DFL) and own["sigint"] == "default_int_handler"
    # torch's threads as OMP_NUM_THREADS says (at most its default), though the fork server imported torch first
    assert own["threads"] == 1 if threads == "1" else own["threads"] >= 1
    # the fork server's neighbours (job.py, events.py, ...) shadow none of the job's modules
    assert own["twin_modules"] is False


@pytest.mark.parametrize(
    ("what", "status", "last_error_line"),
    [("exit", 3, "to stderr"), ("raise", 1, "ValueError: boom")],
)
def test_a_forked_program_ends_with_the_status_and_traceback_of_a_fresh_one(
    code: Path, what: str, status: int, last_error_line: str
) -> None:
    for forked in (True, False):
        _, exit_code, _, err = run(code, ["probe.py", what], forked=forked)
        assert (exit_code, err.splitlines()[-1]) == (status, last_error_line), forked


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "own process"])
def test_a_forked_program_is_signalled_and_killed_as_a_process_of_its_own(code: Path, forked: bool) -> None:
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
    waiting = launcher.start(
        [sys.executable, "probe.py", "wait"], cwd=code, env=env, niceness=0, fork_server=forked
    )
    assert waiting.stdout is not None
    waiting.stdout.readline()
    # printed while it runs: the twin's log follows a live job
    assert waiting.stdout.readline() == b"waiting\n"
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGTERM)  # no handler: SIGTERM's default action
    assert waiting.wait(timeout=60) == -signal.SIGTERM

    killed = launcher.start(
        [sys.executable, "probe.py", "wait"], cwd=code, env=env, niceness=0, fork_server=forked
    )
    assert killed.stdout is not None
    killed.stdout.readline()
    killed.stdout.readline()
    kill(killed)  # the twin's kill of a job: its whole session
    assert killed.wait(timeout=60) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(killed.pid, 0)


def test_a_wait_that_runs_out_says_so_as_popens_does(code: Path) -> None:
    env = {"PATH": os.environ["PATH"]}
    process = launcher.start([sys.executable, "probe.py", "wait"], cwd=code, env=env, niceness=0)
    started = time.monotonic()
    with pytest.raises(launcher.subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    kill(process)
    assert process.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.parametrize(
    ("command", "forkable"),
    [
        ([sys.executable, "train.py", "--steps", "2"], True),
        ([sys.executable, "-m", "torch.distributed.run", "--standalone", "train.py"], True),
        ([sys.executable, "-c", "print(1)"], False),
        ([sys.executable, "-m"], False),
        (["/bin/sh", "train.sh"], False),
        # another interpreter than the one the fork server imported torch in
        (["/usr/bin/python3", "train.py"], False),
        ([sys.executable, "entry"], False),
    ],
)
def test_only_this_interpreter_on_a_python_file_or_module_is_forked(
    command: list[str], forkable: bool
) -> None:
    assert launcher.forkable(command) is forkable


def test_the_fork_server_is_on_unless_the_environment_turns_it_off() -> None:
    assert Settings.from_env({}).fork_server is True
    assert Settings.from_env({"LUSTRAIN_TWIN_FORK_SERVER": "0"}).fork_server is False


def test_a_job_outlives_a_fork_server_that_dies_and_the_next_job_gets_a_new_one(
    code: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server that started a job crashes: the job runs on, the twin still sees it end (status unknown),
    and the next job is forked from a fork server started again."""
    monkeypatch.setattr(
        launcher, "_instance", None
    )  # a server of this test's own; the module's comes back after
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
    job = launcher.start([sys.executable, "probe.py", "wait"], cwd=code, env=env, niceness=0)
    assert isinstance(job, launcher.Forked) and job.stdout is not None
    job.stdout.readline()
    first = launcher._server()
    first.process.kill()
    first.process.wait(timeout=60)
    assert job.poll() is None and job.stdout.readline() == b"waiting\n"  # still running
    kill(job)
    assert job.wait(timeout=60) == 1
    again = launcher.start([sys.executable, "probe.py"], cwd=code, env=env, niceness=0)
    assert isinstance(again, launcher.Forked) and launcher._server() is not first
    assert again.wait(timeout=60) == 0


FAKE_SERVER = """\
import json, socket, sys
socket.socket(fileno=int(sys.argv[1])).send(json.dumps({"ready": False, "error": "no torch here"}).encode())
"""


def test_where_the_fork_server_cannot_import_torch_each_job_is_a_process_of_its_own(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tmp_path / "fork_server.py"
    server.write_text(FAKE_SERVER)
    monkeypatch.setattr(launcher, "SERVER", server)
    monkeypatch.setattr(launcher, "_instance", None)
    before = launcher.forked_count()
    process = launcher.start(
        [sys.executable, "probe.py", "exit"], cwd=code, env={"PATH": os.environ["PATH"]}, niceness=0
    )
    assert not isinstance(process, launcher.Forked) and launcher.forked_count() == before
    assert process.wait(timeout=60) == 3
