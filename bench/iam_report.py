"""Least privilege, measured: per role of the stack, the actions its runs used and the grants no run used.

Runs on the twin, whose IAM authorizes and logs every call each role makes: the rehearsal of tests/e2e/quick.yaml,
of examples/p4d-50x-persistent.yaml scaled to this machine (PERSISTENT_2, output on Lustre exported at teardown),
and the fault matrix (bench/fault_matrix.py: every injected failure and throttling at each step). Then, per role:

    role=RegisterJobFunctionRole calls=41 actions_used=6 needed_statements=5 unused=2 justified=2
      unused RegisterJobFunctionRole/... s3:GetBucketLocation  (justified: ...)

An unused grant is either removed from template.yaml or justified there, in the template's Metadata under
`lustrain:grants-no-run-uses` ("<role>/<Sid or policy>": why), beside which this report reads it. Ends with
`unused_grants=`, `justified=` and `unjustified=` (the goal: 0). Every role's S3 object actions (GetObject,
PutObject, ...) must name their buckets: a grant of one on a wildcard bucket (`arn:aws:s3:::*/...`,
`arn:aws:s3:::team-*/...`, a bucket chosen by a policy variable) is listed as `WILDCARD_BUCKET` and counted in
`wildcard_buckets=` (the goal: 0), justified or not. The sweeper's own grants are exercised by
tests/e2e/test_sweeper.py, not here (it runs on its schedule, not in a run), and on_execution_end's by
tests/e2e/test_cancel.py (it runs for a stopped run).

    python bench/iam_report.py            (or: make iam-report)
"""

from __future__ import annotations

import fnmatch
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_matrix import run_matrix

from lustrain.twin.iam import enforce, usage
from lustrain.twin.rehearse import TEMPLATE, rehearse, scaled_to_this_machine
from lustrain.twin.stack import load_template

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "tests" / "e2e" / "quick.yaml"
EXAMPLE = ROOT / "examples" / "p4d-50x-persistent.yaml"
JUSTIFICATIONS = "lustrain:grants-no-run-uses"


#: S3 actions on objects (the Service Authorization Reference's "object" resource type) a grant may name
S3_OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:GetObjectVersion",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:GetObjectTagging",
    "s3:PutObjectTagging",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
    "s3:RestoreObject",
)


def wildcard_bucket_grants(policies: list[Any]) -> list[str]:
    """Allow statements granting an S3 object action on a bucket they do not name: `<policy>/<Sid> <action> <arn>`."""
    found = []
    for policy in policies:
        for statement in policy.statements:
            if statement.effect != "Allow" or statement.resources is None:
                continue
            actions = [
                granted
                for granted in statement.grants()
                if any(fnmatch.fnmatch(action.lower(), granted.lower()) for action in S3_OBJECT_ACTIONS)
            ]
            for resource in statement.resources:
                if resource == "*":
                    bucket = "*"
                elif ":s3:::" in resource:
                    bucket = resource.split(":s3:::", 1)[1].split("/", 1)[0]
                else:
                    continue
                if any(ch in bucket for ch in "*?") or "${" in bucket:
                    where = f"{policy.name.rsplit('/', 1)[-1]}/{statement.ref.sid or statement.ref.index}"
                    found += [f"{where} {action} {resource}" for action in actions]
    return found


def justification(justified: dict[str, str], role: str, ref: Any, action: str) -> str | None:
    """The template's reason for a grant no run uses: keyed by role and Sid (or policy name), optionally by action."""
    names = [ref.sid, ref.policy.rsplit("/", 1)[-1]]
    for name in filter(None, names):
        for key in (f"{role}/{name}/{action}", f"{role}/{name}", f"*/{name}"):
            for pattern, reason in justified.items():
                if fnmatch.fnmatchcase(key, pattern):
                    return reason
    return None


def main() -> int:
    roles: dict[str, usage.RoleUse] = {}

    def inspect(stack: Any, _result: Any) -> None:
        if not roles:
            roles.update(usage.collect(stack, records=[]))

    enforce.clear_log()
    outcomes = [rehearse(QUICK, inspect=inspect).status]
    with tempfile.TemporaryDirectory() as folder:
        outcomes.append(rehearse(scaled_to_this_machine(EXAMPLE, Path(folder)), inspect=inspect).status)
    results = run_matrix()
    print(f"rehearsals={','.join(outcomes)} fault_matrix_runs={len(results)}")
    by_arn = {use.role_arn: use for use in roles.values()}
    for record in enforce.log():
        if record.role_arn in by_arn:
            by_arn[record.role_arn].records.append(record)

    justified: dict[str, str] = (load_template(TEMPLATE).get("Metadata") or {}).get(JUSTIFICATIONS) or {}
    totals = {"unused": 0, "justified": 0, "unjustified": 0, "denied": 0, "wildcard_buckets": 0}
    for name, use in sorted(roles.items()):
        used = sorted({r.action for r in use.records if r.allowed})
        denied = sorted({r.action for r in use.records if not r.allowed})
        unused = usage.unused(use)
        lines = []
        count = {"justified": 0, "unjustified": 0}
        for ref, action in unused:
            reason = justification(justified, name, ref, action)
            count["justified" if reason else "unjustified"] += 1
            where = f"{ref.policy.rsplit('/', 1)[-1]}/{ref.sid or ref.index}"
            lines.append(
                f"  unused {where} {action}" + (f"  (justified: {reason})" if reason else "  UNJUSTIFIED")
            )
        print(
            f"role={name} calls={len(use.records)} actions_used={len(used)} "
            f"needed_statements={len(usage.needed(use))} unused={len(unused)} justified={count['justified']} "
            f"denied={len(denied)}"
        )
        if used:
            print(f"  used {' '.join(used)}")
        if denied:
            print(f"  denied {' '.join(denied)}")
        for line in lines:
            print(line)
        wildcards = wildcard_bucket_grants(use.policies)
        for grant in wildcards:
            print(f"  WILDCARD_BUCKET {grant}")
        totals["wildcard_buckets"] += len(wildcards)
        totals["unused"] += len(unused)
        totals["justified"] += count["justified"]
        totals["unjustified"] += count["unjustified"]
        totals["denied"] += len(denied)
    print(
        f"unused_grants={totals['unused']} justified={totals['justified']} unjustified={totals['unjustified']} "
        f"denied_actions={totals['denied']} wildcard_buckets={totals['wildcard_buckets']}"
    )
    return 0 if totals["unjustified"] == 0 and totals["wildcard_buckets"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
