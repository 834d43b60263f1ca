"""Materialise the stack of template.yaml on moto through the service APIs.

moto's CloudFormation ignores DefinitionSubstitutions and knows no SAM, so the twin reads the template itself,
resolves the intrinsics it uses, and creates each resource with the API call CloudFormation would make. Resources
that only matter on AWS (policies, log groups, permissions, alarms) are recorded as skipped, not faked.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from lustrain.twin.cfn import load_template

ACCOUNT = "123456789012"
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

    def ref(self, logical_id: str) -> str:
        return self.resources[logical_id].ref

    def function_names(self) -> dict[str, str]:
        """Handler module name -> Lambda function name, for every function of the stack."""
        out = {}
        for r in self.resources.values():
            if r.type == "AWS::Serverless::Function":
                out[r.attrs["Module"]] = r.ref
        return out

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.type == type_]


class _Resolver:
    def __init__(self, template: dict[str, Any], stack_name: str, region: str, params: dict[str, str]):
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


def materialise(
    template_path: str | Path,
    *,
    stack_name: str = "lustrain",
    region: str = "us-east-1",
    parameters: dict[str, str] | None = None,
    session: boto3.Session | None = None,
) -> Stack:
    """Create every resource of the template on the moto reached by `session` (in-process or a server)."""
    template_path = Path(template_path)
    root = template_path.parent
    template = load_template(template_path)
    params = {
        name: str(spec.get("Default", ""))
        if not isinstance(spec.get("Default"), list)
        else ",".join(spec["Default"])
        for name, spec in (template.get("Parameters") or {}).items()
    }
    unknown = set(parameters or {}) - set(params)
    if unknown:
        raise TemplateError(
            f"unknown template parameters {sorted(unknown)}; the template has {sorted(params)}"
        )
    params.update(parameters or {})
    for name, spec in (template.get("Parameters") or {}).items():
        if str(spec.get("Type", "")).startswith(("CommaDelimitedList", "List<")):
            params[name] = [v.strip() for v in str(params[name]).split(",")]  # type: ignore[assignment]
    resolver = _Resolver(template, stack_name, region, params)
    maker = _Maker(resolver, session or boto3.Session(region_name=region), region, root, template)

    pending = dict(template["Resources"])
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
    maker.wire_events()

    outputs = {}
    for name, out in (template.get("Outputs") or {}).items():
        cond = out.get("Condition")
        if cond and not resolver.conditions[cond]:
            continue
        outputs[name] = str(resolver.resolve(out["Value"]))
    return Stack(stack_name, region, params, resolver.resources, outputs, skipped)


def _physical_name(stack: str, logical_id: str, limit: int = 63) -> str:
    return f"{stack}-{logical_id}".lower()[:limit]


class _Maker:
    """One method per resource type: the API calls CloudFormation would make."""

    def __init__(
        self, r: _Resolver, session: boto3.Session, region: str, root: Path, template: dict[str, Any]
    ):
        self.r = r
        self.session = session
        self.region = region
        self.root = root
        self.globals = (template.get("Globals") or {}).get("Function") or {}
        self.sm_globals = (template.get("Globals") or {}).get("StateMachine") or {}
        self.stack = r.pseudo["AWS::StackName"]
        self.deferred_events: list[tuple[str, str, dict[str, Any]]] = []
        self._role_arn: str | None = None

    def client(self, service: str) -> Any:
        return self.session.client(service, region_name=self.region)

    def make(self, logical_id: str, res: dict[str, Any]) -> Resource:
        kind = res["Type"]
        method = getattr(self, "_" + kind.replace("::", "_").lower(), None)
        if method is None:
            # Not materialised (IAM policies, log groups, permissions...): still resolve its properties, so the
            # ordering stays right, and give it a name and ARN that references to it can use.
            self.r.resolve(res.get("Properties") or {})
            name = _physical_name(self.stack, logical_id)
            arn = f"arn:aws:{kind.split('::')[1].lower()}:{self.region}:{ACCOUNT}:{name}"
            return Resource(logical_id, kind, name, {"Arn": arn, "skipped": "true"})
        result: Resource = method(logical_id, res)
        return result

    # ------------------------------------------------------------------ storage and messaging
    def _aws_s3_bucket(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.r.resolve(res.get("Properties") or {})
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

    def _aws_dynamodb_table(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.r.resolve(res.get("Properties") or {})
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
        p = self.r.resolve(res.get("Properties") or {})
        arn = self.client("sns").create_topic(
            Name=p.get("TopicName") or _physical_name(self.stack, lid, 256)
        )["TopicArn"]
        for sub in p.get("Subscription") or []:
            self.client("sns").subscribe(TopicArn=arn, Protocol=sub["Protocol"], Endpoint=sub["Endpoint"])
        return Resource(lid, res["Type"], arn, {"TopicArn": arn, "TopicName": arn.rsplit(":", 1)[1]})

    def _aws_sqs_queue(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.r.resolve(res.get("Properties") or {})
        name = p.get("QueueName") or _physical_name(self.stack, lid, 80)
        url = self.client("sqs").create_queue(QueueName=name)["QueueUrl"]
        arn = f"arn:aws:sqs:{self.region}:{ACCOUNT}:{name}"
        return Resource(lid, res["Type"], url, {"Arn": arn, "QueueName": name, "QueueUrl": url})

    def _aws_iam_role(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.r.resolve(res.get("Properties") or {})
        name = p.get("RoleName") or _physical_name(self.stack, lid, 64)
        arn = self.client("iam").create_role(
            RoleName=name, AssumeRolePolicyDocument=json.dumps(p.get("AssumeRolePolicyDocument") or {})
        )["Role"]["Arn"]
        return Resource(lid, res["Type"], name, {"Arn": arn, "RoleId": name})

    # ------------------------------------------------------------------ compute and orchestration
    def _twin_role(self) -> str:
        """SAM creates a role per function; on the twin one role stands for them (IAM is not enforced)."""
        if self._role_arn is None:
            self._role_arn = self.client("iam").create_role(
                RoleName=f"{self.stack}-twin-execution", AssumeRolePolicyDocument="{}"
            )["Role"]["Arn"]
        return self._role_arn

    def _aws_serverless_function(self, lid: str, res: dict[str, Any]) -> Resource:
        props = {**self.globals, **(res.get("Properties") or {})}
        env = {
            **((self.globals.get("Environment") or {}).get("Variables") or {}),
            **(((res.get("Properties") or {}).get("Environment") or {}).get("Variables") or {}),
        }
        p = self.r.resolve({k: v for k, v in props.items() if k not in ("Events", "Environment")})
        variables = {k: str(v) for k, v in self.r.resolve(env).items()}
        name = p.get("FunctionName") or _physical_name(self.stack, lid, 64)
        code_uri = self.root / str(p.get("CodeUri", "."))
        handler = p["Handler"]
        module = handler.rsplit(".", 1)[0]
        if not (code_uri / (module.replace(".", "/") + ".py")).is_file():
            raise TemplateError(f"{lid}: Handler {handler} has no file under {code_uri}")
        arn = self.client("lambda").create_function(
            FunctionName=name,
            Runtime=p.get("Runtime", "python3.12"),
            Role=p.get("Role") or self._twin_role(),
            Handler=handler,
            Code={"ZipFile": _placeholder_zip()},
            Timeout=int(p.get("Timeout", 3)),
            MemorySize=int(p.get("MemorySize", 128)),
            Environment={"Variables": variables},
            Architectures=list(p.get("Architectures") or ["x86_64"]),
        )["FunctionArn"]
        for ev_name, ev in ((res.get("Properties") or {}).get("Events") or {}).items():
            self.deferred_events.append((arn, f"{lid}{ev_name}", ev))
        return Resource(lid, res["Type"], name, {"Arn": arn, "Module": module.rsplit(".", 1)[-1]})

    def _aws_serverless_statemachine(self, lid: str, res: dict[str, Any]) -> Resource:
        raw = res.get("Properties") or {}
        subs = {k: str(v) for k, v in self.r.resolve(raw.get("DefinitionSubstitutions") or {}).items()}
        p = self.r.resolve({k: v for k, v in raw.items() if k not in ("Events", "DefinitionSubstitutions")})
        if "DefinitionUri" in p:
            text = (self.root / str(p["DefinitionUri"])).read_text()
        else:
            text = json.dumps(p["Definition"])

        def substitute(m: re.Match[str]) -> str:
            if m.group(1) not in subs:
                raise TemplateError(f"{lid}: ${{{m.group(1)}}} has no DefinitionSubstitutions entry")
            return subs[m.group(1)]

        definition = re.sub(r"\$\{([A-Za-z0-9_]+)\}", substitute, text)
        json.loads(definition)  # a substitution that breaks the JSON fails here, not inside moto
        name = p.get("Name") or _physical_name(self.stack, lid, 80)
        arn = self.client("stepfunctions").create_state_machine(
            name=name,
            definition=definition,
            roleArn=p.get("Role") or self._twin_role(),
            type=p.get("Type", "STANDARD"),
        )["stateMachineArn"]
        for ev_name, ev in (raw.get("Events") or {}).items():
            self.deferred_events.append((arn, f"{lid}{ev_name}", ev))
        return Resource(lid, res["Type"], arn, {"Arn": arn, "Name": name})

    def _aws_events_rule(self, lid: str, res: dict[str, Any]) -> Resource:
        p = self.r.resolve(res.get("Properties") or {})
        name = p.get("Name") or _physical_name(self.stack, lid, 64)
        self._put_rule(name, p.get("EventPattern"), p.get("ScheduleExpression"), p.get("State", "ENABLED"))
        targets = [_target(t) for t in p.get("Targets") or []]
        if targets:
            self.client("events").put_targets(Rule=name, Targets=targets)
        return Resource(
            lid, res["Type"], name, {"Arn": f"arn:aws:events:{self.region}:{ACCOUNT}:rule/{name}"}
        )

    def _put_rule(self, name: str, pattern: Any, schedule: str | None, state: str) -> None:
        kwargs: dict[str, Any] = {"Name": name, "State": state}
        if pattern is not None:
            kwargs["EventPattern"] = json.dumps(pattern)
        if schedule:
            kwargs["ScheduleExpression"] = schedule
        self.client("events").put_rule(**kwargs)

    def wire_events(self) -> None:
        """SAM `Events:` on functions and state machines become EventBridge rules targeting them."""
        for target_arn, rule_id, ev in self.deferred_events:
            props = self.r.resolve(ev.get("Properties") or {})
            kind = ev["Type"]
            if kind not in ("EventBridgeRule", "CloudWatchEvent", "Schedule", "ScheduleV2"):
                continue
            name = props.get("RuleName") or props.get("Name") or _physical_name(self.stack, rule_id, 64)
            schedule = props.get("Schedule") or props.get("ScheduleExpression")
            state = (
                "DISABLED" if props.get("Enabled") is False or props.get("State") == "DISABLED" else "ENABLED"
            )
            self._put_rule(name, props.get("Pattern"), schedule, state)
            target: dict[str, Any] = {
                "Id": (props.get("Target") or {}).get("Id", "target"),
                "Arn": target_arn,
            }
            if props.get("RetryPolicy"):
                target["RetryPolicy"] = props["RetryPolicy"]
            if (props.get("DeadLetterConfig") or {}).get("Arn"):
                target["DeadLetterConfig"] = {"Arn": props["DeadLetterConfig"]["Arn"]}
            if props.get("Input"):
                target["Input"] = props["Input"]
            if props.get("InputPath"):
                target["InputPath"] = props["InputPath"]
            self.client("events").put_targets(Rule=name, Targets=[target])


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
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("README.txt", "lustrain twin: handlers run in-process from functions/\n")
    return buf.getvalue()
