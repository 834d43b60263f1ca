"""Recompile the registered job in each events/ sample that carries one (its plan and launch plan), as register_job
would for the sample's spec and job id, and write each section the steps make ($.network, $.filesystem, $.code,
$.poll) as its run-document model holds it: run after changing the planner, the launch compiler or those models.

    .venv/bin/python scripts/refresh_events.py

tests/unit/test_events.py checks that every sample equals what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lustrain_core.config import Settings
from lustrain_core.document import SECTIONS
from lustrain_core.launch import registered
from lustrain_core.prepare_plan import planned
from lustrain_core.spec import is_prepare, validate_prepare_spec, validate_spec
from lustrain_core.steps.records import PREPARE, TRAIN

EVENTS = Path(__file__).resolve().parents[1] / "events"
#: the samples' stack: `sam local invoke` runs them under the template's defaults
SETTINGS = Settings()


def refreshed(document: dict) -> dict:
    for name, (model, _) in SECTIONS.items():
        if isinstance(document.get(name), dict):
            document[name] = model.model_validate(document[name]).model_dump(mode="json", exclude_none=name == "poll")
    job = document.get("job")
    if not isinstance(job, dict) or "spec" not in job:
        return document
    if is_prepare(job["spec"]):
        # a data preparation run: its plan, from the source's size it was planned for
        prepared = validate_prepare_spec(job["spec"])
        job.update(kind=PREPARE, spec=prepared.model_dump(mode="json"))
        job["plan"] = planned(prepared, float(job.get("plan", {}).get("source_gib") or prepared.size_gib or 1))
        return document
    spec = validate_spec(job["spec"])
    job["kind"] = TRAIN
    job.update(registered(spec, job["job_id"], SETTINGS, data_gib=job.get("plan", {}).get("filesystem", {}).get("data_gib")))
    return document


def main() -> int:
    changed = 0
    for path in sorted(EVENTS.glob("*.json")):
        text = path.read_text()
        new = json.dumps(refreshed(json.loads(text)), indent=2) + "\n"
        if new != text:
            path.write_text(new)
            changed += 1
            print(f"refreshed {path.name}")
    print(f"{changed} sample(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
