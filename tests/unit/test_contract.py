"""The contract between statemachine/training_job.asl.json, template.yaml and the code they name.

Static and fast: it reads the two files and the checkout. Each check guards a mistake seen in the wild: a Next
naming no state, a `"taskId": "$.x"` without `.$`, a saga with a forward state that skips the compensation, a
template pointing at a file whose name differs in case, an action wildcard in a policy.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lustrain_core.errors import ALL_ERRORS

from lustrain.twin.cfn import load_template

ROOT = Path(__file__).resolve().parents[2]
ASL_TEXT = (ROOT / "statemachine" / "training_job.asl.json").read_text()
TEMPLATE = load_template(ROOT / "template.yaml")
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
STATE_MACHINE = RESOURCES["TrainingJobStateMachine"]["Properties"]
SUBSTITUTIONS: dict[str, Any] = STATE_MACHINE["DefinitionSubstitutions"]
PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")

HANDLERS = {
    "register_job",
    "prepare",
    "next_attempt",
    "check_quota",
    "create_network",
    "create_filesystem",
    "check_filesystem",
    "upload_code",
    "start_training",
    "on_training_event",
    "teardown",
    "notify",
    "sweep",
    "on_execution_end",
}
COMPENSATION = "Tear down after failure"
TRAINING = "Start the training job"
DECIDE = "Decide on another attempt"
KEEP_FAILURE = "Keep the failure as the run's error"


def _default(value: Any) -> str:
    """A substitution's value with the template's defaults: parameters by their Default, ARNs by a sample."""
    if isinstance(value, dict) and "Ref" in value:
        name = value["Ref"]
        if name == "AWS::Partition":
            return "aws"
        return str(TEMPLATE["Parameters"][name]["Default"])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        logical_id = value["Fn::GetAtt"][0]
        return f"arn:aws:lambda:us-east-1:123456789012:function:{logical_id}"
    raise AssertionError(f"unexpected substitution value {value!r}")


def _render() -> dict[str, Any]:
    """The definition as CloudFormation would make it with the template's defaults: text replacement, then JSON."""
    missing = sorted(set(PLACEHOLDER.findall(ASL_TEXT)) - set(SUBSTITUTIONS))
    assert not missing, f"placeholders without a DefinitionSubstitutions entry: {missing}"
    rendered: dict[str, Any] = json.loads(
        PLACEHOLDER.sub(lambda m: _default(SUBSTITUTIONS[m.group(1)]), ASL_TEXT)
    )
    return rendered


DEFINITION = _render()


def scopes(machine: dict[str, Any] = DEFINITION) -> Iterator[dict[str, Any]]:
    """The machine and every Parallel branch: each has its own StartAt and States."""
    yield machine
    for state in machine["States"].values():
        for branch in state.get("Branches", []):
            yield from scopes(branch)


def all_states() -> Iterator[tuple[str, dict[str, Any]]]:
    for scope in scopes():
        yield from scope["States"].items()


def lambda_function_of(state: dict[str, Any]) -> str | None:
    """The substitution key naming the Lambda function a Task invokes, whichever integration it uses."""
    if state.get("Type") != "Task":
        return None
    raw = json.dumps(state)
    keys = [
        key for key in SUBSTITUTIONS if key.endswith("FunctionArn") and _default(SUBSTITUTIONS[key]) in raw
    ]
    assert len(keys) == 1, f"a Task invokes exactly one function of the stack: {keys}"
    return keys[0]


# ------------------------------------------------------------------ the definition


def test_every_placeholder_has_a_substitution_and_every_substitution_is_used() -> None:
    used = set(PLACEHOLDER.findall(ASL_TEXT))
    assert used == set(SUBSTITUTIONS), (
        f"in the ASL only: {sorted(used - set(SUBSTITUTIONS))}; in the template only: "
        f"{sorted(set(SUBSTITUTIONS) - used)}"
    )


