"""IAM policy evaluation as AWS documents it: statements, wildcards, conditions, and the decision.

What is implemented, from the IAM User Guide's "Policy evaluation logic" and "IAM JSON policy elements"
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html,
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements.html):
- the decision, for a request inside one account: an explicit Deny in any applicable policy wins; else an Allow in
  an identity-based policy of the principal or in the resource's resource-based policy allows; else the request
  is implicitly denied;
- Action / NotAction (case-insensitive, `*` and `?` wildcards), Resource / NotResource (case-sensitive, wildcards
  within each of an ARN's six colon-separated parts), Principal / NotPrincipal for resource-based and trust
  policies (`*`, AWS account ids and ARNs, role ARNs matching the role's sessions, service principals);
- Condition: the String*, Arn*, Numeric*, Bool and Null operators, the `...IfExists` suffix and the
  `ForAllValues:` / `ForAnyValue:` qualifiers, keys matched case-insensitively, several values of one key OR-ed,
  several keys and operators AND-ed; a key missing from the request context makes a condition false, except for
  the negated operators (`StringNotEquals`, `ArnNotLike`, ...), `...IfExists` and `ForAllValues:`, which are true
  ("Condition operators" and "Multivalued context keys" in the same guide).
An operator outside these raises UnsupportedPolicy rather than guessing: a twin that allows what AWS refuses is
worse than one that stops.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

#: A request context value: a single-valued key holds a string (or bool), a multivalued one a list of strings.
ContextValue = str | bool | int | float | Sequence[str]

Effect = Literal["Allow", "Deny"]


class UnsupportedPolicy(ValueError):
    """A policy uses an element or operator the twin does not evaluate."""


@dataclass(frozen=True)
class Principal:
    """Who makes a request: a role session (a Lambda function, a SageMaker job) or an AWS service."""

    #: the caller's ARN as AWS reports it: arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION, or the service's name
    arn: str
    account: str
    role_arn: str | None = None
    service: str | None = None

    @classmethod
    def role_session(cls, role_arn: str, session: str) -> Principal:
        account, role_name = _role_parts(role_arn)
        return cls(
            arn=f"arn:aws:sts::{account}:assumed-role/{role_name}/{session}",
            account=account,
            role_arn=role_arn,
        )

    @classmethod
    def aws_service(cls, service: str, account: str) -> Principal:
        return cls(arn=service, account=account, service=service)


def _role_parts(role_arn: str) -> tuple[str, str]:
    parts = role_arn.split(":", 5)
    if len(parts) != 6 or not parts[5].startswith("role/"):
        raise ValueError(f"not a role ARN: {role_arn!r}")
    return parts[4], parts[5].rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Request:
    """One authorization: the principal, the action, the resource (an ARN, or "*") and the request context."""

    principal: Principal
    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)

    def value(self, key: str) -> list[str] | None:
        """The context key's values as strings (condition keys are case-insensitive); None when absent."""
        for name, value in self.context.items():
            if name.lower() == key.lower():
                if isinstance(value, bool):
                    return [str(value).lower()]
                if isinstance(value, str | int | float):
                    return [str(value)]
                return [str(v) for v in value]
        return None


@dataclass(frozen=True)
class StatementRef:
    """Where a statement lives: its policy's name and its position there (and Sid, when it has one)."""

    policy: str
    index: int
    sid: str | None

    def __str__(self) -> str:
        return f"{self.policy}#{self.sid or self.index}"


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


@cache
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def glob_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return _glob(pattern, ignore_case).fullmatch(value) is not None


def arn_match(pattern: str, arn: str) -> bool:
    """An ARN pattern against an ARN, each of the six parts on its own (wildcards never span a colon there)."""
    if pattern == "*":
        return True
    want, have = pattern.split(":", 5), arn.split(":", 5)
    if len(want) != 6 or len(have) != 6:
        return glob_match(pattern, arn)
    return all(glob_match(w, h) for w, h in zip(want, have, strict=True))


def _string_equals(value: str, wanted: str) -> bool:
    return value == wanted


def _numeric(compare: Callable[[float, float], bool]) -> Callable[[str, str], bool]:
    def test(value: str, wanted: str) -> bool:
        try:
            return compare(float(value), float(wanted))
        except ValueError:
            return False

    return test


