"""Materialise the stack of template.yaml on moto, as `sam deploy` and CloudFormation would create it.

SAM's transform is the real one (aws-sam-translator, offline): it turns template.yaml into the CloudFormation
template `sam deploy` deploys, with each function's execution role (its managed policies, inline statements,
policy templates and dead-letter queue grant), the state machine's role, the EventBridge rules with their
targets and roles, the Lambda permissions and event-invoke configs. moto's CloudFormation ignores
DefinitionSubstitutions and cannot run SAM, so the twin resolves the intrinsics itself and creates each resource
with the API call CloudFormation would make: the roles and policies are moto's IAM roles and policies, which the
twin's IAM (lustrain/twin/iam) enforces on every call a function or a training job makes. A resource whose
condition is false is skipped, as CloudFormation skips it.

The code of a function and the state machine's definition stay local: SAM needs S3 locations, so the twin hands
it `s3://lustrain-twin-local/<path in the checkout>` and reads the path back.
"""

from __future__ import annotations

import copy
import io
import json
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import boto3

from lustrain.twin.cfn import load_template

ACCOUNT = "123456789012"
#: the stand-in bucket of local paths handed to SAM's transform (CodeUri, DefinitionUri)
LOCAL_BUCKET = "lustrain-twin-local"
_NO_VALUE = object()


class TemplateError(Exception):
    """The template uses something the twin cannot materialise."""


@dataclass
class Resource:
    logical_id: str
    type: str
    ref: str
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Stack:
    name: str
    region: str
    parameters: dict[str, str]
    resources: dict[str, Resource]
    outputs: dict[str, str]
    skipped: dict[str, str]
    #: the CloudFormation template SAM's transform made of template.yaml (intrinsics unresolved)
    transformed: dict[str, Any] = field(default_factory=dict)

    def ref(self, logical_id: str) -> str:
        return self.resources[logical_id].ref

    def function_names(self) -> dict[str, str]:
        """Handler module name -> Lambda function name, for every function of the stack."""
        return {r.attrs["Module"]: r.ref for r in self.of_type("AWS::Lambda::Function")}

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.type == type_]

    def logical_id_of(self, physical: str) -> str | None:
        """The logical id of a resource from its name or ARN (a role's name, a managed policy's ARN, ...)."""
        for resource in self.resources.values():
            if physical in (resource.ref, resource.attrs.get("Arn")):
                return resource.logical_id
        return None


# --------------------------------------------------------------------------- SAM's transform


def _local_uri(path: str) -> str:
    return f"s3://{LOCAL_BUCKET}/{path.rstrip('/')}"


def sam_transform(
    template: dict[str, Any], region: str, parameters: dict[str, str] | None = None
) -> dict[str, Any]:
    """The CloudFormation template SAM makes of `template` (local CodeUri / DefinitionUri as stand-in S3 URIs)."""
    transformed: dict[str, Any] = json.loads(
        _transform(json.dumps(template, sort_keys=True), region, json.dumps(parameters or {}))
    )
    return transformed


@cache
def _transform(template_json: str, region: str, parameters_json: str) -> str:
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    doc = json.loads(template_json)
    function_globals = (doc.get("Globals") or {}).get("Function") or {}
    if isinstance(function_globals.get("CodeUri"), str):
        function_globals["CodeUri"] = _local_uri(function_globals["CodeUri"])
    for resource in doc["Resources"].values():
        props = resource.get("Properties") or {}
        for key in ("CodeUri", "DefinitionUri"):
            if isinstance(props.get(key), str) and not props[key].startswith("s3://"):
                props[key] = _local_uri(props[key])
    session = boto3.Session(region_name=region, aws_access_key_id="twin", aws_secret_access_key="twin")  # noqa: S106
    translated = Translator({}, Parser(), boto_session=session).translate(doc, json.loads(parameters_json))
    return json.dumps(translated)


# --------------------------------------------------------------------------- intrinsics


