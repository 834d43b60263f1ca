"""The twin's IAM replaces policy variables as the IAM User Guide documents them ("IAM policy elements: Variables
and tags"): from the request context (a role session's session tags are aws:PrincipalTag/<key>), with a default
where given, `${*}` / `${?}` / `${$}` taken literally, and a variable with no value matching nothing."""

from __future__ import annotations

from typing import Any

from lustrain.twin.iam.policy import Policy, Principal, Request, evaluate

ROLE = "arn:aws:iam::123456789012:role/training"
RUN_OBJECTS = "arn:aws:s3:::results/*/${aws:PrincipalTag/lustrain-run}/*"


def policy(resource: str, condition: dict[str, Any] | None = None, version: str = "2012-10-17") -> Policy:
    statement: dict[str, Any] = {"Effect": "Allow", "Action": "s3:PutObject", "Resource": resource}
    if condition:
        statement["Condition"] = condition
    return Policy.parse("test", {"Version": version, "Statement": [statement]})


def put(resource: str, tags: dict[str, str] | None = None, **context: Any) -> Request:
    principal = Principal.role_session(ROLE, "SageMaker", tags)
    tagged = {f"aws:PrincipalTag/{k}": v for k, v in (tags or {}).items()}
    return Request(principal, "s3:PutObject", resource, {**tagged, **context})


def test_a_session_tag_in_a_resource_allows_only_that_runs_objects() -> None:
    own = put("arn:aws:s3:::results/team/run-a/model.tar.gz", {"lustrain-run": "run-a"})
    other = put("arn:aws:s3:::results/team/run-b/model.tar.gz", {"lustrain-run": "run-a"})
    assert evaluate(own, [policy(RUN_OBJECTS)]).allowed
    assert not evaluate(other, [policy(RUN_OBJECTS)]).allowed


def test_a_session_without_the_tag_matches_nothing() -> None:
    untagged = put("arn:aws:s3:::results/team/run-a/model.tar.gz")
    assert not evaluate(untagged, [policy(RUN_OBJECTS)]).allowed


def test_a_tag_value_is_taken_literally_never_as_a_wildcard() -> None:
    star = put("arn:aws:s3:::results/team/run-b/model.tar.gz", {"lustrain-run": "*"})
    assert not evaluate(star, [policy(RUN_OBJECTS)]).allowed
    literal = put("arn:aws:s3:::results/team/*/model.tar.gz", {"lustrain-run": "*"})
    assert evaluate(literal, [policy(RUN_OBJECTS)]).allowed


def test_a_default_stands_in_for_a_missing_key_and_special_characters_are_literal() -> None:
    defaulted = policy("arn:aws:s3:::results/${aws:PrincipalTag/team, 'shared'}/*")
    assert evaluate(put("arn:aws:s3:::results/shared/x"), [defaulted]).allowed
    assert not evaluate(put("arn:aws:s3:::results/other/x"), [defaulted]).allowed
    starred = policy("arn:aws:s3:::results/${*}/x")
    assert evaluate(put("arn:aws:s3:::results/*/x"), [starred]).allowed
    assert not evaluate(put("arn:aws:s3:::results/any/x"), [starred]).allowed


def test_variables_in_condition_values_are_replaced() -> None:
    same_run = policy("*", {"StringEquals": {"s3:RequestObjectTag/run": "${aws:PrincipalTag/lustrain-run}"}})
    tags = {"lustrain-run": "run-a"}
    assert evaluate(put("arn:aws:s3:::r/k", tags, **{"s3:RequestObjectTag/run": "run-a"}), [same_run]).allowed
    assert not evaluate(
        put("arn:aws:s3:::r/k", tags, **{"s3:RequestObjectTag/run": "run-b"}), [same_run]
    ).allowed
    assert not evaluate(
        put("arn:aws:s3:::r/k", None, **{"s3:RequestObjectTag/run": "run-a"}), [same_run]
    ).allowed


def test_a_policy_of_the_old_version_has_no_variables() -> None:
    # Version 2008-10-17 (or none): "${...}" is text (IAM User Guide: variables need Version 2012-10-17)
    old = policy("arn:aws:s3:::results/*/${aws:PrincipalTag/lustrain-run}/*", version="2008-10-17")
    tags = {"lustrain-run": "run-a"}
    assert not evaluate(put("arn:aws:s3:::results/t/run-a/m", tags), [old]).allowed
    assert evaluate(put("arn:aws:s3:::results/t/${aws:PrincipalTag/lustrain-run}/m", tags), [old]).allowed


def test_sessions_of_one_role_with_other_tags_are_other_identities() -> None:
    from lustrain.twin.iam import enforce

    first = enforce._identities.register(Principal.role_session(ROLE, "SageMaker", {"lustrain-run": "run-a"}))
    second = enforce._identities.register(
        Principal.role_session(ROLE, "SageMaker", {"lustrain-run": "run-b"})
    )
    assert first["AWS_ACCESS_KEY_ID"] != second["AWS_ACCESS_KEY_ID"]
    assert enforce.principal_of(second["AWS_ACCESS_KEY_ID"]).tags == {"lustrain-run": "run-b"}
