"""Data preparation's processing jobs: start each stage once, in order, and read how it ended.

A stage's job (lustrain_core.prepare_plan, its request aws_requests.prepare_job) is started idempotently, as the
training job is: a retried start that finds the job already there carries on with it. Its end comes as
EventBridge's "SageMaker Processing Job State Change" (source aws.sagemaker), whose detail is DescribeProcessingJob's
answer: ProcessingJobName, ProcessingJobStatus (InProgress | Completed | Failed | Stopping | Stopped),
FailureReason, ExitMessage. `outcome` reads either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from lustrain_core import aws_requests
from lustrain_core import resources as registry
from lustrain_core.aws_errors import error_code, training_job_missing
from lustrain_core.config import Settings
from lustrain_core.document import Code, Network, Sections
from lustrain_core.errors import MISSING, PrepareFailed, SpecInvalid
from lustrain_core.images import prepare_image
from lustrain_core.launch_plan import TAG_CREATED_BY, TAG_JOB_ID
from lustrain_core.prepare_plan import STAGES, PrepareRun, next_stage
from lustrain_core.spec import PrepareSpec, is_prepare, validate_prepare_spec
from lustrain_core.steps import prepare_role, records
from lustrain_core.steps.records import JobRecord
from lustrain_core.teams import DEFAULT_TEAM, TAG_TEAM

#: the resource type a stage's job is recorded under in the run's ledger (teardown stops what is still running)
RESOURCE_TYPE = registry.PROCESSING_JOB.name
EVENT_DETAIL_TYPE = "SageMaker Processing Job State Change"
#: the CloudWatch Logs group SageMaker writes every processing job's container output to
LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
RUNNING = frozenset({"InProgress", "Stopping"})
#: The state machine's wait between two looks at a running stage; SageMaker bills a processing job by the second,
#: and a stage takes minutes to start (prepare_plan.STAGE_OVERHEAD_SECONDS): a minute's wait loses little
LOOK_EVERY_SECONDS = 60
#: After this many looks at one stage (a quarter of an hour at a minute each) the waits are longer: a stage may run
#: for a day (prepare_plan.MAX_RUNTIME_SECONDS), and every look costs the execution history 9 events of its 25,000
QUICK_LOOKS = 15
LATER_FACTOR = 10
#: The stack setting that shortens the first waits (the twin sets it to a second; the later ones are 10 times it)
LOOK_SETTING = "LUSTRAIN_PREPARE_LOOK_SECONDS"
#: The state machine's bound on the looks at one run (its Choice "Is the data preparation done?" says the same):
#: enough for every stage to run its MaxRuntimeInSeconds at these waits (tests/unit/test_history_budget.py)
MAX_LOOKS = 600


def describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeProcessingJob, or None for a job that does not exist (aws_errors.training_job_missing: the model's
    ResourceNotFound, or the ValidationException AWS answers, whatever its words)."""
    try:
        return dict(sagemaker.describe_processing_job(ProcessingJobName=name))
    except ClientError as error:
        if training_job_missing(error):
            return None
        raise


def start(sagemaker: Any, request: dict[str, Any]) -> str:
    """Create the stage's job unless it exists (a retry); returns its status."""
    name = request["ProcessingJobName"]
    found = describe(sagemaker, name)
    if found is not None:
        return str(found["ProcessingJobStatus"])
    try:
        sagemaker.create_processing_job(**request)
    except ClientError:
        # a create that went through before a lost answer: the job is there, and ours
        if describe(sagemaker, name) is None:
            raise
    return "InProgress"


def role_not_assumable(exc: ClientError) -> bool:
    """SageMaker's refusal of a role it cannot assume (ValidationException "Could not assume role <arn>. Please
    ensure that the role exists and allows principal 'sagemaker.amazonaws.com' to assume the role")."""
    return error_code(exc) == "ValidationException" and "could not assume role" in str(exc).lower()


