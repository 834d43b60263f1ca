"""Teardown's identity family: a data preparation run's own IAM role (steps/prepare_role), deleted last: SageMaker
deletes its processing instances' network interfaces with it, so it goes only once the network is gone. A role
without this run's and this stack's tags is never touched."""

from __future__ import annotations

from typing import Any

from lustrain_core import clients
from lustrain_core import resources as registry
from lustrain_core.steps import prepare_role
from lustrain_core.steps.teardown_base import Scope

ROLE = registry.IAM_ROLE.name


class Roles(Scope):
    _iam: Any = None

    @property
    def iam(self) -> Any:
        # built only for a preparation run's teardown: a training run makes no role
        if self._iam is None:
            self._iam = clients.client("iam")
        return self._iam

    def discover_role(self) -> list[dict[str, str]]:
        """The run's role where it exists and is this run's (a look that made it, then failed before recording it,
        cannot happen: the ledger has it first; this finds it when the record is gone)."""
        name = prepare_role.role_name(self.job_id)
        found = prepare_role.find(self.iam, name)
        return [{"type": ROLE, "id": name}] if found is not None and self.ours(found.get("Tags")) else []

    def delete_role(self, name: str) -> None:
        entry = {"type": ROLE, "id": name}
        outcome = prepare_role.delete(self.iam, name, self.job_id, self.settings)
        if outcome == "deleted":
            self.report.deleted.append(entry)
        elif outcome == "gone":
            self.report.already_gone.append(entry)
        else:
            self.report.kept.append({**entry, "reason": "not tagged as this job's: never deleted"})
