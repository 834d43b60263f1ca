"""The stack's allow-lists: what an administrator lets a job spec do in this account.

Each rule comes from one environment variable of the stack (comma-separated; unset or empty means no limit):

    LUSTRAIN_ALLOWED_DATA_PREFIXES     data.s3_uri must lie under one of these s3:// prefixes
    LUSTRAIN_ALLOWED_OUTPUT_PREFIXES   output.s3_uri and the checkpoint location likewise
    LUSTRAIN_ALLOWED_CODE_PREFIXES     code.source (on S3) likewise; the stack sets it to the data prefixes plus
                                       its own upload locations whenever the data prefixes are limited
    LUSTRAIN_ALLOWED_IMAGE_REGISTRIES  image.uri's registry: a host (123456789012.dkr.ecr.us-east-1.amazonaws.com)
                                       or an account id (123456789012)
    LUSTRAIN_ALLOWED_INSTANCE_TYPES    compute.instance_type
    LUSTRAIN_MAX_INSTANCES_PER_RUN     compute.instance_count at most this
    LUSTRAIN_MAX_BUDGET_USD            the plan's estimated cost at most this
    LUSTRAIN_ALLOWED_EXISTING_RESOURCES  network.subnet_id, network.security_group_ids and
                                       filesystem.file_system_id: existing resources a run may use, by id
                                       ("none" matches no id: every run builds its own network and file system)
    LUSTRAIN_ALLOWED_SECRETS           code.secrets: the ARNs a job may read (`*` matches any characters, as in
                                       an IAM policy's Resource; ${aws:PrincipalTag/lustrain-team} is the run's
                                       team, as IAM reads it from the job's session); the stack sets it to the
                                       same list its SageMaker role may read, by default the secrets named
                                       <stack>/<team>/... and the parameters under /<stack>/<team>/
    LUSTRAIN_NOTICE_WEBHOOK_SECRET     the chat webhook's secret: never a job's (code.secrets naming it is refused,
                                       and the SageMaker role is denied it)

The template always sets the three prefix lists: to the administrator's AllowedDataPrefixes / AllowedOutputPrefixes,
or, where those are empty (the default), to the stack's own s3://<artifacts>/data/ and s3://<artifacts>/results/
(Settings.own_data_prefix, own_output_prefix), the very locations its IAM policies grant; unset (a test, a direct
invoke) means no limit here and no grant there. Whatever the lists say, a spec may not point its data, output or
checkpoints into the stack's own code, upload and archive prefixes (`for_stack`: Settings.reserved_prefixes),
where a job's writes would pass for another run's code or archive.

A prefix matches at a path boundary: "s3://data/team" allows s3://data/team/x/ but not s3://data/team-b/.
Results are kept by team and run: a run's output and checkpoints lie in its team's folder of an allowed output
location, exactly <prefix><team>/ (the run's own objects then under <prefix><team>/<job id>/, the only place its
role writes), and a preparation's output in a folder of its own inside it, <prefix><team>/<name>/..., whose first
folder is not a run's id: no run's folder ever lies in another's, nor in a preparation's (lustrain_core.teams).
The registry rule applies to custom images (image.uri); framework_version images are SageMaker's own Deep
Learning Containers, resolved per region by start_training, and are not a registry the user picks.
Reusing an existing file system mounts whatever it holds into the training job, and an existing subnet and
security groups decide what the job can reach: whoever can drop a spec would otherwise choose them.
A spec outside a rule raises SpecForbidden naming the rule, its variable and the field.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from lustrain_core.config import Settings
from lustrain_core.errors import SpecForbidden
from lustrain_core.spec import JobSpec, PrepareSpec
from lustrain_core.teams import DEFAULT_TEAM, SESSION_TAG, team_folder

DATA_PREFIXES = "LUSTRAIN_ALLOWED_DATA_PREFIXES"
OUTPUT_PREFIXES = "LUSTRAIN_ALLOWED_OUTPUT_PREFIXES"
CODE_PREFIXES = "LUSTRAIN_ALLOWED_CODE_PREFIXES"
IMAGE_REGISTRIES = "LUSTRAIN_ALLOWED_IMAGE_REGISTRIES"
INSTANCE_TYPES = "LUSTRAIN_ALLOWED_INSTANCE_TYPES"
MAX_INSTANCES = "LUSTRAIN_MAX_INSTANCES_PER_RUN"
MAX_BUDGET = "LUSTRAIN_MAX_BUDGET_USD"
EXISTING_RESOURCES = "LUSTRAIN_ALLOWED_EXISTING_RESOURCES"
SECRETS = "LUSTRAIN_ALLOWED_SECRETS"
WEBHOOK_SECRET = "LUSTRAIN_NOTICE_WEBHOOK_SECRET"  # noqa: S105 (the setting's name)
#: the policy variable of the run's team in LUSTRAIN_ALLOWED_SECRETS, as IAM resolves it in the SageMaker role
TEAM_VARIABLE = "${aws:PrincipalTag/" + SESSION_TAG + "}"
#: a run's id, <spec name>-<8 hex> (steps/job.py): no preparation's folder is named so
_JOB_ID_SHAPE = re.compile(r"[a-z0-9][a-z0-9-]*-[0-9a-f]{8}")


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float]) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        what = "whole number" if kind is int else "number"
        raise ValueError(f"stack setting {name}={raw!r} is not a {what}: fix the stack's parameter") from None
    if value <= 0:
        raise ValueError(f"stack setting {name}={raw!r} must be above 0 (leave it empty for no limit)")
    return value


def _prefix(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


@dataclass(frozen=True)
class Policy:
    data_prefixes: tuple[str, ...] = ()
    output_prefixes: tuple[str, ...] = ()
    code_prefixes: tuple[str, ...] = ()
    image_registries: tuple[str, ...] = ()
    instance_types: tuple[str, ...] = ()
    max_instances: float | None = None
    max_budget_usd: float | None = None
    existing_resources: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    #: the chat webhook's secret (the notify function's alone)
    webhook_secret: str = ""
    #: the stack's own locations no spec may read data from or write to (code bundles, uploads, archives)
    reserved_prefixes: tuple[str, ...] = ()

    @classmethod
    def for_stack(cls, settings: Settings) -> Policy:
        """The stack's rules: its environment's lists, and its own reserved locations."""
        return replace(cls.from_env(settings.extra), reserved_prefixes=settings.reserved_prefixes)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Policy:
        for name in (DATA_PREFIXES, OUTPUT_PREFIXES, CODE_PREFIXES):
            for prefix in _list(env, name):
                if not prefix.startswith("s3://"):
                    raise ValueError(f"stack setting {name}: {prefix!r} is not an s3:// prefix")
        return cls(
            data_prefixes=_list(env, DATA_PREFIXES),
            output_prefixes=_list(env, OUTPUT_PREFIXES),
            code_prefixes=_list(env, CODE_PREFIXES),
            image_registries=_list(env, IMAGE_REGISTRIES),
            instance_types=_list(env, INSTANCE_TYPES),
            max_instances=_number(env, MAX_INSTANCES, int),
            max_budget_usd=_number(env, MAX_BUDGET, float),
            existing_resources=_list(env, EXISTING_RESOURCES),
            secrets=_list(env, SECRETS),
            webhook_secret=env.get(WEBHOOK_SECRET, "").strip(),
        )

    def team_folders(self, team: str) -> tuple[str, ...]:
        """Where a run of `team` keeps its results: its team's folder of each allowed output location."""
        return tuple(team_folder(p, team) for p in self.output_prefixes)

    def check_spec(self, spec: JobSpec, team: str = DEFAULT_TEAM) -> None:
        """The rules a spec alone decides for a run of `team`; run before anything is measured or created."""
        self._not_reserved(spec)
        self._under(spec.data.s3_uri, self.data_prefixes, "data.s3_uri", DATA_PREFIXES, "data")
        read = [("data.s3_uri", spec.data.s3_uri)]
        if spec.code.source.startswith("s3://"):
            read.append(("code.source", spec.code.source))
        self._no_other_teams(read, team)
        self._in_team_folder(spec.output.s3_uri, "output.s3_uri", team)
        self._in_team_folder(spec.checkpoints_base, "checkpoints.s3_uri", team)
        resume = spec.checkpoints.resume_from
        if resume is not None and resume.startswith("s3://"):
            self._under(resume, self.team_folders(team), "checkpoints.resume_from", OUTPUT_PREFIXES, "output")
        if spec.code.source.startswith("s3://"):
            self._under(spec.code.source, self.code_prefixes, "code.source", CODE_PREFIXES, "code")
        if self.instance_types and spec.compute.instance_type not in self.instance_types:
            raise SpecForbidden(
                f"compute.instance_type {spec.compute.instance_type} is not allowed by this stack "
                f"({INSTANCE_TYPES}): allowed: {', '.join(self.instance_types)}",
                rule=INSTANCE_TYPES,
                field="compute.instance_type",
            )
        if self.max_instances is not None and spec.compute.instance_count > self.max_instances:
            raise SpecForbidden(
                f"compute.instance_count {spec.compute.instance_count} is above this stack's limit of "
                f"{self.max_instances:g} instances per run ({MAX_INSTANCES})",
                rule=MAX_INSTANCES,
                field="compute.instance_count",
            )
        if self.image_registries and spec.image.uri is not None:
            host = spec.image.uri.split("/", 1)[0].lower()
            account = host.split(".", 1)[0]
            allowed = {r.lower() for r in self.image_registries}
            if host not in allowed and account not in allowed:
                raise SpecForbidden(
                    f"image.uri registry {host} is not allowed by this stack ({IMAGE_REGISTRIES}): "
                    f"allowed: {', '.join(self.image_registries)}",
                    rule=IMAGE_REGISTRIES,
                    field="image.uri",
                )

        if self.existing_resources:
            named = (
                ("network.subnet_id", [spec.network.subnet_id]),
                ("network.security_group_ids", list(spec.network.security_group_ids)),
                ("filesystem.file_system_id", [spec.filesystem.file_system_id]),
            )
            for field, ids in named:
                for resource in ids:
                    if resource is not None and resource not in self.existing_resources:
                        raise SpecForbidden(
                            f"{field} {resource} is not one of the existing resources this stack lets a run use "
                            f"({EXISTING_RESOURCES}): allowed: {', '.join(self.existing_resources)}; leave it "
                            "out and the run creates its own",
                            rule=EXISTING_RESOURCES,
                            field=field,
                        )

        for name, arn in spec.code.secrets.items():
            if self.webhook_secret and _same_secret(arn, self.webhook_secret):
                raise SpecForbidden(
                    f"code.secrets.{name} {arn} is the stack's chat webhook, which only the stack's notices may "
                    "use: name a secret of your team's instead"
                    + (f" ({', '.join(self.team_secrets(team))})" if self.secrets else ""),
                    rule=WEBHOOK_SECRET,
                    field=f"code.secrets.{name}",
                )
            # fnmatchcase's * crosses "/" as IAM's does; ARNs hold no [ ] for it to read as a class
            if self.secrets and not any(fnmatch.fnmatchcase(arn, allowed) for allowed in self.team_secrets(team)):
                raise SpecForbidden(
                    f"code.secrets.{name} {arn} is not a secret a training job of team {team} may read ({SECRETS}): "
                    f"allowed: {', '.join(self.team_secrets(team))}",
                    rule=SECRETS,
                    field=f"code.secrets.{name}",
                )

    def team_secrets(self, team: str) -> tuple[str, ...]:
        """The secrets a job of `team` may read: the stack's list with the team in place of its policy variable."""
        return tuple(allowed.replace(TEAM_VARIABLE, team) for allowed in self.secrets)

    def _no_other_teams(self, located: list[tuple[str, str]], team: str) -> None:
        """What a run reads (its data, code, a preparation's source and tokenizer) lies in no other team's folder of
        a results location: FSx would bring another team's checkpoints or model into the run's file system, which
        IAM does not guard, and a preparation's role would be granted them."""
        for field, uri in located:
            for prefix in self.output_prefixes:
                rest = _prefix(uri)[len(_prefix(prefix)) :] if _prefix(uri).startswith(_prefix(prefix)) else None
                if rest is not None and rest.split("/", 1)[0] != team:
                    raise SpecForbidden(
                        f"{field} {uri} lies in a results location outside team {team}'s folder "
                        f"({team_folder(prefix, team)}): a run reads only its own team's results",
                        rule=OUTPUT_PREFIXES,
                        field=field,
                    )

    def _in_team_folder(self, uri: str, field: str, team: str) -> None:
        """A run's results location is exactly its team's folder of an allowed output location."""
        folders = self.team_folders(team)
        if folders and _prefix(uri) not in folders:
            raise SpecForbidden(
                f"{field} {uri} is not a results folder of team {team} ({OUTPUT_PREFIXES}): a run keeps its results "
                f"in its team's folder, one of: {', '.join(folders)} (the run writes under <folder><job id>/)",
                rule=OUTPUT_PREFIXES,
                field=field,
            )

    def check_plan(self, plan: dict[str, Any]) -> None:
        """The rules that need the plan (its cost estimate); run before the job is recorded."""
        estimate = plan["cost"]["total_usd"]
        if estimate is None:  # an instance type with no confirmed price (planner.unpriced)
            if self.max_budget_usd is not None:
                instance_type = plan.get("quota", {}).get("instance_type")
                raise SpecForbidden(
                    f"compute.instance_type {instance_type} has no confirmed on-demand price, so the run cannot be "
                    f"held to this stack's limit of ${self.max_budget_usd:,.2f} per run ({MAX_BUDGET}): add its price "
                    "to the catalogue (data/instance_types.json)",
                    rule=MAX_BUDGET,
                    field="compute.instance_type",
                )
            return
        total = float(estimate)
        if self.max_budget_usd is not None and total > self.max_budget_usd:
            raise SpecForbidden(
                f"the run is estimated at ${total:,.2f}, above this stack's limit of ${self.max_budget_usd:,.2f} "
                f"per run ({MAX_BUDGET}): lower compute.instance_count or compute.max_runtime_hours",
                rule=MAX_BUDGET,
                field="budget.max_usd",
                estimate_usd=total,
            )

    def check_prepare(self, spec: PrepareSpec, team: str = DEFAULT_TEAM) -> None:
        """The rules of a data preparation run (kind: prepare): it reads text where a training run may read data,
        writes where one may write output (its own role, steps/prepare_role, is bounded by these lists), on the
        instance types and counts the stack allows."""
        located = [("source", spec.source), ("output", spec.output)]
        if spec.tokenizer.startswith("s3://"):
            located.append(("tokenizer", spec.tokenizer))
        self._none_reserved(located)
        self._under(spec.source, self.data_prefixes, "source", DATA_PREFIXES, "data")
        if spec.tokenizer.startswith("s3://"):
            self._under(spec.tokenizer, self.data_prefixes, "tokenizer", DATA_PREFIXES, "data")
        self._no_other_teams([(field, uri) for field, uri in located if field != "output"], team)
        self._prepare_output(spec, team)
        if self.instance_types and spec.instance_type not in self.instance_types:
            raise SpecForbidden(
                f"instance_type {spec.instance_type} is not allowed by this stack ({INSTANCE_TYPES}): allowed: "
                f"{', '.join(self.instance_types)}",
                rule=INSTANCE_TYPES,
                field="instance_type",
            )
        if self.max_instances is not None and spec.instances > self.max_instances:
            raise SpecForbidden(
                f"instances {spec.instances} is above this stack's limit of {self.max_instances:g} instances per "
                f"run ({MAX_INSTANCES})",
                rule=MAX_INSTANCES,
                field="instances",
            )

    def _prepare_output(self, spec: PrepareSpec, team: str) -> None:
        """A preparation's own role writes and deletes under its output: a folder of its own inside its team's,
        <prefix><team>/<name>/..., whose first folder is not a run's id, so that it holds no run's folder, now or
        later (a run's results lie exactly in <prefix><team>/<job id>/)."""
        folders = self.team_folders(team)
        if not folders:
            return
        output = _prefix(spec.output)
        inside = next((f for f in folders if output.startswith(f) and output != f), None)
        first = output[len(inside) :].split("/", 1)[0] if inside else ""
        if inside is None or _JOB_ID_SHAPE.fullmatch(first):
            example = f"{folders[0]}{spec.name}/"
            why = (
                f"its folder {first} is named as a run's results folder is (<name>-<8 hex>)"
                if inside
                else "a preparation writes in a folder of its own inside its team's results folder, where no run's "
                "results lie"
            )
            raise SpecForbidden(
                f"output {spec.output}: {why}; give it a folder such as {example} (team {team}'s folders: "
                f"{', '.join(folders)})",
                rule=OUTPUT_PREFIXES,
                field="output",
            )

    def check_prepare_plan(self, plan: dict[str, Any]) -> None:
        """A preparation's estimated cost (prepare_plan.plan_of) within the stack's limit per run; a type with no
        price cannot be judged and is refused where the stack sets a limit."""
        if self.max_budget_usd is None:
            return
        cost = plan.get("cost_usd")
        if cost is None or float(cost) > self.max_budget_usd:
            shown = "unknown (no price for its instance type)" if cost is None else f"${float(cost):,.2f}"
            raise SpecForbidden(
                f"the data preparation is estimated at {shown}, against this stack's limit of "
                f"${self.max_budget_usd:,.2f} per run ({MAX_BUDGET}): lower instances or use a priced type",
                rule=MAX_BUDGET,
                field="instances",
                estimate_usd=cost,
            )

    def _not_reserved(self, spec: JobSpec) -> None:
        self._none_reserved(
            [
                ("data.s3_uri", spec.data.s3_uri),
                ("output.s3_uri", spec.output.s3_uri),
                ("checkpoints.s3_uri", spec.checkpoints_base),
            ]
        )

    def _none_reserved(self, located: list[tuple[str, str]]) -> None:
        for field, uri in located:
            for reserved in self.reserved_prefixes:
                mine, theirs = _prefix(uri), _prefix(reserved)
                if mine.startswith(theirs) or theirs.startswith(mine):
                    raise SpecForbidden(
                        f"{field} {uri} overlaps {reserved}, where this stack keeps the runs' code bundles, uploads "
                        "and archives: use a location of your own (under the stack's results/ or data/ prefix, or "
                        "one AllowedOutputPrefixes / AllowedDataPrefixes lists)",
                        rule="reserved",
                        field=field,
                    )

    @staticmethod
    def _under(uri: str, prefixes: tuple[str, ...], field: str, rule: str, what: str) -> None:
        if prefixes and not any(_prefix(uri).startswith(_prefix(p)) for p in prefixes):
            raise SpecForbidden(
                f"{field} {uri} is outside the {what} locations this stack allows ({rule}): "
                f"use a location under {', '.join(prefixes)}",
                rule=rule,
                field=field,
            )


def _same_secret(arn: str, secret: str) -> bool:
    """Whether a code.secrets ARN names `secret`: the same ARN, or either without Secrets Manager's 6-character
    suffix (a secret is read by its partial ARN too)."""
    def partial(a: str) -> str:
        return re.sub(r"-[A-Za-z0-9]{6}$", "", a)

    return partial(arn) == partial(secret)