def outcome(detail: dict[str, Any]) -> str:
    """The status of an event's detail or a description: InProgress/Stopping (go on waiting) or Completed; raises
    PrepareFailed, naming the job and SageMaker's reason, for Failed and Stopped."""
    status = str(detail.get("ProcessingJobStatus", ""))
    if status == "Completed" or status in RUNNING:
        return status
    name = detail.get("ProcessingJobName", "?")
    reason = detail.get("FailureReason") or detail.get("ExitMessage") or "SageMaker gave no reason"
    raise PrepareFailed(f"the data preparation job {name} {status or 'ended'}: {reason}")


def advance(
    run: PrepareRun,
    done: list[str],
    *,
    sagemaker: Any,
    ddb: Any,
    settings: Settings,
    request_of: Callable[[str, str], dict[str, Any]],
    role_of: Callable[[], str | None],
    role_is_new: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """One look at a preparation run: its next stage's job is started (recorded in the run's ledger before it is
    created, so that teardown stops it whatever happens next), or the running one is read; a stage that Completed
    is added to `done` and the next one started at once. `role_of` gives the role a job is started with, or None
    while it is not ready (just made: status Pending, look again). `request_of(stage, role)` is the stage's
    CreateProcessingJob request. SageMaker's "Could not assume role" for a role made minutes ago (`role_is_new`: IAM
    has not spread it yet) is a Pending look too; for an older one it is the error it says. Returns {"done",
    "stage", "status"}: stage None and status Completed once every stage has; PrepareFailed for a stage that Failed
    or was Stopped."""
    done = list(done)
    while (stage := next_stage(run, done)) is not None:
        name = run.job_name(stage)
        found = describe(sagemaker, name)
        if found is None:
            role = role_of()
            if role is None:
                return {"done": done, "stage": stage, "status": "Pending"}
            request = request_of(stage, role)
            records.add_resources(ddb, settings.jobs_table, run.job_id, [{"type": RESOURCE_TYPE, "id": name}])
            try:
                status = start(sagemaker, request)
            except ClientError as exc:
                if role_not_assumable(exc) and role_is_new():
                    return {"done": done, "stage": stage, "status": "Pending"}
                raise
        else:
            status = outcome(found)
        if status != "Completed":
            return {"done": done, "stage": stage, "status": status}
        done.append(stage)
    return {"done": done, "stage": None, "status": "Completed"}


def run_of(job_id: str, spec: PrepareSpec) -> PrepareRun:
    """The preparation run a kind: prepare spec describes."""
    return PrepareRun(
        job_id=job_id,
        source=spec.source,
        output=spec.output,
        tokenizer=spec.tokenizer,
        instances=spec.instances,
        instance_type=spec.instance_type,
    )


def of_record(record: JobRecord) -> PrepareRun | None:
    """The preparation run a job record holds (kind: prepare), or None for a training run's: what `lustrain status`
    and `lustrain logs` read of it (its stages' processing jobs, their logs)."""
    if not record.preparation:
        return None
    return run_of(record.job_id, validate_prepare_spec(record.spec))


def log_streams(run: PrepareRun) -> list[tuple[str, str]]:
    """Where its stages' processing jobs write their logs: (log group, stream name prefix) of each stage, in order
    (SageMaker names a processing instance's stream <job name>/algo-<n>-<epoch seconds>)."""
    return [(LOG_GROUP, f"{run.job_name(stage)}/") for stage in run.stages]


def is_prepare_run(document: Any) -> bool:
    """Whether a state document carries a data preparation run (register_job's $.job of a kind: prepare spec):
    create_network and upload_code build its network and its code their own way."""
    job = document.get("job") if isinstance(document, dict) else None
    return isinstance(job, dict) and is_prepare(job.get("spec"))


def job_of(document: Any) -> tuple[str, PrepareSpec]:
    """The run a state document carries: its job id and its checked spec; SpecInvalid names the field that is
    missing or wrong (a training run's document included)."""
    if not isinstance(document, dict):
        raise SpecInvalid.one("", document, "the state document must be a JSON object")
    job = document.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("job_id"), str) or not job["job_id"]:
        raise SpecInvalid.one("job", MISSING, "the state document has no registered job ($.job.job_id)")
    if not is_prepare(job.get("spec")):
        raise SpecInvalid.one("job.spec.kind", MISSING, "a data preparation run's spec (kind: prepare)")
    return job["job_id"], validate_prepare_spec(job["spec"])


