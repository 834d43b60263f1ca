"""What a data preparation writes under its output (OUT), named once: the trainer's stages write and replace these,
and the control plane refuses a preparation whose output holds anything else (another run's data), since the
preparation's own role may write and delete there.

Pure: standard library only, so the control plane carries a copy (scripts/refresh_trainer_plan.py).
"""

from __future__ import annotations

import re

INDEX_NAME = "index.json"
PLAN_NAME = "prepare-plan.json"
TOKENIZER_FILE = "tokenizer.json"
#: the parts' records and the plan's file lists, each in a folder of its own
PARTS_DIR = "parts"
PLAN_LISTS_DIR = "plan"
OUTPUT_FOLDERS = frozenset({PARTS_DIR + "/", PLAN_LISTS_DIR + "/"})
#: a shard (`shards.shard_name`: <split>-<part>-<number>.bin), or one being written beside its place
SHARD = re.compile(r"(?:train|val)-[0-9-]+\.bin(?:\.tmp)?")


def is_output(rel: str) -> bool:
    """A file a preparation writes into OUT (and a new plan replaces), by its path relative to OUT."""
    return (
        rel in (INDEX_NAME, PLAN_NAME, TOKENIZER_FILE)
        or rel.startswith(tuple(OUTPUT_FOLDERS))
        or SHARD.fullmatch(rel) is not None
    )
