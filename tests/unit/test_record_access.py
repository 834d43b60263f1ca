"""The job record is read and written through steps/records.py alone: no other module of the stack or the CLI
addresses the jobs table, names an attribute only the record has, or reads a record as a mapping (JobRecord has
no mapping access, so mypy refuses record["status"] and record.get("status") wherever a record is typed)."""

from __future__ import annotations

import ast
from pathlib import Path

from lustrain_core.steps.records import JobRecord

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "functions" / "lustrain_core" / "steps" / "records.py"

#: stored names that other documents use too, so a string of them elsewhere is not the record's: the state
#: document's $.job (job_id, kind, spec, plan, launch, source) and $.error, an execution's name and status in
#: Step Functions' and SageMaker's answers, EventBridge's `resources`, teardown's result (`torn_down`), the
#: tokens table's `created_at` and a start's input `team`
SHARED = frozenset(
    {
        "job_id",
        "kind",
        "spec",
        "plan",
        "launch",
        "source",
        "error",
        "execution",
        "status",
        "resources",
        "torn_down",
        "created_at",
        "team",
    }
)


def record_only_names() -> frozenset[str]:
    return frozenset(JobRecord.stored_names()) - SHARED


#: the DynamoDB calls that read or write items (creating the table is the template's, and the twin's, business)
ITEM_CALLS = frozenset({"get_item", "put_item", "update_item", "delete_item", "query", "scan", "paginate"})


def offences(source: str) -> list[str]:
    """What in `source` reads or writes the job record past records.py: an item call on the jobs table, or a
    string naming an attribute only the record has."""
    found = []
    names = record_only_names()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ITEM_CALLS
        ):
            for keyword in node.keywords:
                if keyword.arg == "TableName" and "jobs_table" in ast.unparse(keyword.value):
                    found.append(
                        f"line {node.lineno}: {node.func.attr}(TableName={ast.unparse(keyword.value)})"
                    )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def modules() -> list[Path]:
    return sorted(p for root in ("functions", "lustrain") for p in (ROOT / root).rglob("*.py") if p != MODEL)


def test_no_module_but_records_reads_or_writes_the_job_records_stored_keys() -> None:
    found = {str(p.relative_to(ROOT)): hits for p in modules() if (hits := offences(p.read_text()))}
    assert found == {}, "the job record is read and written through steps/records.py (JobRecord): " + repr(
        found
    )


def test_the_check_finds_a_raw_read_and_a_direct_write() -> None:
    assert offences('n = int(record.get("training_attempts") or 0)') == ["line 1: 'training_attempts'"]
    assert offences('set_fields(ddb, t, j, {"judged_attempt": 2})') == ["line 1: 'judged_attempt'"]
    assert offences("ddb.update_item(TableName=settings.jobs_table, Key=k)") == [
        "line 1: update_item(TableName=settings.jobs_table)"
    ]
    assert offences("ddb.create_table(TableName=settings.jobs_table)") == []
    assert offences('record.judged_attempt; record.status == "RUNNING"') == []


def test_a_record_is_no_mapping() -> None:
    assert not any(
        hasattr(JobRecord, name) for name in ("get", "__getitem__", "__contains__", "keys", "items")
    )


def test_the_names_the_check_holds_are_the_models() -> None:
    """Every shared name is a stored one (a renamed field is not silently let through)."""
    assert set(JobRecord.stored_names()) >= SHARED
    assert {"training_attempts", "judged_attempt", "finished_at", "warm_pool_offered"} <= record_only_names()
