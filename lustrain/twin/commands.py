"""The twin's CLI commands: `rehearse`, `local up`, `local invoke`."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lustrain_core.errors import SpecInvalid, UsageInvalid

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
#: the twin account's quota of each instance type while `local up` serves it (and for `local invoke`'s fresh twin)
DEFAULT_LOCAL_QUOTA = 8
SAMPLES = Path(__file__).resolve().parents[2] / "events"


def local_parameters() -> dict[str, str]:
    """The template parameters of a served twin (and of `local invoke`'s fresh one): the rehearsal's, and the
    events/ samples' code bucket allowed as an administrator allows a team's buckets (code.source is read from
    the data prefixes the stack allows), so that the samples' spec is accepted as it stands."""
    from lustrain.twin.rehearse import FAST_PARAMETERS

    return {
        **FAST_PARAMETERS,
        "AllowedDataPrefixes": FAST_PARAMETERS["AllowedDataPrefixes"] + ",s3://my-team-code/",
    }


def register(sub: Any) -> None:
    """Add the twin's commands to the `lustrain` parser."""
    r = sub.add_parser("rehearse", help="run a whole job on the local twin (no AWS account needed)")
    r.add_argument("spec", type=Path)
    r.add_argument("--json", action="store_true", help="print one JSON object instead of the live display")
    r.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="STEP:FAULT",
        help="rehearse a failure, e.g. start_training:hardware-failure, start_training:capacity-error-once, "
        "start_training:user-error, create_filesystem:fsx-failed, check_quota:quota, STEP:throttling",
    )
    r.add_argument("--quota", type=int, help="the twin account's instance quota for the spec's type")
    r.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")
    r.add_argument(
        "--tokenizer",
        default="bytes",
        help="what the example data is prepared with when the spec's data prefix is empty, as `lustrain data "
        "prepare --tokenizer`: bytes (default) | bpe:VOCAB (trained on the corpus) | PATH of a tokenizer.json",
    )
    r.set_defaults(command=cmd_rehearse)

    local = sub.add_parser("local", help="the twin as a server, and Docker-free `sam local invoke`")
    lsub = local.add_subparsers(required=True, metavar="ACTION")
    up = lsub.add_parser("up", help="serve the twin on 127.0.0.1 so that aws CLI and boto3 work against it")
    up.add_argument("--port", type=int, default=5000)
    up.add_argument("--for-seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    up.add_argument(
        "--quota",
        type=int,
        default=DEFAULT_LOCAL_QUOTA,
        help=f"the twin account's quota of each instance type ({DEFAULT_LOCAL_QUOTA})",
    )
    up.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a template parameter of the twin's stack, as `sam deploy --parameter-overrides` takes it (repeatable)",
    )
    up.add_argument(
        "--webhook",
        metavar="URL",
        help="post the runs' chat notices to this receiver on 127.0.0.1 (http://127.0.0.1:PORT/...): the twin makes "
        "the secret NoticeWebhookSecretArn names",
    )
    up.add_argument(
        "--mlflow",
        metavar="URI",
        help="log each run to the MLflow tracking server at http://127.0.0.1:PORT (MlflowTrackingUri; no path)",
    )
    up.set_defaults(command=cmd_local_up)
    inv = lsub.add_parser("invoke", help="invoke one function of the stack with an event file")
    inv.add_argument(
        "function",
        metavar="FUNCTION",
        help="the function's logical id in template.yaml, as `sam local invoke` takes it (RegisterJobFunction), "
        "or its handler's name (register_job)",
    )
    inv.add_argument(
        "-e", "--event", type=Path, required=True, help="an event file, e.g. events/register_job.json"
    )
    inv.set_defaults(command=cmd_local_invoke)


