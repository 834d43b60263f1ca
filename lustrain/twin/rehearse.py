"""`lustrain rehearse SPEC`: a whole run on the local twin, as it would happen on AWS.

The real template and state machine definition are materialised on moto, the spec is dropped into the jobs bucket
(S3 -> EventBridge -> StartExecution, as on AWS), the real handlers run in-process, the training job is a real
PyTorch run on this machine's CPUs, and at the end every resource the run created is counted: there must be none
left but what the spec keeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3
import yaml
from lustrain_core import leftovers
from lustrain_core import resources as registry
from lustrain_core.document import Attempt, Recovery
from lustrain_core.launch import compile_offline
from lustrain_core.spec import JobSpec, load_spec_file
from lustrain_core.steps import attempts

from lustrain.submit import local_code_dir, upload_code_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = REPO_ROOT / "template.yaml"
REGION = "us-east-1"
STACK_NAME = "lustrain-twin"
TAG_JOB = "lustrain:job-id"
#: the twin's account has this many instances of each type unless the run needs more (`--quota` overrides)
DEFAULT_QUOTA = 8

#: Template parameters that shrink AWS's minutes to the twin's seconds.
FAST_PARAMETERS: dict[str, str] = {
    "FilesystemPollInitialSeconds": "1",
    "FilesystemPollMaxSeconds": "2",
    "QueuePollSeconds": "1",
    # the twin's waits are seconds for AWS's minutes while max_queue_hours stays in hours: the history bound on
    # looks (QueueMaxLooks) would stretch the twin's looks back to AWS's length, and moto keeps no history limit
    "QueueMaxLooks": "1000000",
    "RetryIntervalSeconds": "1",
    "TeardownRetryIntervalSeconds": "1",
    "TeardownRetryMaxDelaySeconds": "2",
    "AttemptWaitMaxSeconds": "1",
    # the twin's trainer reads its stop request each second, and its SageMaker starts the entry point at once
    "StopPollSeconds": "1",
    "StartAllowanceSeconds": "1",
    "TrainingHeartbeatSeconds": "300",
    # a run's whole wait for its training job: the heartbeat catches a silent job; this only bounds a job that
    # reports and never ends, and must outlast a busy machine's slowest run (the fault matrix runs 56 at once)
    "TrainingTimeoutSeconds": "3600",
    "LogLevel": "WARNING",
    # The buckets the twin's specs (tests/e2e, examples/, bench/) read data from and write results to, allowed as an
    # administrator allows a team's buckets: left empty, the stack allows only its own artifacts bucket's data/
    # and results/ (template.yaml, AllowedDataPrefixes / AllowedOutputPrefixes).
    "AllowedDataPrefixes": "s3://lustrain-example-data/,s3://my-team-datasets/,s3://lustrain-load-data/",
    "AllowedOutputPrefixes": "s3://lustrain-example-results/,s3://my-team-results/,s3://lustrain-load-results/",
}

Printer = Callable[[str], None]


@dataclass
class StateRun:
    name: str
    started_s: float
    seconds: float | None = None
    outcome: str = "running"


@dataclass
class Rehearsal:
    status: str
    error: str | None
    cause: str | None
    job_id: str | None
    execution_arn: str | None
    archive: str | None
    archive_objects: list[dict[str, Any]]
    resources_left: int
    leftovers: list[str]
    kept: list[str]
    transitions: int
    lambda_invocations: int
    wall_s: float
    states: list[StateRun] = field(default_factory=list)
    training_log_tail: list[str] = field(default_factory=list)
    #: every training attempt: job name, outcome, failure class, the step it reached and the one it resumed from
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: useful steps / steps computed (steps_lost: computed - useful)
    goodput: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The rehearsal's own credentials in the twin: the user's, allowed everything. Clients the rehearsal makes sign
#: with these explicitly, never with the process environment, which holds a function's role credentials while one
#: of its invocations runs (in-process Lambda).
OPERATOR_KEY = "twin"


_operator = threading.local()


def operator_session() -> boto3.Session:
    """The operator's session, one per thread (boto3's sessions are not shared between threads): a new botocore
    session registers its several hundred built-in event handlers, which the rehearsal's polls paid at each look."""
    session: boto3.Session | None = getattr(_operator, "session", None)
    if session is None:
        session = _operator.session = boto3.Session(
            aws_access_key_id=OPERATOR_KEY, aws_secret_access_key=OPERATOR_KEY, region_name=REGION
        )
    return session


