"""How the twin starts a job's process, and the fork server that starts most of them.

A job's command that runs Python on an entry point or a module (`python train.py ARGS`, torchrun as
`python -m torch.distributed.run ARGS`) is forked from the fork server (fork_server.py), which has imported torch
once for this twin: the job then starts in a few milliseconds instead of 3-4 CPU-seconds of imports. Anything else
(a shell script, `python -c`, a ContainerEntrypoint), or any command where the fork server cannot run (torch absent
from this interpreter), or with `fork_server` off in the simulator's settings (LUSTRAIN_TWIN_FORK_SERVER=0), is a
process of its own, as before. Either way the caller gets the same thing: a process in a session of its own at the
niceness asked for, its stdin /dev/null, its stdout and stderr pipes to read, and poll/wait/send_signal/kill as
subprocess.Popen has them; its exit status is the interpreter's (-SIGNAL where a signal killed it).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Protocol

import psutil

log = logging.getLogger("lustrain.twin.sagemaker")

SERVER = Path(__file__).with_name("fork_server.py")
#: seconds the first job waits for the fork server's imports before it starts a process of its own instead
READY_TIMEOUT_S = 120.0
#: how often a forked process is looked for once the fork server that reports its exit is gone
ORPHAN_POLL_S = 0.2


class JobProcess(Protocol):
    """What the twin uses of a job's process: subprocess.Popen's, and Forked's."""

    pid: int

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def stderr(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def niced(command: list[str], niceness: int) -> list[str]:
    """The command run at `niceness` by POSIX nice(1), which execs it (same process, so stop and kill reach it,
    and every process it starts inherits the priority from its first instruction); as given at 0 or without nice."""
    nice = shutil.which("nice") if niceness > 0 else None
    return [nice, "-n", str(niceness), *command] if nice else command


def forkable(command: list[str]) -> bool:
    """Whether the fork server can start `command`: this interpreter on a Python file or with -m MODULE."""
    if len(command) < 2 or command[0] != sys.executable:
        return False
    if command[1] == "-m":
        return len(command) > 2
    return not command[1].startswith("-") and command[1].endswith(".py")


def start(
    command: list[str], *, cwd: Path, env: dict[str, str], niceness: int, fork_server: bool = True
) -> JobProcess:
    """Start a job's command: forked from the fork server where it can, else as a process of its own."""
    global _forked
    if fork_server and forkable(command):
        forked = _server().start(command, cwd=cwd, env=env, niceness=niceness)
        if forked is not None:
            with _lock:
                _forked += 1
            return forked
    return subprocess.Popen(
        niced(command, niceness),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def warm(enabled: bool = True) -> None:
    """Start the fork server now, if it is not running, so that its imports overlap a job's download."""
    if enabled:
        _server()


class Forked:
    """A process the fork server started, with what the twin uses of subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        #: the command and the read ends of its pipes, which the caller of ForkServer.start gives it
        self.args: list[str] = []
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One fork server process and the thread that reads its answers (started, exited)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # its torch is imported without OMP_NUM_THREADS, so its default is torch's own: each fork applies the job's
        env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "OMP_NUM_THREADS")}
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                cwd=tempfile.gettempdir(),
                start_new_session=True,  # a Ctrl-C at the terminal is the twin's to handle, not the server's
            )
        self._socket = ours
        self._ready = threading.Event()
        self.usable = False
        #: each request's Forked (None: the server is gone), made by the reader as the server answers, so that it
        #: is known before the server can report its exit
        self._answers: queue.Queue[Forked | None] = queue.Queue()
        self._request_lock = threading.Lock()
        self._lock = threading.Lock()
        self._live: dict[int, Forked] = {}
        threading.Thread(target=self._read, name="twin-fork-server", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and (self.usable or not self._ready.is_set())

    def start(self, command: list[str], *, cwd: Path, env: dict[str, str], niceness: int) -> Forked | None:
        """The command forked, or None where the fork server cannot (the caller then starts a process)."""
        if not self._ready.wait(READY_TIMEOUT_S) or not self.usable:
            return None
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        request = {"argv": command, "cwd": str(cwd), "env": env, "nice": niceness}
        try:
            with self._request_lock:
                try:
                    socket.send_fds(
                        self._socket, [json.dumps(request).encode()], [stdin, out_write, err_write]
                    )
                except OSError:
                    forked = None
                else:
                    forked = self._answers.get()
        finally:
            for fd in (stdin, out_write, err_write):
                os.close(fd)
        if forked is None:
            os.close(out_read)
            os.close(err_read)
            return None
        forked.args = command
        forked.stdout = open(out_read, "rb")  # noqa: SIM115 (the job's, closed by whoever reads it to its end)
        forked.stderr = open(err_read, "rb")  # noqa: SIM115
        return forked

    def _read(self) -> None:
        while True:
            try:
                data = self._socket.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "ready" in message:
                self.usable = bool(message["ready"])
                if not self.usable:
                    log.info(
                        "twin fork server unusable (%s): each job starts its own Python", message.get("error")
                    )
                self._ready.set()
            elif "started" in message:
                forked = Forked(int(message["started"]))
                with self._lock:
                    self._live[forked.pid] = forked
                self._answers.put(forked)
            elif "exit" in message:
                with self._lock:
                    ended = self._live.pop(int(message["exit"]), None)
                if ended is not None:
                    ended._end(int(message["code"]))
        # the server is gone: nothing more is started by it, and its children's exits are looked for by pid
        self.usable = False
        self._ready.set()
        self._answers.put(None)
        with self._lock:
            orphans, self._live = list(self._live.values()), {}
        for forked in orphans:
            threading.Thread(target=_watch_orphan, args=(forked,), daemon=True).start()


def _watch_orphan(forked: Forked) -> None:
    """A forked process whose fork server died ends, for the twin, when its pid is gone or a zombie nobody reaps
    (its status is then unknown: 1)."""
    while True:
        try:
            if psutil.Process(forked.pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(ORPHAN_POLL_S)
    forked._end(1)


_lock = threading.Lock()
_instance: ForkServer | None = None
_forked = 0


def forked_count() -> int:
    """How many processes this twin's fork servers have started."""
    with _lock:
        return _forked


def _server() -> ForkServer:
    """This twin's fork server, started at its first use (again if it has ended)."""
    global _instance
    with _lock:
        if _instance is None or not _instance.alive:
            _instance = ForkServer()
        return _instance