#: operator -> (does a context value match one policy value, is the operator negated)
_OPERATORS: dict[str, tuple[Callable[[str, str], bool], bool]] = {
    "StringEquals": (_string_equals, False),
    "StringNotEquals": (_string_equals, True),
    "StringEqualsIgnoreCase": (lambda v, w: v.lower() == w.lower(), False),
    "StringNotEqualsIgnoreCase": (lambda v, w: v.lower() == w.lower(), True),
    "StringLike": (lambda v, w: glob_match(w, v), False),
    "StringNotLike": (lambda v, w: glob_match(w, v), True),
    "ArnEquals": (lambda v, w: arn_match(w, v), False),
    "ArnLike": (lambda v, w: arn_match(w, v), False),
    "ArnNotEquals": (lambda v, w: arn_match(w, v), True),
    "ArnNotLike": (lambda v, w: arn_match(w, v), True),
    "Bool": (lambda v, w: v.lower() == w.lower(), False),
    "NumericEquals": (_numeric(lambda a, b: a == b), False),
    "NumericNotEquals": (_numeric(lambda a, b: a == b), True),
    "NumericLessThan": (_numeric(lambda a, b: a < b), False),
    "NumericLessThanEquals": (_numeric(lambda a, b: a <= b), False),
    "NumericGreaterThan": (_numeric(lambda a, b: a > b), False),
    "NumericGreaterThanEquals": (_numeric(lambda a, b: a >= b), False),
}


def _policy_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@dataclass(frozen=True)
class Condition:
    """One operator applied to one key, with the policy's values for it."""

    operator: str
    key: str
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        qualifier, _, base = self.operator.rpartition(":")
        if qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise UnsupportedPolicy(f"condition qualifier {qualifier!r} in {self.operator!r}")
        base = base.removesuffix("IfExists")
        if base != "Null" and base not in _OPERATORS:
            raise UnsupportedPolicy(f"condition operator {self.operator!r} is not evaluated by the twin")

    def holds(self, request: Request) -> bool:
        qualifier, _, base = self.operator.rpartition(":")
        if_exists = base.endswith("IfExists")
        base = base.removesuffix("IfExists")
        values = request.value(self.key)
        if base == "Null":
            return any((values is None) == (wanted.lower() == "true") for wanted in self.values)
        matches, negated = _OPERATORS[base]
        if values is None or (qualifier and not values):
            if if_exists or qualifier == "ForAllValues":
                return True
            if qualifier == "ForAnyValue":
                return False
            return negated

        def fits(value: str) -> bool:
            hit = any(matches(value, wanted) for wanted in self.values)
            return not hit if negated else hit

        if qualifier == "ForAllValues":
            return all(fits(v) for v in values)
        return any(fits(v) for v in values)


def _principal_matches(spec: Any, principal: Principal) -> bool:
    if spec == "*":
        return True
    if not isinstance(spec, Mapping):
        raise UnsupportedPolicy(f"Principal {spec!r}")
    for kind, raw in spec.items():
        for wanted in (str(v) for v in _as_list(raw)):
            if kind == "Service" and principal.service == wanted:
                return True
            if kind == "AWS" and principal.service is None:
                if wanted in ("*", principal.account, f"arn:aws:iam::{principal.account}:root"):
                    return True
                if wanted in (principal.arn, principal.role_arn):
                    return True
    return False


