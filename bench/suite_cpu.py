"""Where the test suite's CPU goes: each test file's CPU seconds, its own process's and its children's (the twin's
trainers, torchrun), measured while the suite runs as `make test` runs it.

    .venv/bin/python bench/suite_cpu.py [PYTEST ARGS...]     e.g. tests/e2e, or nothing for the whole suite
    LUSTRAIN_SUITE_WORKERS=4 .venv/bin/python bench/suite_cpu.py  another number of workers than make test's 3

Lines are key=value: the totals (cpu_s, self_s, child_s, wall_s, tests), each top-level folder's CPU, then the
costliest files, most first. The suite is CPU-bound on two cores, so its wall time follows its CPU seconds: this
is what to read before making it faster. A test's self CPU counts every thread of its worker while it runs (the
twin's state machine included); a child's counts once the child has ended.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the folder each worker writes its figures to (set by main for the run it starts)
OUT_VARIABLE = "LUSTRAIN_SUITE_CPU_DIR"
#: the costliest files printed
TOP = 25

_rows: list[dict[str, Any]] = []


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    started, (own, children) = time.monotonic(), _cpu()
    yield
    own_after, children_after = _cpu()
    _rows.append(
        {
            "file": item.nodeid.split("::")[0],
            "self": own_after - own,
            "child": children_after - children,
            "wall": time.monotonic() - started,
        }
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(OUT_VARIABLE)
    if out and _rows:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"{worker}.json").write_text(json.dumps(_rows))


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as out:
        env = {
            **os.environ,
            OUT_VARIABLE: out,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        started = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            os.environ.get("LUSTRAIN_SUITE_WORKERS", "3"),
            "--dist",
            "loadfile",
            "--no-loadscope-reorder",
            "-q",
            "-p",
            "bench.suite_cpu",
            *args,
        ]
        code = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
        wall = time.monotonic() - started
        rows = [row for path in Path(out).glob("*.json") for row in json.loads(path.read_text())]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    folders: dict[str, float] = defaultdict(float)
    for row in rows:
        figures = files[row["file"]]
        figures[0] += row["self"]
        figures[1] += row["child"]
        figures[2] += row["wall"]
        folders["/".join(row["file"].split("/")[:2])] += row["self"] + row["child"]
    own, children = sum(f[0] for f in files.values()), sum(f[1] for f in files.values())
    print(
        f"tests={len(rows)} cpu_s={own + children:.0f} self_s={own:.0f} child_s={children:.0f} wall_s={wall:.0f}"
    )
    for folder, cpu in sorted(folders.items(), key=lambda kv: -kv[1]):
        print(f"folder={folder} cpu_s={cpu:.0f}")
    for name, (s, c, w) in sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:TOP]:
        print(f"file={name} cpu_s={s + c:.1f} self_s={s:.1f} child_s={c:.1f} wall_s={w:.1f}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
