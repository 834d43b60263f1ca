"""What a security reviewer checks in template.yaml, checked on every change (static: it reads the template).

checkov and cfn-lint (`make scan`) look for generic misconfigurations; these checks are the project's own rules:
private, encrypted, TLS-only, logged buckets; no wildcard actions; no open ingress; every EventBridge target with
a dead-letter queue and a retry policy; iam:PassRole only for the training role and only to SageMaker; deletes and
stops only of what a run of this stack tagged; the state machine logged and traced; the encryption options
reaching the requests; and a written reason for every finding the scanners are told to skip.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lustrain_core.aws_requests import file_system as create_request
from lustrain_core.config import Settings
from lustrain_core.document import Job, Network
from lustrain_core.steps import network
from lustrain_core.steps.training import build_training_request, training_job_name

from lustrain.twin.cfn import load_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = load_template(ROOT / "template.yaml")
RESOURCES: dict[str, dict[str, Any]] = TEMPLATE["Resources"]
PARAMETERS: dict[str, dict[str, Any]] = TEMPLATE["Parameters"]
OPEN = ("0.0.0.0/0", "::/0")


def of_type(kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r.get("Properties", {}) for lid, r in RESOURCES.items() if r["Type"] == kind}


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def branches(node: Any) -> Iterator[Any]:
    """A value, or each branch of a Fn::If (both may be deployed, whichever the parameters choose)."""
    if isinstance(node, dict) and "Fn::If" in node:
        for branch in node["Fn::If"][1:]:
            yield from branches(branch)
    elif node != {"Ref": "AWS::NoValue"}:
        yield node


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every policy document of the template: roles, managed policies, SAM Policies, resource and key policies."""
    for lid, resource in RESOURCES.items():
        props = resource.get("Properties", {})
        for key in ("PolicyDocument", "KeyPolicy", "AssumeRolePolicyDocument"):
            if key in props:
                yield lid, props[key]
        for policy in props.get("Policies", []):
            for each in branches(policy):
                if isinstance(each, dict) and "PolicyDocument" in each:
                    yield lid, each["PolicyDocument"]
                elif isinstance(each, dict) and "Statement" in each:
                    yield lid, each


def statements() -> Iterator[tuple[str, dict[str, Any]]]:
    for lid, document in documents():
        for statement in document["Statement"]:
            for each in branches(statement):
                yield lid, each


ALL_STATEMENTS = list(statements())


def allowing(action_pattern: str) -> list[tuple[str, dict[str, Any]]]:
    pattern = re.compile(action_pattern)
    return [
        (lid, s)
        for lid, s in ALL_STATEMENTS
        if s["Effect"] == "Allow" and any(pattern.fullmatch(str(a)) for a in listed(s.get("Action", [])))
    ]


def test_the_policies_were_all_read():
    kinds = {RESOURCES[lid]["Type"] for lid, _ in ALL_STATEMENTS}
    assert {"AWS::IAM::Role", "AWS::IAM::ManagedPolicy", "AWS::Serverless::Function"} <= kinds
    assert {"AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy", "AWS::KMS::Key"} <= kinds
    assert len(ALL_STATEMENTS) > 50


# ------------------------------------------------------------------ buckets


BUCKETS = of_type("AWS::S3::Bucket")


def bucket_policy_statements(bucket: str) -> list[dict[str, Any]]:
    return [
        s
        for props in of_type("AWS::S3::BucketPolicy").values()
        if props["Bucket"] == {"Ref": bucket}
        for s in props["PolicyDocument"]["Statement"]
    ]


@pytest.mark.parametrize("bucket", sorted(BUCKETS))
def test_every_bucket_is_encrypted_private_owner_enforced_and_tls_only(bucket):
    props = BUCKETS[bucket]
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in {"AES256", "aws:kms"}
    assert props["PublicAccessBlockConfiguration"] == dict.fromkeys(
        ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"), True
    )
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    deny = [
        s
        for s in bucket_policy_statements(bucket)
        if s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert len(deny) == 1, f"{bucket} has no TLS-only policy"
    assert deny[0]["Principal"] == "*" and deny[0]["Action"] == "s3:*"
    assert deny[0]["Resource"] == [{"Fn::GetAtt": [bucket, "Arn"]}, {"Fn::Sub": f"${{{bucket}.Arn}}/*"}]


@pytest.mark.parametrize("bucket", ["JobsBucket", "ArtifactsBucket"])
def test_the_jobs_and_artifacts_buckets_are_versioned_and_access_logged(bucket):
    props = BUCKETS[bucket]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    logging = props["LoggingConfiguration"]
    assert logging["DestinationBucketName"] == {"Ref": "AccessLogsBucket"}
    deliveries = [s for s in bucket_policy_statements("AccessLogsBucket") if s["Effect"] == "Allow"]
    (delivery,) = deliveries
    assert delivery["Principal"] == {"Service": "logging.s3.amazonaws.com"}
    assert {"Fn::GetAtt": [bucket, "Arn"]} in delivery["Condition"]["ArnLike"]["aws:SourceArn"]


def test_code_bundles_and_uploads_expire_and_nothing_is_kept_forever_in_pieces():
    rules = {r.get("Prefix", ""): r for r in BUCKETS["ArtifactsBucket"]["LifecycleConfiguration"]["Rules"]}
    for prefix in ("code/", "uploads/"):
        assert rules[prefix]["ExpirationInDays"] <= 90, prefix
        assert rules[prefix]["NoncurrentVersionExpiration"]["NoncurrentDays"] <= 30, prefix
    assert rules[""]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] <= 7
    # the archive/ prefix is the run's results: no rule expires it
    assert not any(p.startswith("archive") for p in rules)