@dataclass(frozen=True)
class Statement:
    ref: StatementRef
    effect: Effect
    actions: tuple[str, ...] | None
    not_actions: tuple[str, ...] | None
    resources: tuple[str, ...] | None
    not_resources: tuple[str, ...] | None
    principal: Any
    not_principal: Any
    conditions: tuple[Condition, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ref: StatementRef) -> Statement:
        known = {
            "Sid",
            "Effect",
            "Action",
            "NotAction",
            "Resource",
            "NotResource",
            "Principal",
            "NotPrincipal",
        }
        unknown = set(raw) - known - {"Condition"}
        if unknown:
            raise UnsupportedPolicy(f"{ref}: statement elements {sorted(unknown)}")
        effect = raw.get("Effect")
        if effect not in ("Allow", "Deny"):
            raise UnsupportedPolicy(f"{ref}: Effect {effect!r}")
        conditions = tuple(
            Condition(operator, key, tuple(_policy_value(v) for v in _as_list(values)))
            for operator, keys in (raw.get("Condition") or {}).items()
            for key, values in keys.items()
        )

        def strings(name: str) -> tuple[str, ...] | None:
            return tuple(str(v) for v in _as_list(raw[name])) if name in raw else None

        return cls(
            ref=ref,
            effect=effect,
            actions=strings("Action"),
            not_actions=strings("NotAction"),
            resources=strings("Resource"),
            not_resources=strings("NotResource"),
            principal=raw.get("Principal"),
            not_principal=raw.get("NotPrincipal"),
            conditions=conditions,
        )

    def grants(self) -> tuple[str, ...]:
        """The Action patterns this statement names (empty for a NotAction statement)."""
        return self.actions or ()

    def applies(self, request: Request, *, resource_based: bool) -> bool:
        action = request.action
        if self.actions is not None and not any(
            glob_match(a, action, ignore_case=True) for a in self.actions
        ):
            return False
        if self.not_actions is not None and any(
            glob_match(a, action, ignore_case=True) for a in self.not_actions
        ):
            return False
        if self.resources is not None and not any(arn_match(r, request.resource) for r in self.resources):
            return False
        if self.not_resources is not None and any(arn_match(r, request.resource) for r in self.not_resources):
            return False
        if resource_based:
            if self.principal is not None and not _principal_matches(self.principal, request.principal):
                return False
            if self.not_principal is not None and _principal_matches(self.not_principal, request.principal):
                return False
        return all(c.holds(request) for c in self.conditions)


@dataclass(frozen=True)
class Policy:
    """A policy document, named for where it comes from (a role's inline policy, a managed policy's ARN, ...)."""

    name: str
    statements: tuple[Statement, ...]

    @classmethod
    def parse(cls, name: str, document: str | Mapping[str, Any]) -> Policy:
        return _parse_cached(
            name, document if isinstance(document, str) else json.dumps(document, sort_keys=True)
        )


@cache
def _parse_cached(name: str, text: str) -> Policy:
    raw = json.loads(text)
    statements = raw.get("Statement", [])
    if isinstance(statements, Mapping):
        statements = [statements]
    return Policy(
        name,
        tuple(Statement.parse(s, StatementRef(name, i, s.get("Sid"))) for i, s in enumerate(statements)),
    )


@dataclass(frozen=True)
class Decision:
    """The answer to one request: allowed or not, and which statements decided it."""

    allowed: bool
    #: "allowed", "implicit" (nothing allows it), "identity" or "resource" (an explicit Deny there), "endpoint"
    #: (the VPC endpoint the call goes through has a policy that does not allow it)
    reason: Literal["allowed", "implicit", "identity", "resource", "endpoint", "endpoint-deny"]
    statements: tuple[StatementRef, ...]


def evaluate(request: Request, identity: Iterable[Policy], resource_based: Iterable[Policy] = ()) -> Decision:
    """IAM's decision for a request inside one account."""
    allows: list[StatementRef] = []
    denies: dict[str, list[StatementRef]] = {"identity": [], "resource": []}
    for kind, policies in (("identity", identity), ("resource", resource_based)):
        for policy in policies:
            for statement in policy.statements:
                if statement.applies(request, resource_based=kind == "resource"):
                    (allows if statement.effect == "Allow" else denies[kind]).append(statement.ref)
    for kind in ("identity", "resource"):
        if denies[kind]:
            return Decision(False, kind, tuple(denies[kind]))  # type: ignore[arg-type]
    if allows:
        return Decision(True, "allowed", tuple(allows))
    return Decision(False, "implicit", ())


def denial_message(request: Request, decision: Decision, *, quote_resource: bool = False) -> str:
    """AWS's wording of an access denied error (IAM User Guide, "Troubleshoot access denied error messages")."""
    action = request.action
    where = ""
    if request.resource != "*":
        shown = f'"{request.resource}"' if quote_resource else request.resource
        where = f" on resource: {shown}"
    if decision.reason == "implicit":
        why = f"because no identity-based policy allows the {action} action"
    elif decision.reason == "identity":
        why = "with an explicit deny in an identity-based policy"
    elif decision.reason == "endpoint":
        why = f"because no VPC endpoint policy allows the {action} action"
    elif decision.reason == "endpoint-deny":
        why = "with an explicit deny in a VPC endpoint policy"
    else:
        why = "with an explicit deny in a resource-based policy"
    return f"User: {request.principal.arn} is not authorized to perform: {action}{where} {why}"