class _Resolver:
    def __init__(self, template: dict[str, Any], stack_name: str, region: str, params: dict[str, Any]):
        self.template = template
        self.pseudo = {
            "AWS::Region": region,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::StackName": stack_name,
            "AWS::StackId": f"arn:aws:cloudformation:{region}:{ACCOUNT}:stack/{stack_name}/twin",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": _NO_VALUE,
        }
        self.params = params
        self.resources: dict[str, Resource] = {}
        self.conditions: dict[str, bool] = {}
        for name, expr in (template.get("Conditions") or {}).items():
            self.conditions[name] = bool(self.resolve(expr))

    def lookup(self, name: str) -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.params:
            return self.params[name]
        if name in self.resources:
            return self.resources[name].ref
        raise _Unresolved(name)

    def get_att(self, logical_id: str, attr: str) -> str:
        if logical_id not in self.resources:
            raise _Unresolved(logical_id)
        attrs = self.resources[logical_id].attrs
        if attr not in attrs:
            raise TemplateError(f"!GetAtt {logical_id}.{attr}: the twin knows {sorted(attrs)}")
        return attrs[attr]

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.resolve(x) for x in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Ref":
                return self.lookup(arg)
            if key == "Condition":
                return self.conditions[arg]
            if key == "Fn::GetAtt":
                logical, attr = arg if isinstance(arg, list) else str(arg).split(".", 1)
                return self.get_att(logical, attr)
            if key == "Fn::Sub":
                return self._sub(arg)
            if key == "Fn::Join":
                sep, items = arg
                return str(sep).join(str(x) for x in self.resolve(items))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                sep, text = arg
                return str(self.resolve(text)).split(sep)
            if key == "Fn::If":
                cond, yes, no = arg
                return self.resolve(yes if self.conditions[cond] else no)
            if key == "Fn::Equals":
                a, b = (self.resolve(x) for x in arg)
                return str(a) == str(b)
            if key == "Fn::Not":
                return not self.resolve(arg[0])
            if key == "Fn::And":
                return all(self.resolve(x) for x in arg)
            if key == "Fn::Or":
                return any(self.resolve(x) for x in arg)
            if key == "Fn::GetAZs":
                region = self.pseudo["AWS::Region"]
                return [f"{region}{z}" for z in "abc"]
            if key == "Fn::ToJsonString":
                return json.dumps(self.resolve(arg))
            if key == "Fn::Length":
                return len(self.resolve(arg))
            if key.startswith("Fn::"):
                raise TemplateError(f"{key} is not supported by the twin")
        out = {}
        for k, v in node.items():
            value = self.resolve(v)
            if value is not _NO_VALUE:
                out[k] = value
        return out

    def _sub(self, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))

        def replace(m: re.Match[str]) -> str:
            name = m.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                logical, attr = name.split(".", 1)
                return self.get_att(logical, attr)
            return str(self.lookup(name))

        return re.sub(r"\$\{([^}]+)\}", replace, text)


class _Unresolved(Exception):
    """A reference to a resource not created yet: try again after the others."""