# ------------------------------------------------------------------ IAM


def test_no_statement_names_every_action_and_only_the_key_policy_a_whole_service():
    for lid, statement in ALL_STATEMENTS:
        actions = listed(statement.get("Action", statement.get("NotAction", [])))
        assert "*" not in actions, f"{lid}: Action '*'"
        assert "NotAction" not in statement, f"{lid}: NotAction grants everything else"
        wildcards = [a for a in actions if str(a).endswith(":*")]
        if statement["Effect"] == "Allow" and wildcards:
            # AWS's default key policy: the account's IAM policies decide who may use the key
            assert (lid, wildcards) == ("RunDataKey", ["kms:*"])
            assert statement["Principal"] == {
                "AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}
            }


PREPARATION_ROLES = {
    "Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/lustrain/${AWS::Region}/${AWS::StackName}/*"
}


def test_pass_role_is_only_for_the_training_role_and_only_to_sagemaker():
    passing = allowing(r"iam:(PassRole|Pass\*|\*)")
    # start_training creates the job in a session of LauncherRole tagged with the run (session tag chaining); the
    # prepare function hands each data preparation's own role (under the stack's path) to its processing jobs
    passed = {"LauncherRole": {"Fn::GetAtt": ["SageMakerExecutionRole", "Arn"]}, "PrepareFunction": PREPARATION_ROLES}
    assert [lid for lid, _ in passing] == list(passed)
    for lid, statement in passing:
        assert statement["Resource"] == passed[lid]
        assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def test_a_preparations_role_is_made_and_deleted_only_under_the_stacks_path_and_with_its_boundary():
    # the one function that makes roles may give them no more than PrepareProcessingBoundary: CreateRole and
    # PutRolePolicy hold iam:PermissionsBoundary, and nothing may attach a policy to it or change its boundary
    bounded = {"StringEquals": {"iam:PermissionsBoundary": {"Ref": "PrepareProcessingBoundary"}}}
    writes = [
        (lid, s)
        for lid, s in allowing(r"iam:(Create|Put|Attach|Delete|Detach|Tag|Update)\w*")
        # FSx's service-linked roles, whose policies only AWS defines (tested with the file system's grants)
        if "aws-service-role" not in json.dumps(s["Resource"]) and "iam:AWSServiceName" not in json.dumps(s)
    ]
    assert {(lid, a) for lid, s in writes for a in listed(s["Action"])} == {
        ("PrepareFunction", "iam:CreateRole"),
        ("PrepareFunction", "iam:PutRolePolicy"),
        ("PrepareFunction", "iam:TagRole"),
        ("TeardownPolicy", "iam:DeleteRolePolicy"),
        ("TeardownPolicy", "iam:DeleteRole"),
    }
    for lid, statement in writes:
        assert statement["Resource"] == PREPARATION_ROLES, lid
        if "iam:TagRole" in listed(statement["Action"]):
            assert statement["Condition"] == {
                "StringEquals": {"aws:RequestTag/lustrain:created-by": {"Ref": "AWS::StackName"}}
            }
        elif lid == "TeardownPolicy":
            # and only a role tagged as a run of this stack's
            assert statement["Condition"] == {
                "StringEquals": {**bounded["StringEquals"], **THIS_STACKS_RUNS["StringEquals"]},
                "Null": THIS_STACKS_RUNS["Null"],
            }
        else:
            assert statement["Condition"] == bounded, lid