def test_every_transition_names_a_state_of_its_scope() -> None:
    for scope in scopes():
        names = set(scope["States"])
        assert scope["StartAt"] in names
        for name, state in scope["States"].items():
            targets = [state.get("Next"), state.get("Default")]
            targets += [rule.get("Next") for rule in state.get("Choices", [])]
            targets += [catcher["Next"] for catcher in state.get("Catch", [])]
            for target in filter(None, targets):
                assert target in names, f"{name!r} goes to {target!r}, which is not a state here"
            ends = state.get("End") is True or state["Type"] in ("Succeed", "Fail", "Choice")
            assert ends or "Next" in state, f"{name!r} neither ends nor has a Next"


def test_every_state_is_reachable() -> None:
    for scope in scopes():
        seen, todo = set(), [scope["StartAt"]]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            state = scope["States"][name]
            todo += [t for t in (state.get("Next"), state.get("Default")) if t]
            todo += [rule["Next"] for rule in state.get("Choices", [])]
            todo += [catcher["Next"] for catcher in state.get("Catch", [])]
        assert seen == set(scope["States"]), f"unreachable: {sorted(set(scope['States']) - seen)}"


def test_every_state_explains_itself() -> None:
    for name, state in all_states():
        assert len(state.get("Comment", "")) > 20, f"{name!r} needs a Comment the console reader can use"


def test_error_names_are_lustrain_errors_or_aws_ones() -> None:
    for name, state in all_states():
        for field in ("Retry", "Catch"):
            for i, rule in enumerate(state.get(field, [])):
                for error in rule["ErrorEquals"]:
                    known = error in ALL_ERRORS or error.startswith(("States.", "Lambda.", "Sandbox."))
                    assert known, f"{name!r} {field}[{i}] names {error!r}: not in lustrain_core.errors"
                if "States.ALL" in rule["ErrorEquals"]:
                    assert rule["ErrorEquals"] == ["States.ALL"], f"{name!r}: States.ALL must stand alone"
                    assert i == len(state[field]) - 1, f"{name!r}: States.ALL must be the last {field}"
        if state["Type"] == "Fail" and "Error" in state:
            assert state["Error"] in ALL_ERRORS, (
                f"{name!r} fails with {state['Error']!r}, not a lustrain error"
            )


_INTRINSIC = re.compile(r"^States\.[A-Za-z]+\(.*\)$", re.DOTALL)


