"""`prepare` in stages (plan, work on N workers, merge): the same files whatever N, a retried worker that redoes only
what is missing, a merge that names the parts not made, and `--worker auto` on a SageMaker Processing instance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lustrain_trainer import prepare as prep
from lustrain_trainer.shards import read_index

from lustrain.cli import main as cli_main

#: small shards, so that the small corpus is cut into several parts and N workers each get some
SMALL = ["--shard-size", "8KiB", "--val-fraction", "0.1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 50 KB of real text (the stdlib's json package) and a file of accented text."""
    root = tmp_path_factory.mktemp("corpus")
    for rel, path in prep.source_files(prep.stdlib_source_dir(), "json/*.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(path.read_bytes())
    (root / "z" / "accents.txt").parent.mkdir()
    (root / "z" / "accents.txt").write_text("caf\u00e9 na\u00efve \u2014 \u00fcber \U0001f600\n" * 200)
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def work_in_process(corpus: Path, out: Path, workers: int) -> None:
    for k in range(workers):
        assert prep.main([str(corpus), str(out), "--stage", "work", "--worker", str(k), "--workers",
                          str(workers)]) == 0


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe:300"])
def test_one_two_and_four_workers_make_the_same_files_byte_for_byte(corpus: Path, tmp_path: Path,
                                                                    tokenizer: str) -> None:
    args = [*SMALL, "--tokenizer", tokenizer]
    one, two, four = tmp_path / "one", tmp_path / "two", tmp_path / "four"
    assert prep.main([str(corpus), str(one), *args]) == 0
    # two workers by stages, in this process; four as separate processes (each its own tokenizer library state), by
    # the command a user runs
    assert prep.main([str(corpus), str(two), *args, "--stage", "plan"]) == 0
    work_in_process(corpus, two, 2)
    assert prep.main([str(two), "--stage", "merge"]) == 0
    assert cli_main(["data", "prepare", str(corpus), str(four), *args, "--instances", "4"]) == 0

    files = tree(one)
    assert tree(two) == files and tree(four) == files
    plan = json.loads(files["prepare-plan.json"])
    assert len(plan["parts"]) == 5 and {p["split"] for p in plan["parts"]} == {"train", "val"}
    index = read_index(one)
    assert index.raw["source"]["bytes"] == sum(len(data) for data in tree(corpus).values())
    assert [s.path.name for s in index.splits["train"]][:2] == ["train-00000-000.bin", "train-00000-001.bin"]
    assert ("tokenizer.json" in files) == (tokenizer != "bytes")


def test_a_rerun_worker_skips_whole_parts_and_redoes_torn_ones(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert prep.main([str(corpus), str(out), *SMALL]) == 0
    before = tree(out)
    # part 1's worker died before its record; part 2's record is there but a shard of it was cut short
    (out / "parts" / "part-00001.json").unlink()
    torn = out / json.loads(before["parts/part-00002.json"])["shards"][0]["file"]
    torn.write_bytes(torn.read_bytes()[:100])
    untouched = {p.name: p.stat().st_mtime_ns for p in out.glob("*-00000-*.bin")}

    done = prep.work(prep.store_of(corpus), prep.store_of(out), 0, 1, say=lambda _: None)

    parts = len(json.loads(before["prepare-plan.json"])["parts"])
    assert done["made"] == [1, 2] and done["skipped"] == [p for p in range(parts) if p not in (1, 2)]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*-00000-*.bin")} == untouched
    assert prep.main([str(out), "--stage", "merge"]) == 0
    assert tree(out) == before


def test_merge_refuses_parts_not_made_naming_them(corpus: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert prep.main([str(corpus), str(out), *SMALL, "--stage", "plan"]) == 0
    assert prep.main([str(corpus), str(out), "--stage", "work", "--worker", "0", "--workers", "2"]) == 0
    capsys.readouterr()

    assert prep.main([str(out), "--stage", "merge"]) == 2

    parts = len(json.loads((out / "prepare-plan.json").read_text())["parts"])
    odd = ", ".join(f"part-{p:05d}" for p in range(1, parts, 2))
    assert f"{parts // 2} of {parts} parts are not whole in {out}: {odd} (run the work stage again" in (
        capsys.readouterr().err)
    assert not (out / "index.json").exists()


def test_worker_auto_takes_its_place_among_the_processing_jobs_hosts(corpus: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out, config = tmp_path / "out", tmp_path / "resourceconfig.json"
    assert prep.main([str(corpus), str(out), *SMALL, "--stage", "plan"]) == 0
    # the format SageMaker Processing documents; hosts sort as strings, the same on every instance
    config.write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-3", "algo-1", "algo-2"]}))
    auto = [str(corpus), str(out), "--stage", "work", "--worker", "auto", "--resource-config", str(config)]

    assert prep.main(auto) == 0

    parts = len(json.loads((out / "prepare-plan.json").read_text())["parts"])
    assert sorted(p.name for p in (out / "parts").iterdir()) == [f"part-{p:05d}.json" for p in range(1, parts, 3)]
    config.write_text(json.dumps({"current_host": "algo-9", "hosts": ["algo-1", "algo-2"]}))
    assert prep.main(auto) == 2
    assert "current_host 'algo-9' is not one of hosts ['algo-1', 'algo-2']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prep.main([str(corpus), str(out), "--stage", "work", "--worker", "4", "--workers", "4"])
    assert "--worker 4 is not allowed with --workers 4: use 0 to 3" in capsys.readouterr().err


def test_planning_again_keeps_the_parts_made_and_another_plan_removes_them(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert prep.main([str(corpus), str(out), *SMALL]) == 0
    made = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    assert prep.main([str(corpus), str(out), *SMALL, "--stage", "plan"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")} == made and (out / "index.json").exists()

    assert prep.main([str(corpus), str(out), "--shard-size", "1MiB", "--stage", "plan"]) == 0
    assert list(tree(out)) == ["plan/files-00000.json", "plan/files-00001.json", "prepare-plan.json"]


def test_a_shard_published_while_out_is_listed_is_passed_over_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker lists OUT while another renames its shard.tmp to the shard: the .tmp is found, then gone at its stat
    (tmp_path / "index.json").write_bytes(b"{}")
    (tmp_path / "val-00004-000.bin.tmp").write_bytes(b"x" * 8)
    real_stat, looked = Path.stat, {}

    def stat(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name.endswith(".tmp"):
            looked[self.name] = looked.get(self.name, 0) + 1
            if looked[self.name] > 1:  # is_file saw it; it was renamed before its size was read
                raise FileNotFoundError(2, "No such file or directory", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    assert prep.LocalStore(tmp_path).sizes() == {"index.json": 2}
    assert looked == {"val-00004-000.bin.tmp": 2}