def cmd_rehearse(args: argparse.Namespace) -> int:
    from lustrain.twin import faults
    from lustrain.twin.rehearse import rehearse

    try:
        for value in args.inject:
            faults.parse(value)
    except faults.FaultSpecInvalid as exc:
        raise SpecInvalid.one("--inject", args.inject, str(exc)) from None
    printer = None if args.json else _live_printer()
    result = rehearse(
        args.spec,
        inject=args.inject,
        quota=args.quota,
        printer=printer,
        timeout_s=args.timeout,
        tokenizer=args.tokenizer,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_outcome(result)
    return EXIT_OK if result.status == "SUCCEEDED" and result.resources_left == 0 else EXIT_FAILED


def _live_printer() -> Any:
    def say(line: str) -> None:
        print(line, flush=True)

    return say


def _print_outcome(r: Any) -> None:
    print()
    print(
        f"outcome: {r.status} in {r.wall_s:.1f} s ({r.transitions} state transitions, "
        f"{r.lambda_invocations} Lambda invocations)"
    )
    if r.error:
        print(f"error:   {r.error}: {r.cause}")
    if len(r.attempts) > 1 or any(a["outcome"] != "Completed" for a in r.attempts):
        for a in r.attempts:
            how = a["outcome"] + (f" ({a['failure_class']})" if a.get("failure_class") else "")
            steps = (
                f", steps {a['resumed_from'] or 0}-{a['step_reached']}"
                if a.get("step_reached") is not None
                else ""
            )
            print(f"attempt {a['attempt']}: {a.get('training_job_name') or '(no job)'} {how}{steps}")
        if r.goodput is not None:
            print(f"goodput: {r.goodput:.0%} of the steps computed were kept")
    if r.archive:
        print(f"archive: {r.archive}")
        for obj in r.archive_objects:
            print(f"         {obj['key']:<28} {obj['size']:>10,} bytes")
    for kept in r.kept:
        print(f"kept:    {kept} (filesystem.keep: true)")
    if r.leftovers:
        print(f"left behind: {', '.join(r.leftovers)}")
    print(f"{r.resources_left} resources left")


#: Set to stop a `local up` serving in this process: SIGTERM sets it, and so can a program that runs the command in
#: a thread of its own (bench/load.py), without sending signals to its own process.
STOP = threading.Event()


def stop_local_up() -> None:
    STOP.set()


#: the secret `local up --webhook` makes in the twin, holding the receiver's URL (NoticeWebhookSecretArn names it)
WEBHOOK_SECRET = "lustrain-twin/notice-webhook"  # noqa: S105 - a secret's name, not its value


def local_up_parameters(args: argparse.Namespace) -> dict[str, str]:
    """The template parameters `local up` was given: each --param NAME=VALUE, and MlflowTrackingUri from --mlflow;
    refused (UsageInvalid, exit 2) where malformed, named twice, or pointing the twin off this machine. --webhook's
    secret is made once the twin serves (`webhook_secret`). The template's own constraints are checked when the
    stack is made, as CloudFormation checks them."""
    given: dict[str, str] = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageInvalid.one("--param", item, "is NAME=VALUE, a parameter of template.yaml and its value")
        if name.strip() in given:
            raise UsageInvalid.one("--param", item, f"names {name.strip()} a second time")
        given[name.strip()] = value
    for option, parameter, value in (("--mlflow", "MlflowTrackingUri", args.mlflow),
                                     ("--webhook", "NoticeWebhookSecretArn", args.webhook)):  # fmt: skip
        if value is None:
            continue
        if parameter in given:
            raise UsageInvalid.one(option, value, f"and --param {parameter} both set {parameter}: give one")
        if not _on_this_machine(value):
            raise UsageInvalid.one(
                option, value, "the twin reaches nothing off this machine: an http://127.0.0.1:PORT/... URL"
            )
        if option == "--mlflow" and urlsplit(value).path.strip("/"):
            raise UsageInvalid.one(option, value, "is the tracking server's root, http://127.0.0.1:PORT, with no path")
    if args.mlflow is not None:
        given["MlflowTrackingUri"] = args.mlflow.rstrip("/")
    from lustrain.twin.cfn import load_template
    from lustrain.twin.rehearse import TEMPLATE, twin_own
    from lustrain.twin.stack import TemplateError, template_parameters

    merged = {**local_parameters(), **given}
    try:  # as CloudFormation checks them, before the twin starts
        template_parameters(load_template(TEMPLATE), merged, twin_own(merged))
    except TemplateError as exc:
        failing = next((item for item in args.param if f"'{item.partition('=')[0].strip()}'" in str(exc)), None)
        if failing is None and args.mlflow is not None:
            raise UsageInvalid.one("--mlflow", args.mlflow, str(exc)) from None
        raise UsageInvalid.one("--param", failing or ", ".join(args.param), str(exc)) from None
    return given


def _on_this_machine(url: str) -> bool:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # a port out of range
        return False
    return parts.scheme == "http" and parts.hostname == "127.0.0.1" and port is not None


def webhook_secret(url: str, endpoint: str) -> str:
    """Make the secret a stack's NoticeWebhookSecretArn names, holding the receiver's URL, in the served twin; its
    ARN."""
    import boto3

    secrets = boto3.client("secretsmanager", endpoint_url=endpoint)
    return str(secrets.create_secret(Name=WEBHOOK_SECRET, SecretString=json.dumps({"url": url}))["ARN"])


def cmd_local_up(args: argparse.Namespace) -> int:
    import requests
    from moto.core.config import default_user_config
    from moto.server import ThreadedMotoServer

    from lustrain.twin import patches, served
    from lustrain.twin.patches import eventbridge, lambda_invoke
    from lustrain.twin.rehearse import REGION, STACK_NAME, TEMPLATE, twin_own
    from lustrain.twin.stack import materialise

    given = local_up_parameters(args)  # refused before anything starts
    STOP.clear()
    url = f"http://127.0.0.1:{args.port}"
    # put back when the twin stops: a program that serves it in one of its threads (bench/load.py) carries on
    saved_env = lambda_invoke.environment_copy()
    saved_moto_config = copy.deepcopy(default_user_config)
    os.environ.update(
        AWS_ACCESS_KEY_ID="twin",
        AWS_SECRET_ACCESS_KEY="twin",  # noqa: S106 - moto's fake credentials
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_ENDPOINT_URL=url,
        MOTO_PORT=str(args.port),
    )
    patches.install()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
    server.start()
    try:
        requests.post(
            f"{url}/moto-api/config", json={"stepfunctions": {"execute_state_machine": True}}, timeout=10
        )
        parameters = {**local_parameters(), **given}
        if args.webhook is not None:
            parameters["NoticeWebhookSecretArn"] = webhook_secret(args.webhook, url)
        stack = materialise(
            TEMPLATE, stack_name=STACK_NAME, region=REGION, parameters=parameters, unchecked=twin_own(parameters)
        )
        # the stack's schedules (the sweeper's SweepSchedule) fire at their rate while the twin serves
        eventbridge.run_schedules(STOP)
        prepare_for_runs(args.quota, print)
        print(f"lustrain twin serving on {url} (region {REGION}, account 123456789012)")
        for name, value in sorted(stack.outputs.items()):
            print(f"  {name:<28} {value}")
        for name, value in sorted(given.items()):
            print(f"  parameter {name} = {value}")
        if args.webhook is not None:
            print(f"chat notices: posted to {args.webhook} (the secret {WEBHOOK_SECRET})")
        if args.mlflow is not None:
            print(f"MLflow: each run logged to {args.mlflow}; `lustrain status RUN` links to it")
        jobs = stack.outputs.get("JobsBucketName", "<jobs bucket>")
        print(f"start a run:  AWS_ENDPOINT_URL={url} lustrain submit examples/tiny.yaml --stack {STACK_NAME}")
        print(
            f"          or: aws --endpoint-url {url} s3 cp SPEC.yaml s3://{jobs}/jobs/  (code.source: s3://...)"
        )
        print(
            f"follow runs:  export AWS_ENDPOINT_URL={url} LUSTRAIN_STACK={STACK_NAME}; "
            "lustrain runs | status RUN | logs RUN | cancel RUN"
        )
        print(
            "one function: lustrain local invoke FUNCTION -e EVENT  (FUNCTION: template.yaml's logical id, e.g. "
            "SweepFunction; it runs on this twin)"
        )
        previous = signal.signal(signal.SIGTERM, lambda *_: STOP.set())
        served.record(url, args.port, STACK_NAME)
        print("Ctrl-C stops the twin.", flush=True)
        deadline = time.monotonic() + args.for_seconds if args.for_seconds else None
        try:
            while not STOP.wait(0.5):
                if deadline and time.monotonic() > deadline:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        served.forget(args.port)
        server.stop()
        lambda_invoke.restore_environment(saved_env)
        default_user_config.clear()  # type: ignore[attr-defined]
        default_user_config.update(saved_moto_config)
    return EXIT_OK


def prepare_for_runs(quota: int, say: Any) -> None:
    """What a twin holds before its first run, served or made for one invocation: `quota` instances of each type
    (as an account whose limits were raised); the example's data and output buckets (examples/tiny.yaml); and the
    world the events/ samples' spec names (`samples_world`)."""
    from lustrain_core.prices import INSTANCE_TYPES
    from lustrain_core.spec import load_spec_file

    from lustrain.twin.patches import service_quotas
    from lustrain.twin.rehearse import REGION, bucket_of, ensure_bucket, ensure_data

    for instance_type in INSTANCE_TYPES:
        service_quotas.set_quota(instance_type, quota, REGION)
    example = load_spec_file(EXAMPLE)
    ensure_data(example, say)
    ensure_bucket(bucket_of(example.output.s3_uri))
    samples_world(say)


def samples_world(say: Any) -> None:
    """The buckets the events/ samples' spec (register_job_inline.json) reads and writes, as the rehearsal fills a
    spec's: its data prefix filled with the example's token shards, its output bucket, and its code.source holding
    the repository's trainer/ (an S3 code.source is the user's to fill; the samples name one)."""
    from lustrain_core.spec import validate_spec

    from lustrain.twin.rehearse import REPO_ROOT, bucket_of, ensure_bucket, ensure_data, operator_session

    path = SAMPLES / "register_job_inline.json"
    if not path.is_file():
        return
    spec = validate_spec(json.loads(path.read_text())["input"]["spec"])
    ensure_data(spec, say)
    ensure_bucket(bucket_of(spec.output.s3_uri))
    bucket, _, prefix = spec.code.source.removeprefix("s3://").partition("/")
    ensure_bucket(bucket)
    s3 = operator_session().client("s3")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return
    trainer = REPO_ROOT / "trainer"
    files = sorted(p for p in trainer.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for file in files:
        s3.upload_file(str(file), bucket, prefix + file.relative_to(trainer).as_posix())
    say(
        f"code: {spec.code.source} was empty: uploaded trainer/ ({len(files)} files), the events/ samples' code"
    )


def cmd_local_invoke(args: argparse.Namespace) -> int:
    """Invoke one function of the stack, by its logical id in template.yaml (as `sam local invoke` names it) or its
    handler's name, on the twin of a running `lustrain local up`, else on a fresh twin made for this call alone."""
    from lustrain.twin import served
    from lustrain.twin.rehearse import STACK_NAME

    functions = template_functions()
    module = function_module(args.function, functions)
    if module is None:
        allowed = ", ".join(f"{lid} ({mod})" for lid, mod in sorted(functions.items()))
        print(
            f"lustrain: local invoke: FUNCTION {args.function!r} is not a function of template.yaml; "
            f"give one of its logical ids (or the handler's name in brackets): {allowed}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    try:
        event = json.loads(args.event.read_text())
    except json.JSONDecodeError as exc:
        print(f"lustrain: local invoke: --event {args.event} is not JSON: {exc}", file=sys.stderr)
        return EXIT_INVALID
    found, passed = served.find(STACK_NAME)
    if found is not None:
        print(f"lustrain: invoking {args.function} on the twin served at {found.url}", file=sys.stderr)
        try:
            response = _invoke_served(found.url, module, event)
        except LookupError as exc:
            print(f"lustrain: local invoke: {exc}", file=sys.stderr)
            return EXIT_FAILED
    else:
        why = "; ".join(passed) if passed else "none is recorded and AWS_ENDPOINT_URL is not set"
        print(
            f"lustrain: no running `lustrain local up` ({why}): building a fresh twin for this call "
            "(its quotas and example data as `local up` sets them; everything it holds is gone when the call ends)",
            file=sys.stderr,
        )
        response = _invoke_fresh(module, event)
    payload = response["Payload"]
    try:
        print(json.dumps(json.loads(payload), indent=2))
    except json.JSONDecodeError:
        print(payload)
    if response.get("FunctionError"):
        print(f"lustrain: {args.function} failed ({response['FunctionError']})", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def template_functions() -> dict[str, str]:
    """Logical id -> handler module name (RegisterJobFunction -> register_job), for every function of
    template.yaml."""
    from lustrain.twin.cfn import load_template
    from lustrain.twin.rehearse import TEMPLATE

    resources = load_template(TEMPLATE)["Resources"]
    return {
        lid: str(res["Properties"]["Handler"]).rsplit(".", 1)[0].rsplit(".", 1)[-1]
        for lid, res in resources.items()
        if res.get("Type") in ("AWS::Serverless::Function", "AWS::Lambda::Function")
    }


def function_module(name: str, functions: dict[str, str]) -> str | None:
    """The handler module FUNCTION names: a logical id, or the module itself."""
    if name in functions:
        return functions[name]
    return name if name in functions.values() else None


def _invoke_served(url: str, module: str, event: Any) -> dict[str, Any]:
    """Invoke the served stack's function whose handler is `module`'s (found by its Handler, as the server lists
    it: the served stack may have been made from another checkout's template)."""
    import boto3
    from botocore.config import Config

    from lustrain.twin.rehearse import OPERATOR_KEY, REGION

    client = boto3.client(
        "lambda",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=OPERATOR_KEY,
        aws_secret_access_key=OPERATOR_KEY,
        # a function runs up to its Timeout (15 minutes at most on AWS); botocore would give up after 60 s
        config=Config(read_timeout=900, retries={"max_attempts": 1}),
    )
    names = [
        f["FunctionName"]
        for page in client.get_paginator("list_functions").paginate()
        for f in page["Functions"]
        if str(f.get("Handler", "")).rsplit(".", 1)[0].rsplit(".", 1)[-1] == module
    ]
    if len(names) != 1:
        raise LookupError(
            f"the twin at {url} has {len(names)} functions whose handler is {module}'s: {names}"
        )
    response = client.invoke(FunctionName=names[0], Payload=json.dumps(event).encode())
    return {**response, "Payload": response["Payload"].read().decode()}


def _invoke_fresh(module: str, event: Any) -> dict[str, Any]:
    """Invoke on a twin made for this call. What the twin and the handler print (the example data's preparation,
    the handler's own output, which AWS sends to CloudWatch) goes to stderr: stdout holds the answer alone."""
    import boto3

    from lustrain.twin.rehearse import REGION, twin

    with contextlib.redirect_stdout(sys.stderr), twin(local_parameters()) as stack:
        prepare_for_runs(DEFAULT_LOCAL_QUOTA, lambda line: print(line, file=sys.stderr))
        response = boto3.client("lambda", region_name=REGION).invoke(
            FunctionName=stack.function_names()[module], Payload=json.dumps(event).encode()
        )
        return {**response, "Payload": response["Payload"].read().decode()}