def twin_own(parameters: dict[str, str]) -> frozenset[str]:
    """The parameters that hold the twin's own speed-ups (FAST_PARAMETERS' values, some beyond AWS's limits: the
    queue's looks): held to the template's constraints only when a user sets them otherwise."""
    return frozenset(name for name, value in FAST_PARAMETERS.items() if parameters.get(name) == value)


@contextlib.contextmanager
def twin(
    parameters: dict[str, str] | None = None,
    template: dict[str, Any] | None = None,
    before: Callable[[], dict[str, str]] | None = None,
) -> Iterator[Any]:
    """moto with the twin's patches, executing state machines for real, and the stack materialised (from
    `template`, a changed copy of template.yaml, when given). `before` runs in the twin before the stack is made
    and returns parameters to add: what a stack parameter names that must exist first (a secret's ARN)."""
    from moto import mock_aws

    from lustrain.twin import faults, patches, simulator
    from lustrain.twin.patches import lambda_invoke
    from lustrain.twin.stack import materialise

    saved = lambda_invoke.environment_copy()
    os.environ.update(
        AWS_ACCESS_KEY_ID=OPERATOR_KEY,
        AWS_SECRET_ACCESS_KEY=OPERATOR_KEY,  # moto's fake credentials
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
    )
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        os.environ.pop(var, None)
    patches.install()
    faults.clear()
    simulator.reset()
    from lustrain_core import clients

    clients.reset()
    try:
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            made_first = before() if before is not None else {}
            merged = {**FAST_PARAMETERS, **(parameters or {}), **made_first}
            stack = materialise(
                TEMPLATE,
                stack_name=STACK_NAME,
                region=REGION,
                parameters=merged,
                template=template,
                unchecked=twin_own(merged),
            )
            yield stack
            simulator.wait_all(timeout=60)
            _drain_events()
    finally:
        faults.clear()
        clients.reset()
        lambda_invoke.restore_environment(saved)


def _drain_events(timeout: float = 30) -> None:
    from lustrain.twin.patches import eventbridge

    eventbridge.drain(timeout)


