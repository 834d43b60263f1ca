"""`lustrain rehearse SPEC --tokenizer`: the tokenizer the rehearsal's example data is prepared with, refused before
anything starts when it cannot be, and the example data's cache keyed by what the tokenizer is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lustrain.cli import main
from lustrain.twin import rehearse

LLAMA_SPEC = Path(__file__).parents[2] / "examples" / "llama-tiny.yaml"


@pytest.mark.parametrize(
    ("tokenizer", "says"),
    [
        ("bpe:12", "VOCAB must be a whole number from 257"),
        ("s3://my-team-datasets/tokenizer.json", "the twin's S3 starts empty"),
        ("no/such/tokenizer.json", "no such file"),
    ],
)
def test_rehearse_refuses_a_tokenizer_it_cannot_prepare_data_with_before_the_twin_starts(
    tokenizer: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_twin(*args: object, **kwargs: object) -> None:
        raise AssertionError("the twin started for a rehearsal whose --tokenizer is refused")

    monkeypatch.setattr(rehearse, "twin", no_twin)
    assert main(["rehearse", str(LLAMA_SPEC), "--tokenizer", tokenizer]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer" in err and says in err and tokenizer in err


def test_example_data_of_a_tokenizer_json_is_cached_by_its_content_not_its_path(tmp_path: Path) -> None:
    bpe = rehearse.example_shards("64KiB", "bpe:300", cache_root=tmp_path / "cache")
    first, second = tmp_path / "a" / "tokenizer.json", tmp_path / "b" / "tokenizer.json"
    for path in (first, second):
        path.parent.mkdir()
        shutil.copyfile(bpe / "tokenizer.json", path)

    by_first = rehearse.example_shards("64KiB", str(first), cache_root=tmp_path / "cache")
    assert rehearse.example_shards("64KiB", str(second), cache_root=tmp_path / "cache") == by_first
    assert by_first != bpe
    # the same tokenizer gives the same tokens, whether trained here or read from its file
    index, trained = (json.loads((d / "index.json").read_text()) for d in (by_first, bpe))
    assert index["tokenizer"]["sha256"] == trained["tokenizer"]["sha256"]
    assert [s["sha256"] for s in index["splits"]["train"]["shards"]] == [
        s["sha256"] for s in trained["splits"]["train"]["shards"]
    ]

    # another tokenizer at the same path is other data
    text = json.loads(first.read_text())
    text["added_tokens"] = [
        *text.get("added_tokens", []),
        {**text["added_tokens"][0], "id": 299, "content": "<x>"},
    ]
    first.write_text(json.dumps(text))
    assert rehearse.example_shards("64KiB", str(first), cache_root=tmp_path / "cache") != by_first