def _is_path(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if _INTRINSIC.match(value):
        return value.count("(") == value.count(")")
    return value == "$" or (value.startswith(("$.", "$[", "$$.")) and " " not in value)


def _templates(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield where, key, value
            yield from _templates(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _templates(value, f"{where}[{i}]")


def test_every_dollar_key_holds_a_path_and_no_plain_key_holds_one() -> None:
    for name, state in all_states():
        for field in ("Parameters", "ResultSelector"):
            for where, key, value in _templates(state.get(field, {}), f"{name}.{field}"):
                if key.endswith(".$"):
                    assert _is_path(value), f"{where}.{key} = {value!r} is not a JSONPath or an intrinsic"
                else:
                    looks_like_path = isinstance(value, str) and value.startswith("$")
                    assert not looks_like_path, f"{where}.{key} = {value!r}: a path without .$ is a literal"


def test_every_path_field_is_a_path() -> None:
    path_fields = ("InputPath", "OutputPath", "ResultPath", "SecondsPath", "ErrorPath", "CausePath")
    for name, state in all_states():
        for field in path_fields:
            if field in state:
                assert _is_path(state[field]), f"{name}.{field} = {state[field]!r}"
        for catcher in state.get("Catch", []):
            assert _is_path(catcher["ResultPath"]), f"{name}: a Catch without a ResultPath loses the input"
        for where, key, value in _templates(state.get("Choices", []), f"{name}.Choices"):
            if key == "Variable":
                assert _is_path(value), f"{where}.Variable = {value!r}"


def test_forward_states_catch_into_the_teardown() -> None:
    """The saga: once anything may exist, every failure goes through the compensation chain."""
    top = DEFINITION["States"]
    compensation = {COMPENSATION}
    todo = [COMPENSATION]
    while todo:
        state = top[todo.pop()]
        for target in [state.get("Next")] + [c["Next"] for c in state.get("Catch", [])]:
            if target and target not in compensation:
                compensation.add(target)
                todo.append(target)
    # the training task's failures go to the run policy's decision first; without another attempt, its error
    # becomes the run's and the compensation runs
    training = top[TRAINING]["Catch"][-1]
    assert (training["ErrorEquals"], training["ResultPath"], training["Next"]) == (
        ["States.ALL"], "$.failure", DECIDE
    )
    decide = top[DECIDE]
    assert decide["Catch"][-1]["ErrorEquals"] == ["States.ALL"] and decide["Catch"][-1]["Next"] == KEEP_FAILURE
    assert top[decide["Next"]]["Default"] == KEEP_FAILURE
    assert (top[KEEP_FAILURE]["InputPath"], top[KEEP_FAILURE]["ResultPath"]) == ("$.failure", "$.error")
    assert top[KEEP_FAILURE]["Next"] == COMPENSATION
    for name, state in top.items():
        if state["Type"] not in ("Task", "Parallel") or name in compensation or name in (TRAINING, DECIDE):
            continue
        last = state.get("Catch", [{}])[-1]
        assert last.get("ErrorEquals") == ["States.ALL"], f"{name!r} has no catch-all"
        assert last.get("ResultPath") in ("$.error", "$.notify"), (
            f"{name!r} must keep its input and the error"
        )
        if name in (
            "Tear down the run",
            "Notify the owner",
            "Tear down the data preparation",
            "Notify the owner of the data preparation",
        ):
            continue  # the run's own cleanup: a failure there is reported, not compensated twice
        assert last["Next"] == COMPENSATION, f"{name!r} must catch into {COMPENSATION!r}"
    for branch in (b for s in top.values() for b in s.get("Branches", [])):
        for name, state in branch["States"].items():
            assert "Catch" not in state, f"{name!r} would hide its failure from the Parallel state's Catch"


def test_the_run_fails_with_the_error_that_started_the_compensation() -> None:
    fail = DEFINITION["States"]["Fail the run"]
    assert fail == {**fail, "Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause"}


def test_step_functions_errors_end_the_run_under_a_lustrain_name() -> None:
    """A Fail state may not raise States.*: those reach a Fail with a static lustrain error instead."""
    states = DEFINITION["States"]
    assert states["Notify of the failure"]["Next"] == "Which error ends the run?"
    choice = states["Which error ends the run?"]
    assert choice["Default"] == "Fail the run"
    routes = {}
    for rule in choice["Choices"]:
        tests = [c for part in rule["And"] for c in part.get("Or", [part])]
        for test in tests:
            if "StringEquals" in test or "StringMatches" in test:
                assert test["Variable"] == "$.error.Error"
                routes[test.get("StringEquals") or test.get("StringMatches")] = states[rule["Next"]]["Error"]
    assert routes == {
        "States.Timeout": "TrainingTimedOut",
        "States.HeartbeatTimeout": "TrainingTimedOut",
        "States.*": "StepFunctionsError",
    }


def test_lambda_errors_and_throttling_are_retried_and_teardown_waits_longer() -> None:
    for name, state in all_states():
        if state["Type"] != "Task":
            continue
        retried = {error for rule in state.get("Retry", []) for error in rule["ErrorEquals"]}
        lambda_errors = {
            "Lambda.ServiceException",
            "Lambda.AWSLambdaException",
            "Lambda.SdkClientException",
            "Lambda.TooManyRequestsException",
        }
        assert lambda_errors | {"AwsThrottled", "AwsUnavailable"} <= retried, name
        # a function that hit its timeout gets one more try (handlers are idempotent), not six: twice is a hang
        (timed_out,) = [r for r in state["Retry"] if r["ErrorEquals"] == ["Sandbox.Timedout"]]
        assert 1 <= timed_out["MaxAttempts"] <= 2, name
        if lambda_function_of(state) == "TeardownFunctionArn":
            (rule,) = [r for r in state["Retry"] if r["ErrorEquals"] == ["TeardownIncomplete"]]
            others = [r for r in state["Retry"] if r is not rule]
            assert all(rule["IntervalSeconds"] > r["IntervalSeconds"] for r in others)


def test_no_integration_moto_cannot_run() -> None:
    for name, state in all_states():
        resource = state.get("Resource", "")
        assert not resource.endswith(".sync"), f"{name!r}: .sync integrations do not run on moto"
        assert "aws-sdk:servicequotas" not in resource, (
            f"{name!r}: moto cannot run the servicequotas SDK task"
        )


def test_training_waits_for_the_callback_with_the_token_and_bounded_time() -> None:
    (state,) = [
        s for _, s in all_states() if s.get("Resource", "").endswith("lambda:invoke.waitForTaskToken")
    ]
    assert state["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert 0 < state["HeartbeatSeconds"] < state["TimeoutSeconds"]
    assert state["ResultPath"] == "$.training"


def test_handlers_get_the_document_and_results_land_under_their_keys() -> None:
    """functions/handlers/__init__.py: each handler's result is the value of its key of the state document."""
    expected = {
        "RegisterJobFunctionArn": "$",  # the document becomes {"job": <result>}
        "CheckQuotaFunctionArn": "$.quota",
        "CreateNetworkFunctionArn": "$.network",
        "CreateFilesystemFunctionArn": "$.filesystem",
        "CheckFilesystemFunctionArn": "$.filesystem",
        # the training branch's output becomes {"code": <result>}; a data preparation's lands under $.code
        "UploadCodeFunctionArn": ("$", "$.code"),
        "StartTrainingFunctionArn": "$.training",
        "NextAttemptFunctionArn": "$.recovery",
        "TeardownFunctionArn": "$.teardown",
        "NotifyFunctionArn": "$.notify",
        "PrepareFunctionArn": "$.prepare",
    }
    for name, state in all_states():
        function = lambda_function_of(state)
        if function is None:
            continue
        wanted = expected[function]
        assert state["ResultPath"] in (wanted if isinstance(wanted, tuple) else (wanted,)), name
        if state["ResultPath"] == "$":
            (key,) = [k for k, v in state["ResultSelector"].items() if v == "$"]
            assert key.endswith(".$")
    register = DEFINITION["States"][DEFINITION["StartAt"]]
    assert register["Parameters"] == {"execution.$": "$$.Execution.Name", "input.$": "$"}


# ------------------------------------------------------------------ the template


def functions() -> dict[str, dict[str, Any]]:
    return {lid: r["Properties"] for lid, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}


def _exists_exactly(relative: str) -> bool:
    """Like Path.exists, but case-sensitive on every filesystem (Lambda's is)."""
    here = ROOT
    for part in Path(relative).parts:
        if part not in os.listdir(here):
            return False
        here = here / part
    return True


def test_code_and_definition_paths_exist_with_their_exact_case() -> None:
    code_uri = TEMPLATE["Globals"]["Function"]["CodeUri"]
    assert _exists_exactly(code_uri.rstrip("/"))
    assert all("CodeUri" not in props for props in functions().values()), (
        "one bundle: CodeUri in Globals only"
    )
    assert _exists_exactly(STATE_MACHINE["DefinitionUri"])


def test_one_function_per_handler_module_and_its_file_and_sample_event_exist() -> None:
    modules = {}
    for logical_id, props in functions().items():
        match = re.fullmatch(r"handlers\.([a-z_]+)\.handler", props["Handler"])
        assert match, f"{logical_id}: Handler {props['Handler']!r} is not handlers.<module>.handler"
        modules[match.group(1)] = logical_id
    assert set(modules) == HANDLERS
    for module in modules:
        assert _exists_exactly(f"functions/handlers/{module}.py"), f"no functions/handlers/{module}.py"
        assert _exists_exactly(f"events/{module}.json"), f"no sample event events/{module}.json"


def test_every_lambda_substitution_is_a_function_of_the_stack_and_every_task_uses_one() -> None:
    by_logical_id = functions()
    for key, value in SUBSTITUTIONS.items():
        if key.endswith("FunctionArn"):
            logical_id, attribute = value["Fn::GetAtt"]
            assert attribute == "Arn" and logical_id in by_logical_id, key
    tasks = [lambda_function_of(state) for _, state in all_states() if state["Type"] == "Task"]
    assert set(tasks) == {key for key in SUBSTITUTIONS if key.endswith("FunctionArn")}


def test_functions_run_python312_on_arm64_with_the_settings_the_core_reads() -> None:
    globals_ = TEMPLATE["Globals"]["Function"]
    assert globals_["Runtime"] == "python3.12"
    assert globals_["Architectures"] == ["arm64"]
    assert globals_["Tracing"] == "Active"
    variables = globals_["Environment"]["Variables"]
    config = (ROOT / "functions" / "lustrain_core" / "config.py").read_text()
    read = set(re.findall(r'env\.get\("([A-Z_]+)"', config)) - {"AWS_REGION", "AWS_DEFAULT_REGION"}
    assert read <= set(variables), f"set nowhere: {sorted(read - set(variables))}"
    assert variables["POWERTOOLS_SERVICE_NAME"] == "lustrain"
    assert "POWERTOOLS_LOG_LEVEL" in variables


def policy_statements() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM statement of the template: roles, managed policies, bucket/queue policies, SAM Policies."""
    for logical_id, resource in RESOURCES.items():
        props = resource.get("Properties", {})
        documents = [props.get("PolicyDocument")]
        documents += [p.get("PolicyDocument") for p in props.get("Policies", []) if isinstance(p, dict)]
        documents += [p for p in props.get("Policies", []) if isinstance(p, dict) and "Statement" in p]
        for document in filter(None, documents):
            for statement in document["Statement"]:
                if isinstance(statement, dict) and "Fn::If" in statement:
                    statement = statement["Fn::If"][1]
                yield logical_id, statement


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_allow_statement_grants_every_action() -> None:
    statements = list(policy_statements())
    assert len(statements) > 30
    for logical_id, statement in statements:
        if statement["Effect"] != "Allow":
            continue
        for action in _listed(statement["Action"]):
            assert action != "*" and not str(action).endswith(":*"), f"{logical_id}: Action {action!r}"


def test_deletes_are_limited_to_what_runs_of_this_stack_created() -> None:
    # Task tokens, log deliveries, and the network interfaces SageMaker itself manages in VPC mode; and an MLflow
    # run (no AWS resource: no tags) the notify function made a moment before as a duplicate (steps/tracking.py:
    # MLflow's delete is a soft one, which the run's record never names).
    exempt = ("dynamodb:DeleteItem", "logs:DeleteLogDelivery", "ec2:DeleteNetworkInterface", "sagemaker-mlflow:DeleteRun")
    checked = 0
    for logical_id, statement in policy_statements():
        deletes = [a for a in _listed(statement["Action"]) if ":Delete" in a and not a.startswith(exempt)]
        if logical_id == "PrepareProcessingBoundary" and deletes == ["s3:DeleteObject"]:
            # a data preparation clears a part's leftovers under its output, within the stack's output prefixes
            # (S3 objects carry no lustrain tags)
            continue
        if statement["Effect"] != "Allow" or not deletes:
            continue
        condition = statement.get("Condition", {})
        where = f"{logical_id}: {deletes}"
        assert condition["StringEquals"]["aws:ResourceTag/lustrain:created-by"] == {
            "Ref": "AWS::StackName"
        }, where
        assert condition["Null"] == {"aws:ResourceTag/lustrain:job-id": "false"}, where
        checked += len(deletes)
    assert checked >= 7


def test_nothing_is_open_to_the_internet() -> None:
    text = (ROOT / "template.yaml").read_text()
    assert "0.0.0.0/0" not in text and "::/0" not in text


def test_buckets_are_private_encrypted_and_tls_only() -> None:
    for logical_id in ("JobsBucket", "ArtifactsBucket"):
        props = RESOURCES[logical_id]["Properties"]
        assert all(props["PublicAccessBlockConfiguration"].values()), logical_id
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        (policy,) = [r for r in RESOURCES.values() if r["Properties"].get("Bucket") == {"Ref": logical_id}]
        (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    jobs = RESOURCES["JobsBucket"]["Properties"]
    assert jobs["NotificationConfiguration"]["EventBridgeConfiguration"]["EventBridgeEnabled"] is True
    artifacts = RESOURCES["ArtifactsBucket"]["Properties"]
    assert artifacts["VersioningConfiguration"]["Status"] == "Enabled"
    assert any(rule.get("Prefix") == "code/" for rule in artifacts["LifecycleConfiguration"]["Rules"])


def test_tables_have_the_keys_the_handlers_use() -> None:
    jobs = RESOURCES["JobsTable"]["Properties"]
    assert jobs["KeySchema"] == [{"AttributeName": "job_id", "KeyType": "HASH"}]
    tokens = RESOURCES["TaskTokensTable"]["Properties"]
    assert tokens["KeySchema"] == [{"AttributeName": "training_job_name", "KeyType": "HASH"}]
    assert tokens["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    for props in (jobs, tokens):
        assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert props["SSESpecification"]["SSEEnabled"] is True


def test_a_spec_drop_starts_the_machine_and_training_events_reach_their_handler() -> None:
    drop = STATE_MACHINE["Events"]["JobDropped"]["Properties"]
    assert drop["Pattern"]["detail-type"] == ["Object Created"]
    keys = drop["Pattern"]["detail"]["object"]["key"]
    assert keys == [{"wildcard": "jobs/*.yaml"}, {"wildcard": "jobs/*.yml"}, {"wildcard": "jobs/*.json"}]
    training = RESOURCES["OnTrainingEventFunction"]["Properties"]["Events"]["TrainingJobStateChange"][
        "Properties"
    ]
    assert training["Pattern"] == {
        "source": ["aws.sagemaker"],
        "detail-type": ["SageMaker Training Job State Change"],
    }
    for rule in (drop, training):
        assert rule["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}}
        assert rule["RetryPolicy"]["MaximumRetryAttempts"] > 0


def test_the_machine_logs_everything_and_may_invoke_exactly_its_functions() -> None:
    assert STATE_MACHINE["Logging"]["Level"] == "ALL"
    assert STATE_MACHINE["Tracing"] == {"Enabled": True}
    invoked = {
        p["LambdaInvokePolicy"]["FunctionName"]["Ref"]
        for p in STATE_MACHINE["Policies"]
        if "LambdaInvokePolicy" in p
    }
    used = {v["Fn::GetAtt"][0] for k, v in SUBSTITUTIONS.items() if k.endswith("FunctionArn")}
    assert invoked == used


# ------------------------------------------------------------------ the allow-lists as IAM resources


def _evaluate(node: Any, params: dict[str, Any], conditions: dict[str, bool]) -> Any:
    """Just enough of CloudFormation's intrinsics to read the allow-list policies."""
    if isinstance(node, list):
        return [_evaluate(x, params, conditions) for x in node]
    if not isinstance(node, dict) or len(node) != 1:
        return node
    ((key, arg),) = node.items()
    if key == "Ref":
        return params[arg]
    if key == "Fn::If":
        name, yes, no = arg
        return _evaluate(yes if conditions[name] else no, params, conditions)
    if key == "Fn::Join":
        separator, items = arg
        return separator.join(_evaluate(items, params, conditions))
    if key == "Fn::Split":
        separator, text = arg
        return _evaluate(text, params, conditions).split(separator)
    if key == "Fn::Sub":
        # ${!Literal} is CloudFormation's escape: it stays ${Literal} (here: IAM's policy variables)
        return PLACEHOLDER.sub(
            lambda m: "${" + m.group(1)[1:] + "}" if m.group(1).startswith("!") else str(params[m.group(1)]),
            arg,
        )
    raise AssertionError(f"{key} is not expected in the allow-list policies")


RUN = "${aws:PrincipalTag/lustrain-run}"
TEAM = "${aws:PrincipalTag/lustrain-team}"
RESUME = "${aws:PrincipalTag/lustrain-resume}"
OWN = {"ArtifactsBucket.Arn": "arn:aws:s3:::the-artifacts"}


def _resources(
    policy: str, sid: str | None, params: dict[str, Any], conditions: dict[str, bool]
) -> list[str]:
    statements = RESOURCES[policy]["Properties"]["PolicyDocument"]["Statement"]
    (statement,) = [s for s in statements if s.get("Sid") == sid]
    return _listed(_evaluate(statement["Resource"], {**OWN, **params}, conditions))


def _conditions(partition: str, prefixes: list[str]) -> dict[str, bool]:
    return {
        "OwnDataPrefix": prefixes == [""],
        "OwnOutputPrefix": prefixes == [""],
        "InChina": partition == "aws-cn",
        "InGovCloud": partition == "aws-us-gov",
    }


@pytest.mark.parametrize(
    ("partition", "prefixes", "data", "output"),
    [
        # nothing allowed by the administrator: the stack's own artifacts bucket, never every bucket
        ("aws", [""], ["arn:aws:s3:::the-artifacts/data/*"], ["arn:aws:s3:::the-artifacts/results/*"]),
        ("aws", ["s3://data/corpus/"], ["arn:aws:s3:::data/corpus/*"], ["arn:aws:s3:::data/corpus/*"]),
        (
            "aws-cn",
            ["s3://a/", "s3://b/x/y/"],
            ["arn:aws-cn:s3:::a/*", "arn:aws-cn:s3:::b/x/y/*"],
            ["arn:aws-cn:s3:::a/*", "arn:aws-cn:s3:::b/x/y/*"],
        ),
        ("aws-us-gov", ["s3://a/p/"], ["arn:aws-us-gov:s3:::a/p/*"], ["arn:aws-us-gov:s3:::a/p/*"]),
    ],
)
def test_allowed_prefixes_become_the_s3_resources_of_the_read_policies(
    partition: str, prefixes: list[str], data: list[str], output: list[str]
) -> None:
    conditions = _conditions(partition, prefixes)
    for policy, parameter, expected in (
        ("DataReadPolicy", "AllowedDataPrefixes", data),
        ("OutputReadPolicy", "AllowedOutputPrefixes", output),
    ):
        params = {parameter: prefixes, "AWS::Partition": partition}
        assert _resources(policy, None, params, conditions) == expected, policy


@pytest.mark.parametrize(
    ("partition", "prefixes", "expected"),
    [
        ("aws", [""], [f"arn:aws:s3:::the-artifacts/results/{TEAM}/{RUN}/*"]),
        ("aws-cn", ["s3://a/", "s3://b/x/"], [f"arn:aws-cn:s3:::a/{TEAM}/{RUN}/*", f"arn:aws-cn:s3:::b/x/{TEAM}/{RUN}/*"]),
        ("aws", ["s3://r/"], [f"arn:aws:s3:::r/{TEAM}/{RUN}/*"]),
    ],
)
def test_a_training_job_writes_only_its_own_runs_objects_under_the_allowed_prefixes(
    partition: str, prefixes: list[str], expected: list[str]
) -> None:
    """A run's objects: exactly <prefix><team>/<job id>/, no * before either variable (IAM's * matches "/" too, so
    <prefix>*/<job id>/* would reach into <prefix><another run>/checkpoints/<job id>/...)."""
    params = {"AllowedOutputPrefixes": prefixes, "AWS::Partition": partition}
    conditions = _conditions(partition, prefixes)
    resources = _resources("OutputReadWritePolicy", "ThisRunsObjects", params, conditions)
    assert resources == expected
    assert all("*" not in r.split(TEAM)[0] for r in resources)
    resumed = _resources("OutputReadWritePolicy", "TheCheckpointsItResumesFrom", params, conditions)
    assert resumed == [r.replace(RUN, RESUME).replace("/*", "/checkpoints/*") for r in expected]


def test_a_stack_deployed_without_allow_lists_checks_and_grants_its_own_locations_alike() -> None:
    """Empty parameters: register_job's lists (SpecForbidden) are the locations the IAM policies grant."""
    from lustrain_core.config import Settings

    env = RESOURCES["RegisterJobFunction"]["Properties"]["Environment"]["Variables"]
    conditions = _conditions("aws", [""])
    params = {"ArtifactsBucket": "the-artifacts", "JobsBucket": "the-jobs", "AllowedDataPrefixes": [""]}
    data = _evaluate(env["LUSTRAIN_ALLOWED_DATA_PREFIXES"], params, conditions)
    params["AllowedOutputPrefixes"] = [""]
    output = _evaluate(env["LUSTRAIN_ALLOWED_OUTPUT_PREFIXES"], params, conditions)
    own = Settings(artifacts_bucket="the-artifacts")
    assert (data, output) == (own.own_data_prefix, own.own_output_prefix)
    read = _resources("DataReadPolicy", None, {}, conditions)
    results = _resources("OutputReadPolicy", None, {}, conditions)
    assert read == ["arn:aws:s3:::" + data.removeprefix("s3://") + "*"]
    assert results == ["arn:aws:s3:::" + output.removeprefix("s3://") + "*"]


def test_allowed_prefixes_must_end_at_a_folder_so_iam_and_register_job_agree() -> None:
    for parameter in ("AllowedDataPrefixes", "AllowedOutputPrefixes"):
        pattern = re.compile(TEMPLATE["Parameters"][parameter]["AllowedPattern"])
        assert pattern.fullmatch("s3://my-data/corpus/") and pattern.fullmatch("s3://my-data/")
        assert pattern.fullmatch(""), "empty: the stack's own bucket"
        assert not pattern.fullmatch("*"), '"*" no longer means every bucket of the account: the deploy refuses it'
        assert not pattern.fullmatch("s3://my-data/team"), "s3://my-data/team* would also allow team-b/"
        assert not pattern.fullmatch("s3://my-data")
        assert TEMPLATE["Parameters"][parameter]["Default"] == ""


def test_the_docs_launch_plan_table_lists_exactly_the_models_fields() -> None:
    from lustrain_core.launch_plan import LaunchPlan

    doc = (ROOT / "docs" / "how-a-run-goes.md").read_text()
    table = doc.split("<!-- launch-plan-fields -->")[1].split("<!-- /launch-plan-fields -->")[0]
    named = {name for row in table.splitlines()[3:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == set(LaunchPlan.model_fields)


def test_the_docs_run_document_table_lists_exactly_each_sections_fields() -> None:
    from lustrain_core.document import SECTIONS

    doc = (ROOT / "docs" / "how-a-run-goes.md").read_text()
    table = doc.split("<!-- run-document-sections -->")[1].split("<!-- /run-document-sections -->")[0]
    rows = {row.split("|")[1].strip(): row.split("|")[3] for row in table.strip().splitlines()[2:]}
    listed = {re.match(r"`\$\.(\w+)`", name).group(1): set(re.findall(r"`(\w+)`", fields)) for name, fields in rows.items()}
    assert listed == {name: set(model.model_fields) for name, (model, _) in SECTIONS.items()}