def rehearse(
    spec_path: str | Path,
    *,
    inject: list[str] | None = None,
    quota: int | None = None,
    printer: Printer | None = None,
    timeout_s: float = 600,
    parameters: dict[str, str] | None = None,
    fsx_timing: dict[str, Any] | None = None,
    inspect: Callable[[Any, Rehearsal], None] | None = None,
    template: dict[str, Any] | None = None,
    training_plan: dict[str, Any] | None = None,
    tokenizer: str = "bytes",
) -> Rehearsal:
    """Rehearse one run; raises SpecInvalid before anything starts if the spec or its plan is invalid.

    `fsx_timing` is passed to the twin's `fsx.configure` (default: AVAILABLE at the first poll).
    `inspect(stack, result)` runs before the twin goes away, for benchmarks that read more of it.
    `template` replaces template.yaml's content (a test's changed copy, see stack.copy_template).
    `training_plan`: for a spec with compute.training_plan, the twin's plan of that name
    (lustrain.twin.training_plans.create_training_plan's keywords); by default one that carries the run, Active now.
    `tokenizer`: what the example data is prepared with where the spec's data prefix is empty (ensure_data): a
    `lustrain data prepare --tokenizer` value. On AWS the data is prepared before the run and carries its tokenizer
    (index.json, tokenizer.json), which the trainer reads; the spec names none, so the rehearsal takes it here.
    """
    from lustrain.twin import faults, simulator
    from lustrain.twin.patches import fsx, service_quotas

    say = printer or (lambda line: None)
    spec = load_spec_file(spec_path)
    the_plan, _ = compile_offline(spec)
    check_tokenizer(tokenizer)
    parsed = [faults.parse(f) for f in inject or []]
    started = time.monotonic()
    with twin(parameters, template) as stack:
        service_quotas.set_quota(
            spec.compute.instance_type,
            quota if quota is not None else max(DEFAULT_QUOTA, spec.compute.instance_count),
            REGION,
        )
        fsx.configure(**(fsx_timing or {"polls": 1}))
        if spec.compute.training_plan is not None:
            _buy_training_plan(spec, training_plan or {}, say)
        for fault in parsed:
            faults.inject(fault.step, fault.fault)
        say(f"twin: stack {stack.name} materialised from template.yaml ({len(stack.resources)} resources)")
        say(
            f"plan: {spec.compute.instance_count} x {spec.compute.instance_type}, "
            f"{the_plan.filesystem.deployment_type} {the_plan.filesystem.storage_gib} GiB, "
            f"/{the_plan.network.subnet_prefix_length} subnet, "
            + (f"up to ${the_plan.cost.total_usd:,.2f}" if the_plan.cost.total_usd is not None else "cost unknown")
        )
        ensure_data(spec, say, tokenizer)
        ensure_bucket(bucket_of(spec.output.s3_uri))
        doc = submittable(spec, Path(spec_path).parent, stack.outputs, say)
        log_tail: list[str] = []
        unsubscribe = simulator.subscribe(_training_printer(say, log_tail))
        try:
            execution_arn = _drop_spec(stack, doc, say)
            states, history, description = _watch(execution_arn, say, started, timeout_s)
            simulator.wait_all(timeout=120)
            _drain_events()
        finally:
            unsubscribe()
        output = json.loads(description.get("output") or "{}")
        job_id = job_id_of(history)
        archive, objects = archived_objects(stack, job_id)
        leftovers, kept = resources_left(job_id, spec)
        status = description["status"]
        result = Rehearsal(
            status=status,
            error=description.get("error") or output.get("error"),
            cause=description.get("cause") or output.get("cause"),
            job_id=job_id,
            execution_arn=execution_arn,
            archive=archive,
            archive_objects=objects,
            resources_left=len(leftovers),
            leftovers=leftovers,
            kept=kept,
            transitions=sum(1 for e in history if e["type"].endswith("StateEntered")),
            lambda_invocations=sum(
                1 for e in history if e["type"] in ("LambdaFunctionScheduled", "TaskScheduled")
            ),
            wall_s=round(time.monotonic() - started, 1),
            states=states,
            training_log_tail=log_tail[-5:],
        )
        tried = attempts_of(history)
        result.attempts = [a.model_dump(mode="json") for a in tried]
        result.goodput = attempts.goodput(tried)
        if inspect is not None:
            inspect(stack, result)
    return result


# ---------------------------------------------------------------------------------------------- the steps


def _buy_training_plan(spec: JobSpec, given: dict[str, Any], say: Printer) -> None:
    """The twin's training plan the spec names (AWS sells one from an offering; the twin makes it): by default the
    run's instances, in the first zone that offers the type, from now for the run's runtime and an hour more."""
    from lustrain.twin import training_plans
    from lustrain.twin.patches.offerings import OFFERED_ZONE_IDS

    compute = spec.compute
    offered = OFFERED_ZONE_IDS.get(REGION, {}).get(compute.instance_type.removeprefix("ml."))
    zones = boto3.client("ec2", region_name=REGION).describe_availability_zones()["AvailabilityZones"]
    zone = next((str(z["ZoneName"]) for z in zones if not offered or z["ZoneId"] in offered), f"{REGION}a")
    plan = {
        "instance_type": compute.instance_type,
        "instance_count": compute.instance_count,
        "availability_zone": zone,
        "hours": compute.max_runtime_hours + 1,
        **given,
    }
    if "starts_in_s" in plan:  # Scheduled now, Active that many seconds from now
        plan["start"] = time.time() + float(plan.pop("starts_in_s"))
    arn = training_plans.create_training_plan(str(compute.training_plan).rsplit("/", 1)[-1], **plan)
    say(
        f"twin: training plan {arn}: {plan['instance_count']} x {plan['instance_type']} in {plan['availability_zone']}"
    )


def bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


def _key_of(uri: str) -> str:
    rest = uri.removeprefix("s3://").split("/", 1)
    return rest[1] if len(rest) > 1 else ""


def ensure_bucket(name: str) -> None:
    s3 = operator_session().client("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=name)


def ensure_data(spec: JobSpec, say: Printer, tokenizer: str = "bytes") -> None:
    """An empty data prefix is filled with token shards of Python's standard library made with `tokenizer` (a
    `lustrain data prepare --tokenizer` value; cached between runs)."""
    bucket, prefix = bucket_of(spec.data.s3_uri), _key_of(spec.data.s3_uri)
    ensure_bucket(bucket)
    s3 = operator_session().client("s3")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return
    shards = example_shards(tokenizer=tokenizer)
    # the shards, the index, the plan and its parts
    files = sorted(p for p in shards.rglob("*") if p.is_file())
    for path in files:
        s3.upload_file(str(path), bucket, prefix + path.relative_to(shards).as_posix())
    size = sum(p.stat().st_size for p in files)
    say(
        f"data: {spec.data.s3_uri} was empty: uploaded the stdlib corpus as token shards of tokenizer {tokenizer} "
        f"({size / 2**20:.1f} MiB)"
    )


#: where example_shards keeps what it made
CACHE = REPO_ROOT / ".lustrain" / "cache"


def check_tokenizer(tokenizer: str) -> None:
    """Refuse, before anything starts, a --tokenizer the rehearsal cannot prepare its example data with: what
    `lustrain data prepare` refuses, and an s3:// tokenizer.json (the twin's S3 starts empty: nothing could be
    there)."""
    from lustrain_core.errors import SpecInvalid
    from lustrain_trainer import prepare

    allowed = "bytes | bpe:VOCAB | PATH of a tokenizer.json on this machine"
    try:
        kind, where = prepare.parse_tokenizer(tokenizer)
    except prepare.PrepareError as exc:
        raise SpecInvalid.one(
            "--tokenizer", tokenizer, str(exc).removeprefix(f"--tokenizer {tokenizer}: ")
        ) from None
    if kind == "file" and str(where).startswith("s3://"):
        raise SpecInvalid.one(
            "--tokenizer",
            tokenizer,
            f"the twin's S3 starts empty, so it holds no tokenizer.json: download it and give its path "
            f"(allowed: {allowed})",
        )
    if kind == "file" and not Path(str(where)).is_file():
        raise SpecInvalid.one("--tokenizer", tokenizer, f"no such file (allowed: {allowed})")


def _tokenizer_key(tokenizer: str) -> str:
    """The tokenizer's part of the cache's name: its value, or for a tokenizer.json the first 16 hex digits of
    its content's sha256 (a file's path says nothing of what it holds, and may change)."""
    from lustrain_trainer import prepare

    kind, where = prepare.parse_tokenizer(tokenizer)
    if kind == "file":
        return "file-" + hashlib.sha256(Path(str(where)).read_bytes()).hexdigest()[:16]
    return tokenizer.replace(":", "")


def example_shards(max_bytes: str = "3MiB", tokenizer: str = "bytes", cache_root: Path | None = None) -> Path:
    """Token shards of the standard library's source made with `tokenizer`, made once per Python version, size and
    tokenizer and kept under .lustrain/cache/ (or `cache_root`); the shard layout is in the name too."""
    from lustrain_trainer import prepare

    root = cache_root or CACHE
    cache = (
        root / f"stdlib-py{sys.version_info.major}{sys.version_info.minor}-{max_bytes}-{prepare.LAYOUT}"
        f"-{_tokenizer_key(tokenizer)}"
    )
    if not (cache / "index.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            out = Path(tmp) / "shards"
            code = prepare.main(
                ["stdlib", str(out), "--glob", "**/*.py", "--max-bytes", max_bytes, "--tokenizer", tokenizer]
            )
            if code != 0:
                raise RuntimeError(
                    f"preparing the example data with tokenizer {tokenizer} failed (exit {code})"
                )
            try:
                out.rename(cache)
            except OSError:
                # another process (a parallel test worker) made the same shards first: theirs are as good
                if not (cache / "index.json").exists():
                    raise
    return cache


def submittable(spec: JobSpec, base: Path, outputs: dict[str, str], say: Printer) -> dict[str, Any]:
    """What the CLI uploads: a local code.source goes to the artifacts bucket first, as `lustrain submit` does,
    read from the spec file's directory (`base`). A copy of one of the repository's own specs (tests write them to
    temporary directories) that names `trainer/` where it has none gets the repository's."""
    doc = spec.model_dump(mode="json", exclude_none=False)
    source = spec.code.source
    if not source.startswith("s3://"):
        local = local_code_dir(base / "spec.yaml", source)
        if not local.is_dir():
            local = REPO_ROOT / source
        bucket = outputs.get("ArtifactsBucketName") or next(v for k, v in outputs.items() if "Artifact" in k)
        doc["code"]["source"] = upload_code_dir(local, bucket, spec.name, operator_session())
        say(f"code: {source} uploaded to {doc['code']['source']}")
    return doc


def _drop_spec(stack: Any, doc: dict[str, Any], say: Printer) -> str:
    """Drop the spec into the jobs bucket and wait for the execution EventBridge starts."""
    jobs_bucket = stack.outputs.get("JobsBucketName") or next(
        v for k, v in stack.outputs.items() if "Jobs" in k
    )
    machine = stack.outputs.get("StateMachineArn") or next(
        r.ref for r in stack.resources.values() if r.type == "AWS::StepFunctions::StateMachine"
    )
    key = f"jobs/{doc['name']}.yaml"
    operator_session().client("s3").put_object(Bucket=jobs_bucket, Key=key, Body=yaml.safe_dump(doc).encode())
    say(f"drop: s3://{jobs_bucket}/{key} -> EventBridge 'Object Created' -> StartExecution")
    sfn = operator_session().client("stepfunctions")

    def started() -> str | None:
        runs = sfn.list_executions(stateMachineArn=machine)["executions"]
        return str(runs[0]["executionArn"]) if runs else None

    return str(
        until(started, "execution started by the drop (is the jobs rule wired to the state machine?)", 30)
    )


def until(probe: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    """Poll `probe` until it answers something but None; AssertionError naming `what` once `timeout` s have
    passed with no answer and no work of the twin's (activity.py: an AWS call by any thread but this one). The
    wait lasts while the twin works, so a busy machine slows it without failing it."""
    from lustrain.twin import activity

    started = time.monotonic()
    while (found := probe()) is None:
        quiet = time.monotonic() - max(started, activity.last_by_others())
        assert quiet < timeout, f"no {what}, and the twin did nothing for {timeout} s"
        time.sleep(0.2)
    return found


def drop(stack: Any, spec_path: Path, key: str | None = None) -> tuple[JobSpec, str]:
    """Drop a spec file into a running twin's jobs bucket (under `key`, default jobs/<name>.yaml), its data and code
    uploaded first as `lustrain rehearse` does; the spec and the execution the drop starts."""
    spec = load_spec_file(spec_path)
    ensure_data(spec, print)
    ensure_bucket(bucket_of(spec.output.s3_uri))
    doc = submittable(spec, spec_path.parent, stack.outputs, print)
    session = operator_session()
    sfn = session.client("stepfunctions")
    machine = stack.outputs["StateMachineArn"]
    before = {e["executionArn"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]}
    session.client("s3").put_object(
        Bucket=stack.outputs["JobsBucketName"],
        Key=key or f"jobs/{spec.name}.yaml",
        Body=yaml.safe_dump(doc).encode(),
    )

    def started() -> str | None:
        executions = sfn.list_executions(stateMachineArn=machine)["executions"]
        return next((e["executionArn"] for e in executions if e["executionArn"] not in before), None)

    return spec, until(started, f"an execution for {spec.name}")


def _watch(
    execution_arn: str, say: Printer, started: float, timeout_s: float
) -> tuple[list[StateRun], list[dict[str, Any]], dict[str, Any]]:
    sfn = operator_session().client("stepfunctions")
    seen = 0  # the id of the last event shown
    states: list[StateRun] = []
    open_states: dict[str, StateRun] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        fresh = events_after(sfn, execution_arn, seen) if latest_event_id(sfn, execution_arn) > seen else []
        for event in fresh:
            seen = event["id"]
            now = time.monotonic() - started
            kind = event["type"]
            details: dict[str, Any] = next((v for k, v in event.items() if k.endswith("EventDetails")), {})
            if kind.endswith("StateEntered"):
                run = StateRun(details.get("name", "?"), round(now, 1))
                states.append(run)
                open_states[run.name] = run
                say(f"{now:6.1f}s  > {run.name}")
            elif kind.endswith("StateExited"):
                run = open_states.pop(details.get("name", "?"), StateRun("?", now))
                run.seconds, run.outcome = round(now - run.started_s, 1), "ok"
            elif kind in ("TaskFailed", "LambdaFunctionFailed", "ExecutionFailed", "TaskTimedOut"):
                say(f"{now:6.1f}s  ! {details.get('error', kind)}: {_short(details.get('cause'))}")
        description = sfn.describe_execution(executionArn=execution_arn)
        if description["status"] != "RUNNING":
            return states, execution_history(sfn, execution_arn), description
        if time.monotonic() > deadline:
            sfn.stop_execution(
                executionArn=execution_arn, error="RehearsalTimeout", cause=f"over {timeout_s} s"
            )
        time.sleep(0.2)


def execution_history(sfn: Any, execution_arn: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn):
        events += page["events"]
    return events


def events_after(sfn: Any, execution_arn: str, after_id: int, page_size: int = 10) -> list[dict[str, Any]]:
    """The execution's events after event `after_id`, oldest first: read newest first, only as far back as needed
    (a watcher that read the whole history on every look read a growing history again and again)."""
    fresh: list[dict[str, Any]] = []
    pages = sfn.get_paginator("get_execution_history").paginate(
        executionArn=execution_arn, reverseOrder=True, PaginationConfig={"PageSize": page_size}
    )
    for page in pages:
        for event in page["events"]:
            if event["id"] <= after_id:
                return fresh[::-1]
            fresh.append(event)
    return fresh[::-1]


def latest_event_id(sfn: Any, execution_arn: str) -> int:
    """The id of the execution's newest event (0 before its first): what changes while it makes progress."""
    events = sfn.get_execution_history(executionArn=execution_arn, reverseOrder=True, maxResults=1)["events"]
    return int(events[0]["id"]) if events else 0


def _short(raw: Any, limit: int = 160) -> str:
    text = str(raw or "")
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        text = str(json.loads(text).get("errorMessage", text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _training_printer(say: Printer, tail: list[str]) -> Callable[..., None]:
    def on_line(*args: Any) -> None:
        line = str(args[-1]).rstrip()
        tail.append(line)
        if "step=" in line or "error" in line.lower():
            say(f"          | {line}")

    return on_line


def state_outputs(history: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The output of each state that exited, in order, where it is a JSON object."""
    for event in history:
        details = event.get("stateExitedEventDetails") or {}
        with contextlib.suppress(ValueError, TypeError):
            output = json.loads(details.get("output") or "null")
            if isinstance(output, dict):
                yield output


def attempts_of(history: list[dict[str, Any]]) -> list[Attempt]:
    """Every training attempt of a run, from its history: those next_attempt judged ($.recovery), and the one that
    trained the model ($.training), in order."""
    judged: list[Attempt] = []
    final: Attempt | None = None
    for output in state_outputs(history):
        recovery = output.get("recovery")
        if isinstance(recovery, dict) and isinstance(recovery.get("attempts"), list):
            judged = Recovery.model_validate(recovery).attempts
        training = output.get("training")
        if isinstance(training, dict):
            final = attempts.final_attempt(training) or final
    return [*judged, final] if final is not None else judged


def registered_job(history: list[dict[str, Any]]) -> dict[str, Any]:
    """$.job as register_job left it, from the first state output that carries it; {} if none does."""
    for output in state_outputs(history):
        job = output.get("job")
        if isinstance(job, dict) and job.get("job_id"):
            return job
    return {}


def job_id_of(history: list[dict[str, Any]]) -> str | None:
    job_id = registered_job(history).get("job_id")
    return None if job_id is None else str(job_id)


def archived_objects(stack: Any, job_id: str | None) -> tuple[str | None, list[dict[str, Any]]]:
    if not job_id:
        return None, []
    bucket = stack.outputs.get("ArtifactsBucketName") or next(
        v for k, v in stack.outputs.items() if "Artifact" in k
    )
    prefix = f"{stack.parameters.get('ArchivePrefix', 'archive/')}{job_id}/"
    s3 = operator_session().client("s3")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    if not listed:
        return None, []
    objects = [{"key": o["Key"][len(prefix) :], "size": o["Size"]} for o in listed]
    return f"s3://{bucket}/{prefix}", objects


def resources_left(job_id: str | None, spec: JobSpec) -> tuple[list[str], list[str]]:
    """Everything tagged with the job id that a teardown deletes and that still exists (and is not kept on purpose),
    across services: found as the sweeper and `lustrain leftovers` find them (lustrain_core.leftovers)."""
    if not job_id:
        return [], []
    session = operator_session()
    left: list[str] = []
    kept: list[str] = []
    for found in leftovers.stack_resources(
        ec2=session.client("ec2"),
        fsx=session.client("fsx"),
        sagemaker=session.client("sagemaker"),
        stack_name=STACK_NAME,
        kinds=[kind for kind in registry.KINDS if kind is not registry.WARM_POOL],
    ):
        if found.job_id == job_id:
            keep = found.kind is registry.FILE_SYSTEM and spec.filesystem.keep
            (kept if keep else left).append(found.id)
    return left, kept


def scaled_to_this_machine(spec_path: str | Path, into: Path) -> Path:
    """A copy of a spec that keeps what decides how its run is built on AWS (the file system's type and links, the
    network, output on Lustre, the tags) and makes small what one machine cannot hold (50 instances, a 6.4B
    model, a week, the team's own code bucket): at most 2 instances for an hour, trainer/ with a tiny preset,
    at most 1 GiB of data. For rehearsing the README's examples (tests/e2e/test_examples.py, make iam-report)."""
    import yaml

    spec: dict[str, Any] = yaml.safe_load(Path(spec_path).read_text())
    compute = spec.setdefault("compute", {})
    compute.update(instance_count=min(int(compute.get("instance_count", 2)), 2), max_runtime_hours=1)
    spec["code"] = {
        "source": "trainer/",
        "hyperparameters": {"preset": "tiny", "max_steps": 6, "log_interval": 2},
    }
    spec["data"]["size_gib"] = min(float(spec["data"].get("size_gib", 1)), 1.0)
    spec["output"]["expected_size_gib"] = 0.1
    spec.pop("budget", None)
    path = into / Path(spec_path).name
    path.write_text(yaml.safe_dump(spec))
    return path