def template_parameters(
    template: dict[str, Any], overrides: dict[str, str] | None, unchecked: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The stack's parameter values: defaults, then `overrides`; list parameters as lists. Each override is held to
    the template's constraints as CloudFormation holds it (`check_parameter`), but those named in `unchecked`: the
    twin's own speed-ups (rehearse.FAST_PARAMETERS), which AWS's minutes would not allow."""
    declared = template.get("Parameters") or {}
    params = {
        name: ",".join(spec["Default"])
        if isinstance(spec.get("Default"), list)
        else str(spec.get("Default", ""))
        for name, spec in declared.items()
    }
    unknown = set(overrides or {}) - set(params)
    if unknown:
        raise TemplateError(
            f"unknown template parameters {sorted(unknown)}; the template has {sorted(params)}"
        )
    params.update(overrides or {})
    values: dict[str, Any] = dict(params)
    for name, spec in declared.items():
        if str(spec.get("Type", "")).startswith(("CommaDelimitedList", "List<")):
            values[name] = [v.strip() for v in str(params[name]).split(",")]
    for name in sorted(set(overrides or {}) - unchecked):
        check_parameter(name, declared[name], values[name])
    return values


def check_parameter(name: str, spec: dict[str, Any], value: Any) -> None:
    """Refuse a parameter value as CloudFormation refuses it (AWS CloudFormation User Guide, "Parameters"): one of
    AllowedValues; AllowedPattern matched by the whole value (by each value of a CommaDelimitedList); a Number's
    MinValue and MaxValue; a String's MinLength and MaxLength. The error names the parameter and, where the template
    gives one, its ConstraintDescription."""
    said = spec.get("ConstraintDescription")

    def refuse(rule: str) -> None:
        raise TemplateError(f"Parameter '{name}' {f'failed to satisfy constraint: {said}' if said else rule}")

    items = value if isinstance(value, list) else [value]
    if "AllowedValues" in spec and any(str(v) not in {str(a) for a in spec["AllowedValues"]} for v in items):
        refuse(f"must be one of AllowedValues: {', '.join(str(a) for a in spec['AllowedValues'])}")
    if "AllowedPattern" in spec and any(re.fullmatch(spec["AllowedPattern"], str(v)) is None for v in items):
        refuse(f"must match pattern {spec['AllowedPattern']}")
    if spec.get("Type") == "Number":
        try:
            number = float(str(value))
        except ValueError:
            raise TemplateError(f"Parameter '{name}' must be a number") from None
        if ("MinValue" in spec and number < float(spec["MinValue"])) or (
            "MaxValue" in spec and number > float(spec["MaxValue"])
        ):
            refuse(f"must be from {spec.get('MinValue', '-inf')} to {spec.get('MaxValue', 'inf')}")
    for v in items:
        if ("MinLength" in spec and len(str(v)) < int(spec["MinLength"])) or (
            "MaxLength" in spec and len(str(v)) > int(spec["MaxLength"])
        ):
            refuse(f"must be {spec.get('MinLength', 0)} to {spec.get('MaxLength', 'any')} characters long")


def materialise(
    template_path: str | Path,
    *,
    stack_name: str = "lustrain",
    region: str = "us-east-1",
    parameters: dict[str, str] | None = None,
    session: boto3.Session | None = None,
    template: dict[str, Any] | None = None,
    unchecked: frozenset[str] = frozenset(),
) -> Stack:
    """Create every resource of the template on the moto reached by `session` (in-process or a server).

    `template` replaces the file's content (a test's changed copy); paths inside it stay relative to the file's
    folder."""
    template_path = Path(template_path)
    root = template_path.parent
    source = template if template is not None else load_template(template_path)
    params = template_parameters(source, parameters, unchecked)
    transformed = sam_transform(source, region, {k: v for k, v in (parameters or {}).items()})
    resolver = _Resolver(transformed, stack_name, region, params)
    maker = _Maker(resolver, session or boto3.Session(region_name=region), region, root)

    pending = dict(transformed["Resources"])
    skipped: dict[str, str] = {}
    while pending:
        progressed = False
        for logical_id, res in list(pending.items()):
            cond = res.get("Condition")
            if cond and not resolver.conditions[cond]:
                pending.pop(logical_id)
                skipped[logical_id] = f"condition {cond} is false"
                progressed = True
                continue
            try:
                made = maker.make(logical_id, res)
            except _Unresolved:
                continue
            pending.pop(logical_id)
            progressed = True
            if made.attrs.get("skipped"):
                skipped[logical_id] = res["Type"]
            resolver.resources[logical_id] = made
        if not progressed:
            raise TemplateError(f"cannot resolve references among {sorted(pending)}")

    outputs = {}
    for name, out in (transformed.get("Outputs") or {}).items():
        cond = out.get("Condition")
        if cond and not resolver.conditions[cond]:
            continue
        outputs[name] = str(resolver.resolve(out["Value"]))
    plain = {k: ",".join(v) if isinstance(v, list) else str(v) for k, v in params.items()}
    _register(maker.client("cloudformation"), stack_name, outputs)
    return Stack(stack_name, region, plain, resolver.resources, outputs, skipped, transformed)


def _register(cloudformation: Any, stack_name: str, outputs: dict[str, str]) -> None:
    """Make the stack's outputs answer DescribeStacks, as a deployed stack's do (`lustrain submit --stack`,
    `lustrain runs --stack`): a CloudFormation stack of that name whose template holds only the outputs (its one
    resource, a wait-condition handle, creates nothing)."""
    body = {
        "Resources": {"Materialised": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {name: {"Value": value} for name, value in outputs.items()},
    }
    with warnings.catch_warnings():
        # moto says it does not parse the handle: it has nothing to parse, and creates nothing, as AWS does
        warnings.simplefilter("ignore", UserWarning)
        cloudformation.create_stack(StackName=stack_name, TemplateBody=json.dumps(body))


def _physical_name(stack: str, logical_id: str, limit: int = 63) -> str:
    return f"{stack}-{logical_id}".lower()[:limit]


def _local_path(root: Path, bucket: Any, key: Any, what: str) -> Path:
    if bucket != LOCAL_BUCKET:
        raise TemplateError(f"{what}: the twin runs local code only (got s3://{bucket}/{key})")
    return root / str(key)


class _Maker:
    """One method per resource type: the API calls CloudFormation would make."""

    def __init__(self, r: _Resolver, session: boto3.Session, region: str, root: Path):
        self.r = r
        self.session = session
        self.region = region
        self.root = root
        self.stack = str(r.pseudo["AWS::StackName"])
        #: one client per service for the whole stack, as CloudFormation's own calls share a session: a client
        #: made per resource was about a third of a twin's start (72 clients for one stack)
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, region_name=self.region)
        return self._clients[service]

    def make(self, logical_id: str, res: dict[str, Any]) -> Resource:
        kind = res["Type"]
        method = getattr(self, "_" + kind.replace("::", "_").lower(), None)
        if method is None:
            # Not materialised (it only matters on AWS): still resolve its properties, so the ordering stays
            # right, and give it a name and ARN that references to it can use.
            self.r.resolve(res.get("Properties") or {})
            name = _physical_name(self.stack, logical_id)
            arn = f"arn:aws:{kind.split('::')[1].lower()}:{self.region}:{ACCOUNT}:{name}"
            return Resource(logical_id, kind, name, {"Arn": arn, "skipped": "true"})
        result: Resource = method(logical_id, res)
        return result

    def props(self, res: dict[str, Any]) -> dict[str, Any]:
        resolved: dict[str, Any] = self.r.resolve(res.get("Properties") or {})
        return resolved

    # ------------------------------------------------------------------ storage and messaging
    def _aws_s3_bucket(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("BucketName") or _physical_name(self.stack, lid)
        s3 = self.client("s3")
        s3.create_bucket(Bucket=name)
        if (p.get("VersioningConfiguration") or {}).get("Status") == "Enabled":
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        if (
            (p.get("NotificationConfiguration") or {})
            .get("EventBridgeConfiguration", {})
            .get("EventBridgeEnabled")
        ):
            s3.put_bucket_notification_configuration(
                Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
            )
        if p.get("LifecycleConfiguration"):
            s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration=_lifecycle(p))
        return Resource(
            lid, res["Type"], name, {"Arn": f"arn:aws:s3:::{name}", "DomainName": f"{name}.s3.amazonaws.com"}
        )

    def _aws_s3_bucketpolicy(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        self.client("s3").put_bucket_policy(Bucket=p["Bucket"], Policy=json.dumps(p["PolicyDocument"]))
        return Resource(lid, res["Type"], p["Bucket"])

    def _aws_dynamodb_table(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("TableName") or _physical_name(self.stack, lid, 255)
        ddb = self.client("dynamodb")
        kwargs: dict[str, Any] = {
            "TableName": name,
            "KeySchema": p["KeySchema"],
            "AttributeDefinitions": p["AttributeDefinitions"],
            "BillingMode": p.get("BillingMode", "PROVISIONED"),
        }
        if "GlobalSecondaryIndexes" in p:
            kwargs["GlobalSecondaryIndexes"] = p["GlobalSecondaryIndexes"]
        if kwargs["BillingMode"] == "PROVISIONED":
            kwargs["ProvisionedThroughput"] = p.get(
                "ProvisionedThroughput", {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5}
            )
        arn = ddb.create_table(**kwargs)["TableDescription"]["TableArn"]
        ttl = p.get("TimeToLiveSpecification")
        if ttl and str(ttl.get("Enabled")).lower() == "true":
            ddb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
            )
        return Resource(lid, res["Type"], name, {"Arn": arn})

    def _aws_sns_topic(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        arn = self.client("sns").create_topic(
            Name=p.get("TopicName") or _physical_name(self.stack, lid, 256)
        )["TopicArn"]
        return Resource(lid, res["Type"], arn, {"TopicArn": arn, "TopicName": arn.rsplit(":", 1)[1]})

    def _aws_sns_subscription(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        arn = self.client("sns").subscribe(
            TopicArn=p["TopicArn"], Protocol=p["Protocol"], Endpoint=p["Endpoint"]
        )["SubscriptionArn"]
        return Resource(lid, res["Type"], arn)

    def _aws_sqs_queue(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("QueueName") or _physical_name(self.stack, lid, 80)
        url = self.client("sqs").create_queue(QueueName=name)["QueueUrl"]
        arn = f"arn:aws:sqs:{self.region}:{ACCOUNT}:{name}"
        return Resource(lid, res["Type"], url, {"Arn": arn, "QueueName": name, "QueueUrl": url})

    def _aws_sqs_queuepolicy(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        for url in p["Queues"]:
            self.client("sqs").set_queue_attributes(
                QueueUrl=url, Attributes={"Policy": json.dumps(p["PolicyDocument"])}
            )
        return Resource(lid, res["Type"], _physical_name(self.stack, lid))

    def _aws_logs_loggroup(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("LogGroupName") or _physical_name(self.stack, lid, 512)
        logs = self.client("logs")
        logs.create_log_group(logGroupName=name)
        if p.get("RetentionInDays"):
            logs.put_retention_policy(logGroupName=name, retentionInDays=int(p["RetentionInDays"]))
        return Resource(
            lid, res["Type"], name, {"Arn": f"arn:aws:logs:{self.region}:{ACCOUNT}:log-group:{name}:*"}
        )

    # ------------------------------------------------------------------ IAM
    def _aws_iam_managedpolicy(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("ManagedPolicyName") or f"{self.stack}-{lid}"[:128]
        arn = self.client("iam").create_policy(
            PolicyName=name,
            PolicyDocument=_versioned(p["PolicyDocument"]),
            Description=p.get("Description", ""),
        )["Policy"]["Arn"]
        return Resource(lid, res["Type"], arn, {"PolicyArn": arn})

    def _aws_iam_role(self, lid: str, res: dict[str, Any]) -> Resource:
        from lustrain.twin.iam import world

        p = self.props(res)
        name = p.get("RoleName") or f"{self.stack}-{lid}"[:64]
        iam = self.client("iam")
        role = iam.create_role(
            RoleName=name,
            Path=p.get("Path", "/"),
            AssumeRolePolicyDocument=json.dumps(p.get("AssumeRolePolicyDocument") or {}),
            Tags=[{"Key": t["Key"], "Value": str(t["Value"])} for t in p.get("Tags") or []],
        )["Role"]
        for policy in p.get("Policies") or []:
            iam.put_role_policy(
                RoleName=name,
                PolicyName=policy["PolicyName"],
                PolicyDocument=_versioned(policy["PolicyDocument"]),
            )
        for arn in p.get("ManagedPolicyArns") or []:
            if ":iam::aws:policy/" in arn:
                world.ensure_aws_managed_policy(ACCOUNT, arn)
            iam.attach_role_policy(RoleName=name, PolicyArn=arn)
        return Resource(lid, res["Type"], name, {"Arn": role["Arn"], "RoleId": role["RoleId"]})

    # ------------------------------------------------------------------ compute and orchestration
    def _aws_lambda_function(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("FunctionName") or _physical_name(self.stack, lid, 64)
        code_dir = _local_path(self.root, p["Code"].get("S3Bucket"), p["Code"].get("S3Key"), lid)
        handler = p["Handler"]
        module = handler.rsplit(".", 1)[0]
        if not (code_dir / (module.replace(".", "/") + ".py")).is_file():
            raise TemplateError(f"{lid}: Handler {handler} has no file under {code_dir}")
        kwargs: dict[str, Any] = {
            "FunctionName": name,
            "Runtime": p.get("Runtime", "python3.12"),
            "Role": p["Role"],
            "Handler": handler,
            "Code": {"ZipFile": _placeholder_zip()},
            "Timeout": int(p.get("Timeout", 3)),
            "MemorySize": int(p.get("MemorySize", 128)),
            "Environment": {
                "Variables": {
                    k: str(v) for k, v in ((p.get("Environment") or {}).get("Variables") or {}).items()
                }
            },
            "Architectures": list(p.get("Architectures") or ["x86_64"]),
        }
        if (p.get("DeadLetterConfig") or {}).get("TargetArn"):
            kwargs["DeadLetterConfig"] = {"TargetArn": p["DeadLetterConfig"]["TargetArn"]}
        arn = self.client("lambda").create_function(**kwargs)["FunctionArn"]
        return Resource(lid, res["Type"], name, {"Arn": arn, "Module": module.rsplit(".", 1)[-1]})

    def _aws_lambda_eventinvokeconfig(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        kwargs = {k: p[k] for k in ("MaximumRetryAttempts", "MaximumEventAgeInSeconds") if k in p}
        self.client("lambda").put_function_event_invoke_config(FunctionName=p["FunctionName"], **kwargs)
        return Resource(lid, res["Type"], _physical_name(self.stack, lid))

    def _aws_lambda_permission(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        kwargs = {k: p[k] for k in ("SourceArn", "SourceAccount") if k in p}
        self.client("lambda").add_permission(
            FunctionName=p["FunctionName"],
            StatementId=lid,
            Action=p["Action"],
            Principal=p["Principal"],
            **kwargs,
        )
        return Resource(lid, res["Type"], lid)

    def _aws_stepfunctions_statemachine(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        subs = {k: str(v) for k, v in (p.get("DefinitionSubstitutions") or {}).items()}
        if "DefinitionS3Location" in p:
            location = p["DefinitionS3Location"]
            text = _local_path(self.root, location.get("Bucket"), location.get("Key"), lid).read_text()
        elif "DefinitionString" in p:
            text = str(p["DefinitionString"])
        else:
            text = json.dumps(p["Definition"])

        def substitute(m: re.Match[str]) -> str:
            if m.group(1) not in subs:
                raise TemplateError(f"{lid}: ${{{m.group(1)}}} has no DefinitionSubstitutions entry")
            return subs[m.group(1)]

        definition = re.sub(r"\$\{([A-Za-z0-9_]+)\}", substitute, text)
        json.loads(definition)  # a substitution that breaks the JSON fails here, not inside moto
        name = p.get("StateMachineName") or _physical_name(self.stack, lid, 80)
        arn = self.client("stepfunctions").create_state_machine(
            name=name,
            definition=definition,
            roleArn=p["RoleArn"],
            type=p.get("StateMachineType", "STANDARD"),
            tags=[{"key": t["Key"], "value": str(t["Value"])} for t in p.get("Tags") or []],
        )["stateMachineArn"]
        return Resource(lid, res["Type"], arn, {"Arn": arn, "Name": name})

    def _aws_events_rule(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.props(res)
        name = p.get("Name") or _physical_name(self.stack, lid, 64)
        kwargs: dict[str, Any] = {"Name": name, "State": p.get("State", "ENABLED")}
        if p.get("EventPattern") is not None:
            kwargs["EventPattern"] = json.dumps(p["EventPattern"])
        if p.get("ScheduleExpression"):
            kwargs["ScheduleExpression"] = p["ScheduleExpression"]
        if p.get("Description"):
            kwargs["Description"] = p["Description"]
        events = self.client("events")
        arn = events.put_rule(**kwargs)["RuleArn"]
        targets = [_target(t) for t in p.get("Targets") or []]
        if targets:
            events.put_targets(Rule=name, Targets=targets)
        return Resource(lid, res["Type"], name, {"Arn": arn})


def _versioned(document: dict[str, Any]) -> str:
    """SAM writes some policies without a Version, which IAM takes as 2008-10-17 (the same but for policy
    variables, which lustrain does not use) and moto refuses; the twin states the current version."""
    return json.dumps({"Version": "2012-10-17", **document})


def _target(t: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "Id",
        "Arn",
        "RoleArn",
        "Input",
        "InputPath",
        "InputTransformer",
        "RetryPolicy",
        "DeadLetterConfig",
    )
    return {k: v for k, v in t.items() if k in keep}


def _lifecycle(p: dict[str, Any]) -> dict[str, Any]:
    rules = []
    for rule in p["LifecycleConfiguration"].get("Rules", []):
        out: dict[str, Any] = {"ID": rule.get("Id", "rule"), "Status": rule.get("Status", "Enabled")}
        out["Filter"] = {"Prefix": rule.get("Prefix", "")}
        if "ExpirationInDays" in rule:
            out["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
        if "NoncurrentVersionExpiration" in rule:
            out["NoncurrentVersionExpiration"] = {
                "NoncurrentDays": int(rule["NoncurrentVersionExpiration"].get("NoncurrentDays", 30))
            }
        if "AbortIncompleteMultipartUpload" in rule:
            out["AbortIncompleteMultipartUpload"] = {
                "DaysAfterInitiation": int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
            }
        rules.append(out)
    return {"Rules": rules}


def _placeholder_zip() -> bytes:
    """moto stores a code package; the twin runs the handler from the checkout, in-process."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("README.txt", "lustrain twin: handlers run in-process from functions/\n")
    return buffer.getvalue()


def copy_template(path: str | Path) -> dict[str, Any]:
    """template.yaml as data, to change in a test before materialising it."""
    return copy.deepcopy(load_template(path))