def run_tags(job_id: str, spec: PrepareSpec, stack_name: str, team: str = DEFAULT_TEAM) -> list[dict[str, str]]:
    """The tags of everything a preparation run creates (its network, its processing jobs, its role): the spec's,
    then the run's id and the stack that made it (teardown and the sweeper find them by these), and its team."""
    return [
        *({"Key": k, "Value": v} for k, v in sorted(spec.tags.items())),
        {"Key": TAG_JOB_ID, "Value": job_id},
        {"Key": TAG_CREATED_BY, "Value": stack_name},
        {"Key": TAG_TEAM, "Value": team},
    ]


def team_in(document: Any) -> str:
    """The team of the run a state document carries ($.job.team, as register_job recorded it)."""
    job = document.get("job") if isinstance(document, dict) else None
    team = job.get("team") if isinstance(job, dict) else None
    return team if isinstance(team, str) and team else DEFAULT_TEAM


def wait_after(stage_looks: int, every: int = LOOK_EVERY_SECONDS) -> int:
    """The state machine's wait after the given number of looks at the running stage: `every` seconds during its
    first QUICK_LOOKS looks, 10 times that after."""
    return every if stage_looks < QUICK_LOOKS else every * LATER_FACTOR


def look(document: Any, *, sagemaker: Any, iam: Any, ddb: Any, settings: Settings) -> dict[str, Any]:
    """$.prepare, one look of the state machine's loop at a data preparation run: the state document's job (a
    kind: prepare run register_job recorded), $.network (its subnet and group), $.code (upload_code's bundle of the
    trainer package) and the previous look ($.prepare: the stages already done, the looks so far). Returns
    advance's answer, looks (in all: the state machine stops at MAX_LOOKS), stage_looks (at the running
    stage) and wait_seconds, the state machine's wait before the next look; PrepareFailed for a failed stage."""
    job_id, spec = job_of(document)
    sections = Sections.of(document, "network", "code")
    network, code = sections.network, sections.code
    assert isinstance(network, Network) and isinstance(code, Code)
    if not network.subnet_id or not network.security_group_ids:
        raise SpecInvalid.one("network.subnet_id", network.subnet_id, "the run's subnet and security group")
    previous = document.get("prepare")
    previous = previous if isinstance(previous, dict) else {}
    done = previous.get("done", [])
    if not isinstance(done, list) or not all(isinstance(d, str) and d in STAGES for d in done):
        raise SpecInvalid.one("prepare.done", done, f"the stages already done, of {', '.join(STAGES)}")
    counts = {key: previous.get(key, 0) for key in ("looks", "stage_looks")}
    for key, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SpecInvalid.one(f"prepare.{key}", count, "a count of looks, a whole number of at least 0")
    every = settings.whole_seconds(LOOK_SETTING, least=1) or LOOK_EVERY_SECONDS
    prepare_role.boundary_arn(settings)  # a stack without it is refused before anything is made
    run = run_of(job_id, spec)
    tags = run_tags(job_id, spec, settings.stack_name, team_in(document))
    image = prepare_image(settings.region)

    def role_of() -> str | None:
        return prepare_role.ensure(
            iam, ddb, run, code_s3_uri=code.submit_directory, image_uri=image, tags=tags, settings=settings
        )

    def request_of(stage: str, role: str) -> dict[str, Any]:
        return aws_requests.prepare_job(
            run,
            stage,
            role_arn=role,
            image_uri=image,
            code_s3_uri=code.submit_directory,
            subnet_id=network.subnet_id,
            security_group_ids=list(network.security_group_ids),
            tags=tags,
            settings=settings,
        )

    found = advance(
        run,
        list(done),
        sagemaker=sagemaker,
        ddb=ddb,
        settings=settings,
        request_of=request_of,
        role_of=role_of,
        role_is_new=lambda: prepare_role.is_new(iam, run.job_id),
    )
    stage_looks = counts["stage_looks"] + 1 if found["stage"] == previous.get("stage") else 1
    return {
        **found,
        "looks": counts["looks"] + 1,
        "stage_looks": stage_looks,
        "wait_seconds": 0 if found["stage"] is None else wait_after(stage_looks, every),
    }
