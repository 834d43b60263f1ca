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
  ("Condition operators" and "Multivalued context keys" in the same guide);
- policy variables ("IAM policy elements: Variables and tags") in Resource / NotResource and in condition values
  of a policy of Version 2012-10-17: `${key}` is replaced by the request context's single value of the key
  (`${aws:PrincipalTag/<tag>}`, a role session's session tag; `${aws:username}`, ...), `${key, 'default'}` by the
  default where the key has no value, and `${*}`, `${?}`, `${$}` by the characters themselves, taken literally.
  A variable whose key is absent (or multivalued) with no default resolves to no value: that resource or condition
  value matches nothing, so an Allow resting on it does not apply.
An operator outside these raises UnsupportedPolicy rather than guessing: a twin that allows what AWS refuses is
worse than one that stops.
"""

from __future__ import annotations

import functools
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
    #: the session tags of a role session (sts:AssumeRole's Tags, or chained by SageMaker), as (key, value) pairs;
    #: IAM reads them as aws:PrincipalTag/<key>
    session_tags: tuple[tuple[str, str], ...] = ()

    @classmethod
    def role_session(
        cls, role_arn: str, session: str, session_tags: Mapping[str, str] | None = None
    ) -> Principal:
        account, role_name = _role_parts(role_arn)
        return cls(
            arn=f"arn:aws:sts::{account}:assumed-role/{role_name}/{session}",
            account=account,
            role_arn=role_arn,
            session_tags=tuple(sorted((session_tags or {}).items())),
        )

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.session_tags)

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


_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_DEFAULTED = re.compile(r"^\s*([^,\s]+)\s*,\s*'((?:[^']|'')*)'\s*$")
#: a piece of a resolved pattern: its text, and whether it is taken literally (a variable's value) or as a glob
Piece = tuple[str, bool]


def resolve_variables(text: str, request: Request) -> tuple[Piece, ...] | None:
    """A policy string with its variables replaced from the request context, as pieces (literal or glob), or None
    when a variable has no value and no default (the string then matches nothing)."""
    pieces: list[Piece] = []
    at = 0
    for found in _VARIABLE.finditer(text):
        pieces.append((text[at : found.start()], False))
        at = found.end()
        inner = found.group(1).strip()
        if inner in ("*", "?", "$"):
            pieces.append((inner, True))
            continue
        defaulted = _DEFAULTED.match(found.group(1))
        key, default = (defaulted[1], defaulted[2].replace("''", "'")) if defaulted else (inner, None)
        values = request.value(key)
        if values is not None and len(values) == 1 and not isinstance(_raw_value(request, key), list | tuple):
            pieces.append((values[0], True))
        elif default is not None:
            pieces.append((default, True))
        else:
            return None
    pieces.append((text[at:], False))
    return tuple(piece for piece in pieces if piece[0])


def _raw_value(request: Request, key: str) -> Any:
    return next((value for name, value in request.context.items() if name.lower() == key.lower()), None)


@cache
def _pieces_pattern(pieces: tuple[Piece, ...], ignore_case: bool) -> re.Pattern[str]:
    parts = []
    for text, literal in pieces:
        if literal:
            parts.append(re.escape(text))
        else:
            parts.append("".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in text))
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _has_variables(text: str) -> bool:
    return "${" in text


def arn_match(pattern: str, arn: str, request: Request | None = None) -> bool:
    """An ARN pattern against an ARN, each of the six parts on its own (wildcards never span a colon there); with
    `request`, the pattern's policy variables are replaced from its context first."""
    if pattern == "*":
        return True
    want, have = pattern.split(":", 5), arn.split(":", 5)
    if len(want) != 6 or len(have) != 6:
        want, have = [pattern], [arn]
    for w, h in zip(want, have, strict=True):
        if request is not None and _has_variables(w):
            pieces = resolve_variables(w, request)
            if pieces is None or _pieces_pattern(pieces, False).fullmatch(h) is None:
                return False
        elif not glob_match(w, h):
            return False
    return True


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


def _pattern_test(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda value: pattern.fullmatch(value) is not None


def _swap(matches: Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    """matches(value, wanted) as a function of (wanted, value), to bind the policy's value first."""
    return lambda wanted, value: matches(value, wanted)


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
    #: whether the values' policy variables are replaced (a policy of Version 2012-10-17)
    variables: bool = False

    def _resolved(self, request: Request, base: str) -> list[Callable[[str], bool]]:
        """A test per value with its variables replaced; a value whose variable has no value is left out (it
        matches nothing). A variable's value is taken literally, never as a wildcard."""
        matches, _negated = _OPERATORS[base]
        tests: list[Callable[[str], bool]] = []
        for wanted in self.values:
            if not _has_variables(wanted):
                tests.append(functools.partial(_swap(matches), wanted))
                continue
            pieces = resolve_variables(wanted, request)
            if pieces is None:
                continue
            if base.endswith("Like"):
                tests.append(_pattern_test(_pieces_pattern(pieces, False)))
            else:
                tests.append(functools.partial(_swap(matches), "".join(text for text, _ in pieces)))
        return tests

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

        if self.variables and any(_has_variables(w) for w in self.values):
            tests = self._resolved(request, base)
        else:
            tests = [functools.partial(_swap(matches), wanted) for wanted in self.values]

        def fits(value: str) -> bool:
            hit = any(test(value) for test in tests)
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
    #: whether policy variables are replaced in Resource / NotResource (a policy of Version 2012-10-17)
    variables: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ref: StatementRef, *, variables: bool = False) -> Statement:
        """`variables`: the policy is of Version 2012-10-17, whose policy variables IAM replaces."""
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
            Condition(operator, key, tuple(_policy_value(v) for v in _as_list(values)), variables)
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
            variables=variables,
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
        at = request if self.variables else None
        if self.resources is not None and not any(arn_match(r, request.resource, at) for r in self.resources):
            return False
        if self.not_resources is not None and any(
            arn_match(r, request.resource, at) for r in self.not_resources
        ):
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
        tuple(
            Statement.parse(
                s, StatementRef(name, i, s.get("Sid")), variables=raw.get("Version") == "2012-10-17"
            )
            for i, s in enumerate(statements)
        ),
    )


@dataclass(frozen=True)
class Decision:
    """The answer to one request: allowed or not, and which statements decided it."""

    allowed: bool
    #: "allowed", "implicit" (nothing allows it), "identity" or "resource" (an explicit Deny there), "endpoint"
    #: (the VPC endpoint the call goes through has a policy that does not allow it), "boundary" (the role's
    #: permissions boundary does not allow it) or "boundary-deny" (an explicit Deny there)
    reason: Literal[
        "allowed", "implicit", "identity", "resource", "endpoint", "endpoint-deny", "boundary", "boundary-deny"
    ]
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
    elif decision.reason == "boundary":
        why = f"because no permissions boundary allows the {action} action"
    elif decision.reason == "boundary-deny":
        why = "with an explicit deny in a permissions boundary"
    else:
        why = "with an explicit deny in a resource-based policy"
    return f"User: {request.principal.arn} is not authorized to perform: {action}{where} {why}"