def test_the_training_role_trusts_only_sagemaker_for_this_account():
    (trust,) = RESOURCES["SageMakerExecutionRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    # sts:TagSession: SageMaker passes on the launcher session's tags (session tag chaining)
    assert trust["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    assert trust["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


THIS_STACKS_RUNS = {
    "StringEquals": {"aws:ResourceTag/lustrain:created-by": {"Ref": "AWS::StackName"}},
    "Null": {"aws:ResourceTag/lustrain:job-id": "false"},
}


def test_deletes_and_stops_touch_only_what_a_run_of_this_stack_tagged():
    destructive = [
        (lid, s)
        for lid, s in allowing(r"(ec2|fsx|sagemaker):(Delete|Stop|Revoke|Disassociate|Terminate)\w*")
        # SageMaker's VPC mode: the training instances' own interfaces, which SageMaker creates and deletes
        if s.get("Sid") != "VpcModeNetworkInterfaces"
    ]
    actions = {a for _, s in destructive for a in listed(s["Action"])}
    assert {
        "sagemaker:StopTrainingJob",
        "sagemaker:StopProcessingJob",
        "fsx:DeleteFileSystem",
        "ec2:DeleteVpc",
        "ec2:DeleteSubnet",
    } <= actions
    for lid, statement in destructive:
        if lid == "CreateNetworkFunction":
            # revoking the default open egress of the group it has just created and tagged
            assert statement["Condition"] == {"StringEquals": THIS_STACKS_RUNS["StringEquals"]}
            continue
        assert statement["Condition"] == THIS_STACKS_RUNS, lid


def test_teardown_and_sweeper_share_one_policy_and_the_sweeper_adds_only_reading_and_stopping_executions():
    for function in ("TeardownFunction", "SweepFunction"):
        assert {"Ref": "TeardownPolicy"} in RESOURCES[function]["Properties"]["Policies"]
    extra = [s for lid, s in ALL_STATEMENTS if lid == "SweepFunction"]
    assert {a for s in extra for a in listed(s["Action"])} == {
        "dynamodb:Scan",  # the capacity queue's lines, pruned of ended runs (queue.prune)
        "sagemaker:ListTrainingJobs",
        # the data preparations' own roles under the stack's path, and their tags (steps/prepare_role.roles_left)
        "iam:ListRoles",
        "iam:ListRoleTags",
        "states:DescribeExecution",
        "states:StopExecution",
    }
    (executions,) = [s for s in extra if "states:StopExecution" in s["Action"]]
    assert executions["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:execution:"
        "${TrainingJobStateMachine.Name}:*"
    }


def test_the_run_key_is_granted_only_for_aws_resources_and_rotates_when_the_stack_creates_it():
    key = RESOURCES["RunDataKey"]
    assert key["Condition"] == "CreateKmsKey" and key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain"
    grants = allowing(r"kms:CreateGrant")
    # the run key's policy, and the boundary of the preparations' roles (whose own policy asks the same)
    assert sorted(lid for lid, _ in grants) == ["PrepareProcessingBoundary", "RunKeyUsePolicy"]
    for _, grant in grants:
        assert grant["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}
    users = {
        "SageMakerExecutionRole",
        "CreateFilesystemFunction",
        # data.preload's warm-up job (its volume and output) is started in check_filesystem's poll loop
        "CheckFilesystemFunction",
        "StartTrainingFunction",
        "OnTrainingEventFunction",
        # the function that starts a data preparation's processing jobs (their volumes; each one's own role is
        # granted the key by its policy, within PrepareProcessingBoundary)
        "PrepareFunction",
    }
    attached = {
        lid
        for lid, r in RESOURCES.items()
        for p in r.get("Properties", {}).get("Policies", [])
        + r.get("Properties", {}).get("ManagedPolicyArns", [])
        if {"Ref": "RunKeyUsePolicy"} in list(branches(p))
    }
    assert attached == users


# ------------------------------------------------------------------ network


def test_nothing_in_the_template_opens_ingress_to_the_internet():
    text = (ROOT / "template.yaml").read_text()
    assert not any(cidr in text for cidr in OPEN)
    assert not of_type("AWS::EC2::SecurityGroup") and not of_type("AWS::EC2::SecurityGroupIngress")


class RecordingEC2:
    """A new security group as EC2 makes it (egress open to all), recording every rule change asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def describe_security_groups(self, GroupIds: list[str]) -> dict[str, Any]:
        egress = [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}], "UserIdGroupPairs": []}]
        return {
            "SecurityGroups": [{"GroupId": GroupIds[0], "IpPermissions": [], "IpPermissionsEgress": egress}]
        }

    def authorize_security_group_ingress(self, GroupId: str, IpPermissions: list[dict[str, Any]]) -> None:
        self.calls.append(("ingress", IpPermissions))

    def authorize_security_group_egress(self, GroupId: str, IpPermissions: list[dict[str, Any]]) -> None:
        self.calls.append(("egress", IpPermissions))

    def revoke_security_group_egress(self, GroupId: str, IpPermissions: list[dict[str, Any]]) -> None:
        self.calls.append(("revoke-egress", IpPermissions))


def test_the_group_a_run_creates_admits_only_itself_and_sends_only_https_to_s3_out():
    ec2 = RecordingEC2()
    network._ensure_rules(ec2, "sg-0123456789abcdef0", "pl-63a5400a")
    ingress = [p for kind, perms in ec2.calls if kind == "ingress" for p in perms]
    egress = [p for kind, perms in ec2.calls if kind == "egress" for p in perms]
    assert ingress and all(p["UserIdGroupPairs"] == [{"GroupId": "sg-0123456789abcdef0"}] for p in ingress)
    to_itself = [p for p in egress if p.get("UserIdGroupPairs")]
    to_s3 = [p for p in egress if p.get("PrefixListIds")]
    assert to_itself == [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-0123456789abcdef0"}]}]
    assert [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], p["PrefixListIds"][0]["PrefixListId"]) for p in to_s3
    ] == [("tcp", 443, 443, "pl-63a5400a")]
    assert not any(p.get("IpRanges") or p.get("Ipv6Ranges") for p in ingress + egress)
    assert ("revoke-egress", [{"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]) in ec2.calls


# ------------------------------------------------------------------ events, logging, concurrency


def event_targets() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every EventBridge target: SAM Events of functions and state machines, and plain rules' Targets."""
    for lid, resource in RESOURCES.items():
        props = resource.get("Properties", {})
        for name, event in (props.get("Events") or {}).items():
            if event["Type"] in ("EventBridgeRule", "CloudWatchEvent", "Schedule", "ScheduleV2"):
                yield f"{lid}.{name}", event["Properties"]
        if resource["Type"] == "AWS::Events::Rule":
            for target in props.get("Targets", []):
                yield f"{lid}.{target['Id']}", target


def test_every_eventbridge_target_has_a_dead_letter_queue_and_a_retry_policy():
    targets = dict(event_targets())
    assert {"TrainingJobStateMachine.JobDropped", "OnTrainingEventFunction.TrainingJobStateChange"} <= set(
        targets
    )
    assert "SweepFunction.Scheduled" in targets
    for name, target in targets.items():
        assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}}, name
        retry = target["RetryPolicy"]
        assert retry["MaximumRetryAttempts"] >= 1 and retry["MaximumEventAgeInSeconds"] >= 60, name


def test_functions_invoked_asynchronously_keep_their_failed_events():
    for function in ("OnTrainingEventFunction", "SweepFunction"):
        props = RESOURCES[function]["Properties"]
        assert props["DeadLetterQueue"] == {
            "Type": "SQS",
            "TargetArn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]},
        }
        assert "MaximumRetryAttempts" in props["EventInvokeConfig"]


def test_the_dead_letter_queue_takes_only_this_stacks_rules_over_tls():
    (props,) = of_type("AWS::SQS::QueuePolicy").values()
    allow, deny = props["PolicyDocument"]["Statement"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    assert "rule/${AWS::StackName}-*" in allow["Condition"]["ArnLike"]["aws:SourceArn"]["Fn::Sub"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_functions_a_flood_can_reach_have_reserved_concurrency_with_a_way_out():
    for function, parameter, condition in (
        ("RegisterJobFunction", "RegisterJobConcurrency", "ReserveRegisterJob"),
        ("OnTrainingEventFunction", "TrainingEventConcurrency", "ReserveTrainingEvent"),
        ("SweepFunction", "SweepConcurrency", "ReserveSweep"),
    ):
        reserved = RESOURCES[function]["Properties"]["ReservedConcurrentExecutions"]
        assert reserved == {"Fn::If": [condition, {"Ref": parameter}, {"Ref": "AWS::NoValue"}]}
        assert PARAMETERS[parameter]["Default"] >= 1


def test_the_sweep_runs_on_a_schedule_that_a_parameter_turns_off():
    schedule = RESOURCES["SweepFunction"]["Properties"]["Events"]["Scheduled"]["Properties"]
    assert schedule["Schedule"] == {"Ref": "SweepSchedule"}
    assert schedule["State"] == {"Fn::If": ["SweepOnSchedule", "ENABLED", "DISABLED"]}
    assert TEMPLATE["Conditions"]["SweepOnSchedule"] == {"Fn::Equals": [{"Ref": "SweepEnabled"}, "true"]}
    assert PARAMETERS["SweepEnabled"]["AllowedValues"] == ["true", "false"]
    assert re.fullmatch(PARAMETERS["SweepSchedule"]["AllowedPattern"], PARAMETERS["SweepSchedule"]["Default"])


def test_the_state_machine_logs_everything_and_is_traced_and_so_are_the_functions():
    machine = RESOURCES["TrainingJobStateMachine"]["Properties"]
    assert machine["Logging"]["Level"] == "ALL"
    # states' input and output (the spec, the task token) reach the logs only when the stack asks for them
    assert machine["Logging"]["IncludeExecutionData"] == {"Fn::If": ["LogsExecutionData", True, False]}
    assert TEMPLATE["Conditions"]["LogsExecutionData"] == {
        "Fn::Equals": [{"Ref": "LogExecutionData"}, "true"]
    }
    assert PARAMETERS["LogExecutionData"]["Default"] == "false"
    (destination,) = machine["Logging"]["Destinations"]
    assert destination["CloudWatchLogsLogGroup"]["LogGroupArn"] == {
        "Fn::GetAtt": ["StateMachineLogGroup", "Arn"]
    }
    assert machine["Tracing"] == {"Enabled": True}
    assert TEMPLATE["Globals"]["Function"]["Tracing"] == "Active"
    for group in of_type("AWS::Logs::LogGroup").values():
        assert group["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_tables_topic_and_queue_are_encrypted_at_rest():
    for lid, table in of_type("AWS::DynamoDB::Table").items():
        assert table["SSESpecification"]["SSEEnabled"] is True, lid
    (topic,) = of_type("AWS::SNS::Topic").values()
    assert topic["KmsMasterKeyId"]
    (queue,) = of_type("AWS::SQS::Queue").values()
    assert queue["SqsManagedSseEnabled"] is True


# ------------------------------------------------------------------ scanner findings skipped on purpose


def checkov_skips() -> Iterator[tuple[str, dict[str, Any]]]:
    for lid, resource in RESOURCES.items():
        for skip in ((resource.get("Metadata") or {}).get("checkov") or {}).get("skip", []):
            yield lid, skip


def test_every_checkov_skip_names_a_check_and_says_why():
    skips = list(checkov_skips())
    assert skips, "checkov findings are justified in Metadata: checkov: skip"
    for lid, skip in skips:
        assert re.fullmatch(r"CKV2?_AWS_\d+", skip["id"]), (lid, skip)
        assert len(skip.get("comment", "").split()) >= 8, f"{lid} skips {skip['id']} without a reason"
    assert len({(lid, s["id"]) for lid, s in skips}) == len(skips), "a check skipped twice on one resource"


def test_no_scanner_is_silenced_for_the_whole_template():
    config = ROOT / ".checkov.yaml"
    if config.exists():
        text = config.read_text()
        assert "skip-check" not in text and "soft-fail" not in text
    # checkov also obeys "# checkov:skip=ID" comments, which would hide a skip from the check above
    assert not re.search(r"#\s*checkov:skip=", (ROOT / "template.yaml").read_text())


# ------------------------------------------------------------------ the encryption options reach the requests


def function_env(function: str) -> dict[str, Any]:
    return dict(RESOURCES[function]["Properties"]["Environment"]["Variables"])


def test_the_kms_and_inter_container_parameters_reach_the_functions_that_use_them():
    key = {"Fn::If": ["CreateKmsKey", {"Fn::GetAtt": ["RunDataKey", "Arn"]}, {"Ref": "KmsKey"}]}
    for function in ("CreateFilesystemFunction", "StartTrainingFunction"):
        assert function_env(function)["LUSTRAIN_KMS_KEY_ID"] == key, function
    assert function_env("StartTrainingFunction")["LUSTRAIN_INTER_CONTAINER_ENCRYPTION"] == {
        "Ref": "InterContainerTrafficEncryption"
    }
    pattern = re.compile(PARAMETERS["KmsKey"]["AllowedPattern"])
    for good in ("", "create", "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"):
        assert pattern.fullmatch(good), good
    for bad in ("alias/aws/s3", "1234abcd", "arn:aws:kms:us-east-1:123456789012:alias/x"):
        assert not pattern.fullmatch(bad), bad


def start_training_document() -> dict[str, Any]:
    return json.loads((ROOT / "events" / "start_training.json").read_text())


KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def settings(**extra: str) -> Settings:
    return Settings(stack_name="lustrain-test", extra=extra)


def training_request(**extra: str) -> dict[str, Any]:
    document = start_training_document()
    name = training_job_name(document["job"]["spec"]["name"], document["job"]["job_id"], 1)
    return build_training_request(document, training_job_name=name, settings=settings(**extra))


def test_inter_container_encryption_is_off_unless_the_stack_turns_it_on():
    assert training_request()["EnableInterContainerTrafficEncryption"] is False
    on = training_request(LUSTRAIN_INTER_CONTAINER_ENCRYPTION="true")
    assert on["EnableInterContainerTrafficEncryption"] is True
    with pytest.raises(ValueError, match="LUSTRAIN_INTER_CONTAINER_ENCRYPTION='yes' must be true or false"):
        training_request(LUSTRAIN_INTER_CONTAINER_ENCRYPTION="yes")


def test_the_stack_key_encrypts_the_output_and_never_a_p4d_volume():
    request = training_request(LUSTRAIN_KMS_KEY_ID=KEY)
    assert request["OutputDataConfig"]["KmsKeyId"] == KEY
    assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert "VolumeKmsKeyId" not in request["ResourceConfig"]


def filesystem_job(deployment_type: str) -> Job:
    document = start_training_document()
    document["job"]["spec"]["filesystem"]["deployment_type"] = deployment_type.split("_")[0].lower()
    document["job"]["plan"]["filesystem"].update(
        deployment_type=deployment_type, per_unit_storage_throughput=250, storage_gib=2400
    )
    return Job.from_document(document)


def test_the_stack_key_encrypts_persistent_file_systems_only():
    net = Network(subnet_id="subnet-0f1e2d3c4b5a69788", security_group_ids=["sg-0123456789abcdef0"])
    persistent = create_request(filesystem_job("PERSISTENT_2"), net, settings(LUSTRAIN_KMS_KEY_ID=KEY))
    assert persistent["KmsKeyId"] == KEY
    scratch = create_request(filesystem_job("SCRATCH_2"), net, settings(LUSTRAIN_KMS_KEY_ID=KEY))
    assert "KmsKeyId" not in scratch
    assert "KmsKeyId" not in create_request(filesystem_job("PERSISTENT_2"), net, settings())


def test_a_kept_file_system_carries_the_keep_tag_the_sweeper_honours_without_a_record():
    job = filesystem_job("SCRATCH_2")
    net = Network(subnet_id="subnet-0f1e2d3c4b5a69788", security_group_ids=["sg-0123456789abcdef0"])
    assert {"Key": "lustrain:keep", "Value": "true"} not in create_request(job, net, settings())["Tags"]
    document = start_training_document()
    document["job"]["spec"]["filesystem"]["keep"] = True
    kept = create_request(Job.from_document(document), net, settings())
    assert {"Key": "lustrain:keep", "Value": "true"} in kept["Tags"]


@pytest.mark.parametrize(
    ("given", "env"),
    [
        (None, "none"),  # the default: a spec may not name an existing subnet, group or file system
        ("*", ""),  # any: the policy's "no limit"
        ("subnet-0123456789abcdef0,fs-0123456789abcdef0", "subnet-0123456789abcdef0,fs-0123456789abcdef0"),
    ],
)
def test_existing_resources_a_spec_may_name_reach_register_job_and_default_to_none(given, env):
    from lustrain.twin.stack import _Resolver

    params = {
        name: ",".join(p["Default"]) if isinstance(p.get("Default"), list) else str(p.get("Default", ""))
        for name, p in PARAMETERS.items()
    }
    if given is not None:
        params["AllowedExistingResources"] = given
    for name, p in PARAMETERS.items():
        if p["Type"] == "CommaDelimitedList":
            params[name] = params[name].split(",")  # type: ignore[assignment]
    resolver = _Resolver(TEMPLATE, "lustrain-test", "us-east-1", params)
    wired = function_env("RegisterJobFunction")["LUSTRAIN_ALLOWED_EXISTING_RESOURCES"]
    assert resolver.resolve(wired) == env
    pattern = re.compile(PARAMETERS["AllowedExistingResources"]["AllowedPattern"])
    assert all(pattern.fullmatch(v) for v in env.split(",") if v)


@pytest.mark.parametrize(
    ("given", "allowed"),
    [
        # the default: each team's own secrets (<stack>/<team>/...) and parameters (/<stack>/<team>/...), in the
        # stack's account and region, by the job's session tag lustrain-team
        (
            None,
            [
                "arn:aws:secretsmanager:us-east-1:123456789012:secret:lustrain-test/${aws:PrincipalTag/lustrain-team}/*",
                "arn:aws:ssm:us-east-1:123456789012:parameter/lustrain-test/${aws:PrincipalTag/lustrain-team}/*",
            ],
        ),
        (
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/*",
            ["arn:aws:secretsmanager:us-east-1:123456789012:secret:team/*"],
        ),
    ],
)
def test_the_training_role_reads_only_the_secrets_register_job_allows(given, allowed):
    from lustrain.twin.stack import _Resolver

    params: dict[str, Any] = {
        name: ",".join(p["Default"]) if isinstance(p.get("Default"), list) else str(p.get("Default", ""))
        for name, p in PARAMETERS.items()
    }
    if given is not None:
        params["AllowedSecrets"] = given
    for name, p in PARAMETERS.items():
        if p["Type"] == "CommaDelimitedList":
            params[name] = params[name].split(",")
    resolver = _Resolver(TEMPLATE, "lustrain-test", "us-east-1", params)
    resolver.pseudo["AWS::AccountId"] = "123456789012"
    wired = resolver.resolve(function_env("RegisterJobFunction")["LUSTRAIN_ALLOWED_SECRETS"])
    assert wired.split(",") == allowed
    # the notify function's read of the chat webhook is the one other (test_only_notify_reads_the_notice_webhook)
    readers = [
        s
        for lid, s in ALL_STATEMENTS
        if {"secretsmanager:GetSecretValue", "ssm:GetParameter"} & set(listed(s["Action"]))
        and s.get("Sid") != "ReadTheNoticeWebhook"
        and s.get("Effect") == "Allow"
    ]
    assert [(s["Sid"], s["Action"]) for s in readers] == [
        ("ReadTeamSecrets", ["secretsmanager:GetSecretValue", "ssm:GetParameter"])
    ]
    assert resolver.resolve(readers[0]["Resource"]) == allowed
    pattern = re.compile(PARAMETERS["AllowedSecrets"]["AllowedPattern"])
    assert all(pattern.fullmatch(v) for v in allowed)
    decrypt = next(s for _, s in ALL_STATEMENTS if s.get("Sid") == "DecryptSecretsThroughTheirService")
    assert set(resolver.resolve(decrypt["Condition"]["StringEquals"]["kms:ViaService"])) == {
        "secretsmanager.us-east-1.amazonaws.com",
        "ssm.us-east-1.amazonaws.com",
    }


def test_every_function_knows_the_stacks_teams():
    """register_job decides a run's team and create_filesystem checks a reused file system's: both read the teams
    from the one setting every function has (a function without it would see the default team alone)."""
    globals_env = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert globals_env["LUSTRAIN_TEAMS"] == {"Fn::Join": [",", {"Ref": "Teams"}]}
    assert all("LUSTRAIN_TEAMS" not in function_env(lid) for lid in ("RegisterJobFunction", "CreateFilesystemFunction"))


def test_no_training_job_reads_the_notice_webhook_whatever_the_secrets_lists_say():
    """The chat webhook posts under the stack's name: the training role is denied it outright (a Deny beats any
    AllowedSecrets an operator writes), wherever a webhook is named."""
    role = RESOURCES["SageMakerExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    denied = [
        s["Fn::If"] for s in role if isinstance(s, dict) and "Fn::If" in s and s["Fn::If"][1].get("Effect") == "Deny"
    ]
    assert [(c, s["Sid"], s["Action"]) for c, s, _ in denied] == [
        ("HasNoticeWebhook", "NeverTheNoticeWebhook", "secretsmanager:GetSecretValue")
    ]
    resources = denied[0][1]["Resource"]
    assert {"Ref": "NoticeWebhookSecretArn"} in resources and {"Fn::Sub": "${NoticeWebhookSecretArn}*"} in resources
    # and register_job, which refuses a spec naming it, is told which secret it is
    assert function_env("RegisterJobFunction")["LUSTRAIN_NOTICE_WEBHOOK_SECRET"] == {"Ref": "NoticeWebhookSecretArn"}


def test_only_notify_reads_the_notice_webhook_and_only_where_one_is_named():
    readers = [
        (lid, s)
        for lid, s in allowing(r"secretsmanager:GetSecretValue")
        if s.get("Sid") == "ReadTheNoticeWebhook"
    ]
    assert [lid for lid, _ in readers] == ["NotifyFunction"]
    ((_, statement),) = readers
    # that one secret, not a pattern; and the statement exists only where the parameter names one
    assert (
        statement["Resource"] == {"Ref": "NoticeWebhookSecretArn"}
        and statement["Action"] == "secretsmanager:GetSecretValue"
    )
    granted = RESOURCES["NotifyFunction"]["Properties"]["Policies"][1]["Statement"]
    assert {"Fn::If": ["HasNoticeWebhook", statement, {"Ref": "AWS::NoValue"}]} in granted
    # the function's settings hold the secret's ARN, never a URL
    assert function_env("NotifyFunction")["LUSTRAIN_NOTICE_WEBHOOK_SECRET"] == {
        "Ref": "NoticeWebhookSecretArn"
    }
    pattern = re.compile(PARAMETERS["NoticeWebhookSecretArn"]["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch(
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/hook-AbCdEf"
    )
    assert not pattern.fullmatch("https://hooks.slack.com/services/T0/B0/x")
    # the notices' rules run only where a webhook is named
    events = RESOURCES["NotifyFunction"]["Properties"]["Events"]
    # the queue's moments are the notices' alone; the execution's and the attempts' are MLflow's too
    states = {name: e["Properties"]["State"]["Fn::If"][0] for name, e in events.items()}
    assert states == {
        "ExecutionStartsAndStops": "TellsRunMoments", "TrainingJobEnds": "TellsRunMoments", "QueueChanges": "HasNoticeWebhook"
    }
    assert TEMPLATE["Conditions"]["TellsRunMoments"] == {"Fn::Or": [{"Condition": "HasNoticeWebhook"}, {"Condition": "HasMlflow"}]}


@pytest.mark.parametrize(
    ("uri", "signed"),
    [
        ("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team", True),
        ("https://mlflow.example.com", False),
        ("", False),
    ],
)
def test_notify_may_call_only_the_sagemaker_mlflow_server_the_stack_names_and_write_only_under_its_store(uri, signed):
    """The MLflow grants of the notify role: sagemaker-mlflow's calls on the named server alone (none for a
    server called by URL, which IAM does not guard), the attempts' log read only where MLflow is named, and S3
    writes only under the named artifact store."""
    from lustrain.twin.stack import _Resolver

    store = "s3://team-mlflow-artifacts/store" if signed else ""
    resolved = _Resolver(TEMPLATE, "lustrain", "us-east-1", {**template_defaults(), "MlflowTrackingUri": uri,
                                                             "MlflowArtifactStoreUri": store})
    assert resolved.conditions["HasSageMakerMlflow"] is signed
    assert resolved.conditions["HasMlflow"] is bool(uri)
    statements = {
        s["Fn::If"][1]["Sid"]: (s["Fn::If"][0], s["Fn::If"][1])
        for s in TEMPLATE["Resources"]["NotifyFunction"]["Properties"]["Policies"][1]["Statement"]
        if isinstance(s, dict) and "Fn::If" in s
    }
    condition, mlflow = statements["LogRunsToMlflow"]
    assert condition == "HasSageMakerMlflow" and mlflow["Resource"] == {"Ref": "MlflowTrackingUri"}
    assert all(action.startswith("sagemaker-mlflow:") for action in mlflow["Action"])
    condition, put = statements["WriteTheModelsLocationToMlflow"]
    assert condition == "HasMlflowArtifactStore" and put["Action"] == "s3:PutObject"
    if signed:
        assert resolved.resolve(put["Resource"]) == "arn:aws:s3:::team-mlflow-artifacts/store/*"
    store_pattern = re.compile(PARAMETERS["MlflowArtifactStoreUri"]["AllowedPattern"])
    assert store_pattern.fullmatch("s3://team-mlflow-artifacts") and store_pattern.fullmatch("s3://b-1/store/x")
    assert not store_pattern.fullmatch("s3://team-mlflow-artifacts/store/")  # would grant store//*
    assert statements["ReadTheAttemptsLog"][0] == "HasMlflow"
    assert function_env("NotifyFunction")["LUSTRAIN_MLFLOW_TRACKING_URI"] == {"Ref": "MlflowTrackingUri"}


def template_defaults() -> dict[str, Any]:
    return {name: p.get("Default", "") for name, p in PARAMETERS.items()}


def test_the_mlflow_grant_is_exactly_the_calls_tracking_makes():
    """Each MLflow REST call of steps/tracking.py, by the sagemaker-mlflow action that authorizes it on a
    SageMaker server (the Service Authorization Reference's names): the grant holds those and no other."""
    action_of = {
        "experiments/get-by-name": "GetExperimentByName",
        "experiments/create": "CreateExperiment",
        "runs/create": "CreateRun",
        "runs/get": "GetRun",
        "runs/delete": "DeleteRun",
        "runs/log-batch": "LogBatch",
        "runs/update": "UpdateRun",
    }
    source = (ROOT / "functions/lustrain_core/steps/tracking.py").read_text()
    called = set(re.findall(r'"mlflow/([a-z-]+/[a-z-]+)"', source))
    assert called and called <= set(action_of), called - set(action_of)
    (grant,) = [
        s["Fn::If"][1]
        for s in TEMPLATE["Resources"]["NotifyFunction"]["Properties"]["Policies"][1]["Statement"]
        if isinstance(s, dict) and "Fn::If" in s and s["Fn::If"][1].get("Sid") == "LogRunsToMlflow"
    ]
    assert set(grant["Action"]) == {f"sagemaker-mlflow:{action_of[path]}" for path in called}


def test_a_job_reads_only_the_secrets_its_spec_names_each_a_session_tag_of_its_session():
    """Of its team's secrets (ReadTeamSecrets), the training role reads only those code.secrets names: a Deny of every
    other, whose slots are the session tags start_training sets (steps/training.secret_session_tags). A slot left
    empty takes a default that no secret's name can be, so the statement never holds a variable without a value."""
    import fnmatch

    from lustrain_core.spec import MAX_SECRETS
    from lustrain_core.steps.training import secret_session_tags

    role = RESOURCES["SageMakerExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    (deny,) = [s for s in role if isinstance(s, dict) and s.get("Sid") == "OnlyTheNamedSecrets"]
    assert deny["Effect"] == "Deny" and deny["Action"] == ["secretsmanager:GetSecretValue", "ssm:GetParameter"]
    slots = [entry["Fn::Sub"] for entry in deny["NotResource"]]
    for n in range(1, MAX_SECRETS + 1):
        secret = f"${{!aws:PrincipalTag/lustrain-secret-{n}, '(none)'}}"
        parameter = f"${{!aws:PrincipalTag/lustrain-parameter-{n}, '(none)'}}"
        assert f"arn:${{AWS::Partition}}:secretsmanager:${{AWS::Region}}:*:secret:{secret}" in slots
        assert f"arn:${{AWS::Partition}}:secretsmanager:${{AWS::Region}}:*:secret:{secret}-??????" in slots
        assert f"arn:${{AWS::Partition}}:ssm:${{AWS::Region}}:*:parameter/{parameter}" in slots
    assert len(slots) == 3 * MAX_SECRETS
    # the default is no secret's or parameter's name (their characters, as code.secrets' ARN pattern has them)
    assert not re.fullmatch(r"[A-Za-z0-9/_+=.@-]+", "(none)")

    # as many as a spec may name, of both services: each one tag, a value STS takes, on a session that the launcher
    # role's trust lets start_training (and check_filesystem's warm-up) tag so
    secrets = {
        f"S{i}": f"arn:aws:secretsmanager:us-east-1:123456789012:secret:lustrain/team/s{i}-AbCdEf"
        if i % 2
        else f"arn:aws:ssm:us-east-1:123456789012:parameter/lustrain/team/p{i}"
        for i in range(MAX_SECRETS)
    }
    tags = secret_session_tags(secrets)
    assert [t["Key"] for t in tags] == [
        f"lustrain-{'parameter' if i % 2 == 0 else 'secret'}-{i + 1}" for i in range(MAX_SECRETS)
    ]
    assert tags[1]["Value"] == "lustrain/team/s1-AbCdEf" and tags[0]["Value"] == "lustrain/team/p0"
    assert all(re.fullmatch(r"[\w .:/=+\-@]{1,256}", t["Value"]) for t in tags)
    assert len(tags) + 4 <= 50  # STS: at most 50 session tags, with the run's own four
    trust = RESOURCES["LauncherRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    tagging = [s for s in trust if s["Action"] == "sts:TagSession"]
    assert len(tagging) == 2
    for statement in tagging:
        allowed = statement["Condition"]["ForAllValues:StringLike"]["aws:TagKeys"]
        assert all(any(fnmatch.fnmatchcase(t["Key"], p) for p in allowed) for t in tags)


def test_no_role_describes_every_training_job():
    """DescribeTrainingJob is granted on training-job/* (of this stack's runs), never on `*`: the service
    authorization reference gives it the training-job resource type, so `*` would be wider than it needs."""
    describing = allowing(r"sagemaker:(DescribeTrainingJob|Describe\*|\*)")
    assert describing, "no role describes a training job: the teardown and the archive do"
    for lid, statement in describing:
        resources = [r for r in listed(statement.get("Resource", [])) if not isinstance(r, dict) or "Fn::Sub" in r]
        texts = [r["Fn::Sub"] if isinstance(r, dict) else r for r in resources]
        assert "*" not in texts and all(":training-job/" in t for t in texts), (lid, statement.get("Sid"), texts)
