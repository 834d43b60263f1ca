"""The twin's fork server: one Python process that has imported torch once, and forks each job's entry point.

A trainer process spends most of a rehearsal's few steps importing torch, torch.distributed.checkpoint and
torch._dynamo (which the optimizer imports): about 3.5 of its 4 CPU-seconds on this machine. This process imports
them once; each `python ENTRY_POINT ARGS` (or `python -m MODULE ARGS`, such as torchrun) the twin starts is a fork
of it, set up as a fresh interpreter would be for that command: a session of its own (so the twin's kill reaches
its whole group), its niceness, working directory, environment, standard streams (the twin's pipes, passed over
the socket), sys.path (the entry point's folder or the working directory, then PYTHONPATH, then this interpreter's)
and sys.argv, default signal handlers; it then runs as `__main__`, and the interpreter's own exit (its exit
status, an uncaught exception's traceback, atexit, flushed streams) ends it.

Run by lustrain.twin.simulator.launcher as a script, with only the standard library and torch: nothing of the
project is imported here, so the job's own copy of its code (lustrain_trainer from the source directory) is what it
imports. Protocol, over an AF_UNIX SOCK_SEQPACKET socket (fd in argv[1]), each message one JSON object:
    server -> {"ready": true} once its imports are done, or {"ready": false, "error": "..."}
    client -> {"argv": [...], "cwd": ..., "env": {...}, "nice": N} with three fds (stdin, stdout, stderr)
    server -> {"started": PID}           the answer to each request, in order, once the child has its session
    server -> {"exit": PID, "code": N}   when a child ends: its exit status, -SIGNAL if a signal killed it
The server ends when the socket closes (the twin is gone); its children live on as a Popen's would.
"""

import os
import sys

# This script's folder is sys.path[0]: its neighbours (job.py, events.py, ...) must not shadow a job's modules.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import io
import json
import runpy
import selectors
import signal
import socket
import threading
from typing import Any

#: what every trainer imports, and torchrun (whose own module runs as __main__, so is not imported here: runpy
#: warns of a module run that is already imported), which a fork then finds in place
PRELOAD = (
    "torch",
    "torch.distributed.checkpoint",
    "torch._dynamo",
    "torch.distributed.launcher.api",
    "torch.distributed.elastic.rendezvous.utils",
    "torch.distributed.argparse_util",
)
#: the largest request (its environment included)
MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def serve(sock: socket.socket) -> dict[str, Any]:
    """Answer requests until the socket closes (then exit); returns only in a forked child, with its request."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wake_read, 4096)
                _reap(sock)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
            except InterruptedError:
                continue
            if not data:
                sys.exit(0)
            request = json.loads(data)
            settled_read, settled_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                selector.close()
                signal.set_wakeup_fd(-1)
                for fd in (wake_read, wake_write, settled_read, sock.detach()):
                    os.close(fd)
                return {**request, "fds": fds, "settled": settled_write}
            for fd in (*fds, settled_write):
                os.close(fd)
            # answered once the child has a session of its own, as Popen returns once its child has exec'd: a
            # kill of the process group from then on reaches it
            while os.read(settled_read, 1):
                pass
            os.close(settled_read)
            _send(sock, {"started": pid})
            _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _stream(fd: int, *, unbuffered: bool, errors: str, line_buffering: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    buffer: Any = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffer, encoding="utf-8", errors=errors, line_buffering=line_buffering, write_through=unbuffered
    )


def become(request: dict[str, Any]) -> None:
    """Turn this fork into `request["argv"]` run by a fresh interpreter, and run it (its exit is the process's)."""
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    if request.get("nice"):
        os.nice(int(request["nice"]))
    os.close(request["settled"])
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    env = dict(request["env"])
    os.environ.clear()
    os.environ.update(env)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = _stream(1, unbuffered=unbuffered, errors="strict", line_buffering=False)
    sys.stderr = _stream(2, unbuffered=unbuffered, errors="backslashreplace", line_buffering=True)
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # torch takes OMP_NUM_THREADS as it is imported, at most its default (the server's, imported without it)
    threads = env.get("OMP_NUM_THREADS", "")
    wanted = min(int(threads), DEFAULT_THREADS) if threads.isdigit() and int(threads) > 0 else DEFAULT_THREADS
    if wanted != _torch.get_num_threads():
        _torch.set_num_threads(wanted)
    argv = list(request["argv"][1:])
    pythonpath = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.path[:0] = [os.getcwd(), *pythonpath]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        program = os.path.abspath(argv[0])
        sys.path[:0] = [os.path.dirname(program), *pythonpath]
        sys.argv = [program, *argv[1:]]
        runpy.run_path(program, run_name="__main__")


#: torch, once imported, and its intra-op threads here, where it was imported without OMP_NUM_THREADS (launcher.py
#: leaves it out of this process's environment)
_torch: Any = None
DEFAULT_THREADS = 1


def main() -> None:
    global _torch, DEFAULT_THREADS
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        for name in PRELOAD:
            __import__(name)
        _torch = sys.modules["torch"]
        DEFAULT_THREADS = _torch.get_num_threads()
    except Exception as exc:  # torch absent or broken: the twin starts its jobs as processes of their own
        _send(sock, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    if threading.active_count() != 1:
        _send(
            sock, {"ready": False, "error": f"{threading.active_count()} threads after the imports: no fork"}
        )
        return
    _send(sock, {"ready": True})
    become(serve(sock))


if __name__ == "__main__":
    main()
