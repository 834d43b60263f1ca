"""Which grants a stack's runs use: the twin's authorization log read per role, replayed without a statement.

After runs on the twin, `collect(stack)` pairs each role of the stack with its policies (as the twin
materialised them from template.yaml) and every authorization its sessions were given. From that:

- `needed(use)`: the statements that were the only grant of some request: removing one from the template makes
  that request AccessDenied (`replay` proves it, evaluating the recorded request again without it);
- `unused(use)`: the actions each Allow statement grants that no recorded request used (`make iam-report`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lustrain.twin.iam import enforce, world
from lustrain.twin.iam.policy import Decision, Policy, Statement, StatementRef, evaluate

__all__ = ["RoleUse", "collect", "denial", "evaluate", "needed", "replay", "unused", "without"]


@dataclass
class RoleUse:
    """One role of the stack: its logical id, policies, and the authorizations its sessions were given."""

    logical_id: str
    role_arn: str
    policies: list[Policy]
    records: list[enforce.Record] = field(default_factory=list)

    def statement(self, ref: StatementRef) -> Statement | None:
        for policy in self.policies:
            for statement in policy.statements:
                if statement.ref == ref:
                    return statement
        return None


def collect(stack: Any, records: Iterable[enforce.Record] | None = None) -> dict[str, RoleUse]:
    """Every IAM role of `stack` (a lustrain.twin.stack.Stack, still up) with the log's records of its sessions."""
    uses: dict[str, RoleUse] = {}
    for resource in stack.of_type("AWS::IAM::Role"):
        arn = str(resource.attrs["Arn"])
        uses[arn] = RoleUse(resource.logical_id, arn, world.role_policies(arn))
    for record in enforce.log() if records is None else records:
        if record.role_arn in uses:
            uses[record.role_arn].records.append(record)
    return {use.logical_id: use for use in uses.values()}


def _identity(use: RoleUse, ref: StatementRef) -> bool:
    return any(policy.name == ref.policy for policy in use.policies)


def needed(use: RoleUse) -> dict[StatementRef, list[enforce.Record]]:
    """The role's statements that alone allowed some request, with those requests."""
    found: dict[StatementRef, list[enforce.Record]] = {}
    for record in use.records:
        if record.allowed and len(record.statements) == 1 and _identity(use, record.statements[0]):
            found.setdefault(record.statements[0], []).append(record)
    return found


def without(policies: list[Policy], ref: StatementRef) -> list[Policy]:
    """The policies with one statement removed, as if it were deleted from the template."""
    return [Policy(p.name, tuple(s for s in p.statements if s.ref != ref)) for p in policies]


def replay(record: enforce.Record, policies: list[Policy]) -> Decision:
    """IAM's decision on a recorded request, against other identity policies (no resource policy allowed it)."""
    if record.request is None:
        raise ValueError(f"{record.operation}: the record holds no request to replay")
    return evaluate(record.request, policies)


def denial(record: enforce.Record, decision: Decision) -> str:
    """The AccessDenied message the service would answer the replayed request with."""
    assert record.request is not None
    return str(enforce.access_denied(record.service, record.operation, record.request, decision))


def still_allowed_without(use: RoleUse) -> dict[StatementRef, str]:
    """For each statement that alone allowed some request: removed from the role, does IAM refuse that request,
    naming its action? The statements for which it does not, with what happened instead (empty: least privilege
    holds for what the role did)."""
    problems: dict[StatementRef, str] = {}
    for ref, records in needed(use).items():
        decision = replay(records[0], without(use.policies, ref))
        if decision.allowed:
            problems[ref] = f"{records[0].action} still allowed without it"
        elif f"not authorized to perform: {records[0].action}" not in denial(records[0], decision):
            problems[ref] = f"refused, but not naming {records[0].action}: {denial(records[0], decision)}"
    return problems


def unused(use: RoleUse) -> list[tuple[StatementRef, str]]:
    """(statement, action pattern) of the role's Allow statements that no recorded request used."""
    used = [(r.action, set(r.statements)) for r in use.records if r.allowed]
    out = []
    for policy in use.policies:
        for statement in policy.statements:
            if statement.effect != "Allow" or statement.actions is None:
                continue
            for pattern in statement.actions:
                if not any(
                    statement.ref in refs and fnmatch.fnmatchcase(action.lower(), pattern.lower())
                    for action, refs in used
                ):
                    out.append((statement.ref, pattern))
    return out
