"""The `lustrain` command: validate and plan job specs, rehearse whole runs on the local twin.

Exit codes of every command: 0 ok, 1 the run or an AWS call failed, 2 invalid spec or usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from lustrain_core.errors import LustrainError, SpecInvalid, UsageInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.prices import PriceTable
from lustrain_core.spec import json_schema, load_spec_file

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(given)
    if getattr(args, "passthrough", False):
        # `data prepare` hands everything after its name to the preparation's own parser, options first or last
        # (argparse's REMAINDER alone drops a leading option such as --help or --tokenizer)
        args.rest = given[given.index("prepare", given.index("data")) + 1 :]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except SpecInvalid as exc:
        print(f"lustrain: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"lustrain: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return EXIT_INVALID
    except LustrainError as exc:
        print(f"lustrain: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (BotoCoreError, ClientError) as exc:
        print(f"lustrain: AWS call failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # the reader went away (`lustrain logs RUN | head`): stop quietly, as other command-line tools do (what is
        # still buffered for stdout goes nowhere, not into a second BrokenPipeError at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lustrain", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check a job spec; every problem names its field")
    v.add_argument("spec", type=Path)
    v.set_defaults(command=cmd_validate)

    pl = sub.add_parser("plan", help="will the run fit, and what will it cost? (no AWS calls)")
    pl.add_argument("spec", type=Path)
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--data-gib", type=float, help="the data's size, instead of data.size_gib")
    pl.add_argument("--prices", type=Path, help="JSON price overrides (see README)")
    pl.set_defaults(command=cmd_plan)

    s = sub.add_parser("schema", help="print the job spec's JSON Schema (for yaml-language-server)")
    s.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    s.set_defaults(command=cmd_schema)

    sb = sub.add_parser("submit", help="start a run on a deployed stack: drop the spec into its jobs bucket")
    sb.add_argument("spec", type=Path)
    where = sb.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="the deployed stack's name (its outputs name the buckets)")
    where.add_argument("--jobs-bucket", help="the jobs bucket, named directly (with --artifacts-bucket)")
    sb.add_argument("--artifacts-bucket", help="where a local code.source is uploaded (with --jobs-bucket)")
    sb.add_argument("--region", help="the stack's region (default: the AWS configuration's)")
    sb.add_argument(
        "--team",
        help="the team the run is for, on a stack of several teams: the spec is dropped under jobs/TEAM/ (its "
        "output.s3_uri is then that team's folder, <prefix>TEAM/)",
    )
    sb.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the run to start, with --stack (default 60)"
    )
    sb.set_defaults(command=cmd_submit)

    for name, help_text, command in (
        ("runs", "every run of a stack: state, attempt, instances, elapsed time, cost so far", cmd_runs),
        ("status", "one run: its states on a time line, quota, file system, training job, last metrics", cmd_status),
        ("cancel", "stop a run; its teardown stops the training job and deletes what the run created", cmd_cancel),
        ("logs", "the run's logs (its training or processing jobs'), every host merged in time order", cmd_logs),
        ("watch", "follow a run live, state by state with its training progress, until it ends", cmd_watch),
        ("report", "an HTML report with PNG plots: loss and validation bits per byte by step, states on a time line, cost, throughput", cmd_report),
    ):
        op = sub.add_parser(name, help=help_text)
        if name != "runs":
            op.add_argument("run", metavar="RUN", help="the run's job id, execution name or ARN, or spec name")
        if name == "logs":
            op.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the run ends")
        if name == "watch":
            op.add_argument("--interval", type=float, default=5.0, help="seconds between looks (default 5)")
        if name == "report":
            op.add_argument("-o", "--output", type=Path, default=Path("reports"), help="where to write (default reports/)")
        if name == "cancel":
            op.add_argument("--wait", action="store_true",
                            help="return when the run's teardown has ended, and print what it stopped, deleted and kept")
            op.add_argument("--timeout", type=float, default=3600.0,
                            help="with --wait: the longest wait in seconds (default 3600); exit 1 if still tearing down")
        _stack_arguments(op)
        op.set_defaults(command=command)

    tb = sub.add_parser("tensorboard", help="copy a run's TensorBoard files here, and serve TensorBoard over them")
    tb.add_argument("run", metavar="RUN", help="the run's job id, execution name or ARN, or spec name")
    tb.add_argument("-o", "--output", type=Path, default=Path("reports"),
                    help="where to copy them: <output>/<job id>/<training job>/ (default reports/)")
    tb.add_argument("--serve", action="store_true", help="then serve TensorBoard over them on 127.0.0.1")
    tb.add_argument("--port", type=int, default=6006, help="TensorBoard's port with --serve (default 6006; 0: a free one)")
    tb.add_argument("--for-seconds", type=float, help="with --serve: stop after this long (default: until Ctrl-C)")
    _stack_arguments(tb)
    tb.set_defaults(command=cmd_tensorboard)

    lo = sub.add_parser(
        "leftovers",
        help="what the stack's runs still hold and what it bills an hour; exit 1 when anything bills",
    )
    lo.add_argument("run", metavar="RUN", nargs="?", help="only this run's (job id, execution, or spec name)")
    lo.add_argument("--prices", type=Path, help="JSON price overrides (as for plan)")
    _stack_arguments(lo)
    lo.set_defaults(command=cmd_leftovers)

    db = sub.add_parser(
        "dashboard",
        help="a local web page following every run live: states, queue, progress, cost; a run's plots and log",
    )
    db.add_argument("--port", type=int, default=8765, help="the port on 127.0.0.1 (default 8765; 0: a free one)")
    db.add_argument("--for-seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    _stack_arguments(db)
    db.set_defaults(command=cmd_dashboard)

    d = sub.add_parser("data", help="prepare training data").add_subparsers(required=True, metavar="ACTION")
    dp = d.add_parser(
        "prepare", help="turn a tree of text files into token shards for Lustre", add_help=False
    )
    dp.add_argument("rest", nargs=argparse.REMAINDER)
    dp.set_defaults(command=cmd_data_prepare, passthrough=True)

    ex = sub.add_parser("export", help="write a trained model as a Hugging Face directory (transformers loads it)")
    ex.add_argument("model", metavar="MODEL",
                    help="a model directory, a model.tar.gz, an s3:// model (.tar.gz or prefix), or a run of --stack")
    ex.add_argument("-o", "--output", type=Path, required=True, help="the directory to write")
    ex.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the weights' type (default float32, as trained)")
    ex.add_argument("--max-shard-gib", type=float, default=None,
                    help="the largest safetensors file before the weights are sharded (default 5 GB)")
    ex.add_argument("--stack", default=os.environ.get("LUSTRAIN_STACK", "lustrain"),
                    help="the stack whose run MODEL names (default: $LUSTRAIN_STACK, else lustrain)")
    ex.add_argument("--region", help="the stack's region (default: the AWS configuration's)")
    ex.set_defaults(command=cmd_export)

    _add_twin_commands(sub)
    return p


def _stack_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stack",
        default=os.environ.get("LUSTRAIN_STACK", "lustrain"),
        help="the stack's name (default: $LUSTRAIN_STACK, else lustrain; the twin's is lustrain-twin)",
    )
    p.add_argument("--region", help="the stack's region (default: the AWS configuration's)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _stack(args: argparse.Namespace) -> Any:
    import boto3

    from lustrain.operate import Stack

    session = boto3.Session(region_name=args.region) if args.region else boto3.Session()
    return Stack.locate(args.stack, session)


def _ago(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def cmd_runs(args: argparse.Namespace) -> int:
    from lustrain.operate import runs

    found = runs(_stack(args))
    if args.json:
        print(json.dumps([r.to_dict() for r in found], indent=2))
        return EXIT_OK
    if not found:
        print(f"no runs in stack {args.stack}")
        return EXIT_OK
    # newest first; a run that never launched anything (a spec refused at registration) shows "-" for its attempt
    # and instances
    header = ("RUN", "NAME", "STATE", "STARTED (UTC)", "ATTEMPT", "INSTANCES", "ELAPSED", "COST SO FAR")
    rows = [
        (
            r.job_id,
            r.name,
            r.state + (f" ({r.error})" if r.error else ""),
            r.created_at.replace("T", " ")[:16],
            str(r.attempt) if r.attempt else "-",
            f"{r.instances} x {r.instance_type}" if r.instances else "-",
            _ago(r.elapsed_s),
            f"${r.cost_so_far_usd:,.2f}" + (f" of ${r.budget_usd:,.2f}" if r.budget_usd is not None else ""),
        )
        for r in sorted(found, key=lambda r: r.created_at, reverse=True)
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from lustrain.operate import as_json, evaluation_text, status, warm_pool_text

    found = status(_stack(args), args.run, with_mlflow=True)
    if args.json:
        print(as_json(found))
        return EXIT_OK
    r = found.run
    print(f"run {r.job_id} ({r.name}): {r.state}" + (f", {r.error}" if r.error else ""))
    if found.cause:
        print(f"  cause:       {found.cause}")
    print(f"  execution:   {r.execution or '(none: a direct invoke)'} {found.execution_status or ''}".rstrip())
    if r.kind == "prepare":
        print(f"  prepare:     data preparation on {r.instances} x {r.instance_type}")
        for stage in found.stages:
            failed = f": {stage['failure_reason']}" if stage["failure_reason"] else ""
            print(f"    {stage['stage']:<6} {stage['name']} {stage['status']} ({stage['instances']} x){failed}")
    else:
        print(f"  attempt:     {r.attempt} on {r.instances} x {r.instance_type}")
    quota = found.quota
    if quota:
        print(f"  quota:       {quota.get('instances_requested')} x {quota.get('instance_type')} ('{quota.get('quota_name')}')")
    plan = found.training_plan
    if plan:
        now = plan.get("now")
        live = (
            f"; now {now['status']}, {now['available_instances']} free, {now['in_use_instances']} in use"
            if isinstance(now, dict)
            else f"; {now}"
            if now
            else ""
        )
        print(
            f"  plan:        training plan {plan['name']} ({plan['instance_count']} x {plan['instance_type']} in "
            f"{plan['availability_zone']}, {plan.get('start_time')} to {plan.get('end_time')}{live})"
        )
    place = found.queue
    if place.get("state") == "queued" and r.state == "RUNNING":
        print(
            f"  queue:       waiting in {place.get('pool')}: place {place.get('position')}, "
            f"{place.get('ahead_instances', 0)} instance(s) ahead, {_ago(float(place.get('queued_s') or 0))} so far"
        )
    elif place.get("admitted_at"):
        print(f"  queue:       admitted {place['admitted_at']} after {_ago(float(place.get('queued_s') or 0))}")
    if found.file_system:
        fs = found.file_system
        print(f"  file system: {fs['id']} {fs['lifecycle']} ({fs['deployment_type']}, {fs['storage_gib']:,} GiB)")
    if found.training_job:
        job = found.training_job
        print(f"  training:    {job['name']} {job['status']} ({job['secondary_status']})")
        if job["metrics"]:
            print("  metrics:     " + ", ".join(f"{k}={v:g}" for k, v in sorted(job["metrics"].items())))
    if found.warm_pool:
        # what the run's warm pools billed after their jobs ended, and whether one still does
        print(f"  warm pool:   {warm_pool_text(found.warm_pool)}")
    if found.evaluation:
        print(f"  evaluation:  {evaluation_text(found.evaluation)}")
    if found.mlflow:
        print(f"  mlflow:      {_mlflow_text(found.mlflow)}")
    spent = f"${r.cost_so_far_usd:,.2f}" + (f" of a ${r.budget_usd:,.2f} budget" if r.budget_usd is not None else "")
    print(f"  cost so far: {spent} (list prices) after {_ago(r.elapsed_s)}")
    if found.resources_left:
        label = "holds:      " if r.state == "RUNNING" else "left:       "
        print(f"  {label} " + ", ".join(f"{x['type']} {x['id']}" for x in found.resources_left))
    print("  timeline:")
    for span in found.timeline:
        took = f"{span.seconds:>8.1f} s" if span.seconds is not None else "     (now)"
        print(f"    {span.entered_at}  {took}  {span.state}")
    return EXIT_OK


def _mlflow_text(shown: dict[str, Any]) -> str:
    """Where the run's MLflow run is (operate.mlflow_run)."""
    if shown.get("error"):
        return f"{shown['tracking_uri']} could not be read: {shown['error']}"
    if not shown.get("run_id"):
        return f"no MLflow run yet on {shown['tracking_uri']} (one is made when the first attempt ends)"
    if shown.get("url"):
        return str(shown["url"])
    return f"run {shown['run_id']} on {shown['tracking_uri']}; open the UI with: {shown['open']}"


def cmd_cancel(args: argparse.Namespace) -> int:
    from lustrain.cleanup import wait_for_teardown
    from lustrain.operate import cancel

    if args.timeout <= 0:
        raise UsageInvalid.one("--timeout", str(args.timeout), "is the longest wait in seconds: a number above 0")
    stack = _stack(args)
    done = cancel(stack, args.run)
    waited = wait_for_teardown(stack, done.job_id, timeout_s=args.timeout) if args.wait else None
    if args.json:
        print(json.dumps({**done.to_dict(), **({"teardown": waited.to_dict()} if waited else {})}, indent=2))
    elif done.already_ended:
        print(f"run {done.job_id} already ended {done.already_ended}: nothing to cancel")
    elif done.orphaned:
        print(f"run {done.job_id} had no execution (a function invoked alone registered it, or its execution is gone): "
              "its record now ends FAILED, RunCancelled")
        if done.left:
            print(f"what it created ({len(done.left)}) goes at the sweeper's next round: "
                  f"lustrain leftovers {done.job_id} --stack {args.stack}")
    else:
        print(f"run {done.job_id} cancelled ({done.cause}); its teardown has started")
        if waited is None:
            print(f"follow it: lustrain status {done.job_id} --stack {args.stack}")
    if waited is not None and not args.json:
        from lustrain.cleanup import teardown_text

        print(teardown_text(waited.to_dict(), done.job_id, args.stack))
    if waited is not None and not waited.ended:
        return EXIT_FAILED
    return EXIT_FAILED if done.already_ended and done.already_ended != "ABORTED" else EXIT_OK


def cmd_leftovers(args: argparse.Namespace) -> int:
    from lustrain_core.leftovers import exit_code

    from lustrain.cleanup import leftovers, leftovers_text

    try:
        prices = PriceTable.load(args.prices)
    except (ValueError, KeyError) as exc:
        raise UsageInvalid.one("--prices", str(args.prices), f"not a valid price override file: {exc}") from None
    found = leftovers(_stack(args), args.run, prices)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
    else:
        print(leftovers_text(found.to_dict()))
    return exit_code(found)


def cmd_logs(args: argparse.Namespace) -> int:
    import time

    from lustrain.operate import find_run, logs

    stack = _stack(args)
    since: int | None = None
    hosts: set[str] = set()
    while True:
        # read whether it still runs before the lines: the lines a run writes as it ends are then still printed
        record = find_run(stack, args.run)
        running = args.follow and not record.finished
        lines = logs(stack, args.run, since_ms=since)
        for line in lines:
            hosts.add(line.host)
            if args.json:
                print(json.dumps(line.to_dict()), flush=True)
            else:
                print(f"[{line.host}] {line.message}", flush=True)
        since = lines[-1].timestamp_ms if lines else since
        if not running:
            if hosts and 0 < len(hosts) < record.instance_count:
                # say so rather than let a missing host pass for a silent one
                print(f"lustrain: the log holds {len(hosts)} of the run's {record.instance_count} hosts "
                      f"({', '.join(sorted(hosts))}): a host that wrote nothing has no stream; on the twin every "
                      "instance's processes write to algo-1's", file=sys.stderr)
            return EXIT_OK
        time.sleep(2)


def cmd_watch(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from lustrain.operate import progress, watch

    stack = _stack(args)
    console = Console(stderr=False)
    printed = 0
    printed_json = ""
    last_step: int | None = None
    last = None
    bar = Progress(TextColumn("training"), BarColumn(), TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                   console=console, disable=args.json or not console.is_terminal, transient=True)
    task = None
    with bar:
        for snapshot in watch(stack, args.run, poll_s=args.interval):
            last = snapshot
            if args.json:
                shown = json.dumps(snapshot.to_dict(), default=str)
                if shown != printed_json:
                    print(shown, flush=True)
                    printed_json = shown
                continue
            for span in snapshot.timeline[printed:]:
                console.print(f"{span.entered_at}  {span.state}")
            printed = len(snapshot.timeline)
            job = snapshot.training_job
            if job and job["status"] == "InProgress":
                step, total = progress(stack, args.run)
                if task is None:
                    task = bar.add_task("training", total=total or 1)
                bar.update(task, completed=step or 0, total=total or max(step or 1, 1))
                if not console.is_terminal and step != last_step:
                    console.print(f"  training {job['name']}: step {step or 0}/{total or '?'}")
                last_step = step
    if last is None:
        return EXIT_FAILED
    r = last.run
    if not args.json:
        console.print(f"run {r.job_id}: {r.state}" + (f" ({r.error}: {last.cause})" if r.error else ""))
    return EXIT_OK if r.state == "SUCCEEDED" else EXIT_FAILED


def cmd_report(args: argparse.Namespace) -> int:
    from lustrain.report import build

    done = build(_stack(args), args.run, args.output)
    if args.json:
        print(json.dumps(done.to_dict(), indent=2))
    else:
        print(f"report of {done.job_id}: {done.html_path}")
        for name, path in done.pngs.items():
            print(f"  {name:<10} {path}")
        if done.tensorboard_logdir:
            print(f"TensorBoard: tensorboard --logdir {done.tensorboard_logdir}")
    return EXIT_OK


def cmd_tensorboard(args: argparse.Namespace) -> int:
    from lustrain.board import fetch, show

    found = fetch(_stack(args), args.run, args.output)
    if args.json and not args.serve:
        print(json.dumps(found.to_dict(), indent=2))
    else:
        show(found, args.run, port=args.port if args.serve else None, for_seconds=args.for_seconds)
    return EXIT_OK


def cmd_dashboard(args: argparse.Namespace) -> int:
    from lustrain.dashboard import serve

    return serve(_stack(args), port=args.port, for_seconds=args.for_seconds, as_json=args.json)


def _add_twin_commands(sub: Any) -> None:
    """The twin's commands live with the twin; importing them lazily keeps `plan` fast."""
    from lustrain.twin import commands

    commands.register(sub)


def cmd_validate(args: argparse.Namespace) -> int:
    prepare = _prepare_spec(args.spec)
    if prepare is not None:
        print(
            f"{args.spec}: valid data preparation spec {prepare.name!r} (kind: prepare); `lustrain plan` estimates "
            "its time and cost; `lustrain submit` runs it on a stack's SageMaker Processing jobs"
        )
        return EXIT_OK
    spec = load_spec_file(args.spec)
    _, launch = compile_offline(spec)
    print(
        f"{args.spec}: valid job spec {spec.name!r}; every request of the run is within AWS's limits "
        f"(image {launch.image_uri}, quota '{launch.quota.name}')"
    )
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    if _plan_prepare(args):
        return EXIT_OK
    spec = load_spec_file(args.spec)
    try:
        prices = PriceTable.load(args.prices)
    except (ValueError, KeyError) as exc:
        raise SpecInvalid.one(
            "--prices", str(args.prices), f"not a valid price override file: {exc}"
        ) from None
    result, _ = compile_offline(spec, data_gib=args.data_gib, prices=prices)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from lustrain.plan_text import render_plan

        print(render_plan(spec.name, result))
    return EXIT_OK


def _prepare_spec(path: Path) -> Any:
    """The spec at `path` validated as a data preparation (kind: prepare), or None where it is of another kind (or
    not readable: load_spec_file then says why)."""
    from lustrain_core.spec import MAX_SPEC_BYTES, is_prepare, parse_document, validate_prepare_spec

    if not path.is_file() or path.stat().st_size > MAX_SPEC_BYTES:
        return None
    doc = parse_document(path.read_bytes(), source=str(path))
    return validate_prepare_spec(doc) if is_prepare(doc) else None


def _plan_prepare(args: argparse.Namespace) -> bool:
    """`lustrain plan` of a kind: prepare spec (data preparation on SageMaker Processing); False for any other."""
    from lustrain_core import prepare_plan

    spec = _prepare_spec(args.spec)
    if spec is None:
        return False
    size = args.data_gib or spec.size_gib
    if size is None:
        raise SpecInvalid.one("size_gib", None, "the source's size in GiB is needed to plan (or give --data-gib)")
    plan = prepare_plan.planned(spec, size, PriceTable.load(args.prices))
    print(json.dumps(plan, indent=2) if args.json else prepare_plan.render_plan(plan))
    return True


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    import boto3

    from lustrain.submit import stack_buckets, submit, submit_prepare

    session = boto3.Session(region_name=args.region) if args.region else boto3.Session()
    if args.stack:
        jobs, artifacts = stack_buckets(args.stack, session)
    elif not args.artifacts_bucket:
        raise SpecInvalid.one("--artifacts-bucket", None, "is required with --jobs-bucket")
    else:
        jobs, artifacts = args.jobs_bucket, args.artifacts_bucket
    preparation = _prepare_spec(args.spec)
    if preparation is not None:
        # a data preparation (kind: prepare): the trainer package is its code
        done = submit_prepare(
            preparation.model_dump(mode="json", exclude_none=True),
            jobs_bucket=jobs,
            artifacts_bucket=artifacts,
            session=session,
            team=args.team,
        )
    else:
        done = submit(args.spec, jobs_bucket=jobs, artifacts_bucket=artifacts, session=session, team=args.team)
    return _started(args, session, done)


def _started(args: argparse.Namespace, session: Any, done: Any) -> int:
    """After a spec was dropped: wait for its run to start on --stack, and say how to follow it."""
    if done.code_s3_uri:
        print(f"code uploaded to {done.code_s3_uri}")
    estimate = (
        f"estimated at most ${done.estimated_cost_usd:,.2f}"
        if done.estimated_cost_usd is not None
        else "the stack estimates it from the source's size"
    )
    print(f"spec dropped at {done.spec_s3_uri} ({estimate})")
    if not args.stack:
        print("the jobs rule starts the state machine; follow it with lustrain runs --stack NAME")
        return EXIT_OK
    from lustrain.operate import Stack, started_from

    record = started_from(Stack.locate(args.stack, session), done.spec_s3_uri, timeout_s=args.wait)
    if record is None:
        print(f"no run started from it within {args.wait:g} s; lustrain runs --stack {args.stack} lists the runs")
        return EXIT_FAILED
    if record.unrecorded:
        from lustrain.operate import status

        refused = status(Stack.locate(args.stack, session), record.job_id)
        print(f"run {record.job_id} was refused: {refused.run.error}: {refused.cause}")
        return EXIT_INVALID
    print(f"run {record.job_id} started: execution {record.execution}")
    print(f"follow it: lustrain watch {record.job_id} --stack {args.stack}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    import boto3
    from lustrain_trainer.export import ExportError

    from lustrain.export import export

    if args.max_shard_gib is not None and args.max_shard_gib <= 0:
        raise SpecInvalid.one("--max-shard-gib", args.max_shard_gib, "must be above 0")
    session = boto3.Session(region_name=args.region) if args.region else boto3.Session()
    limit = int(args.max_shard_gib * 2**30) if args.max_shard_gib else None
    try:
        files = export(args.model, args.output, dtype=args.dtype, max_shard_bytes=limit,
                       s3=lambda: session.client("s3"), stack=lambda: _stack(args))
    except ExportError as exc:
        print(f"lustrain: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"exported {args.model} to {args.output}: {', '.join(files)}")
    print(f"load it: transformers.AutoModelForCausalLM.from_pretrained({str(args.output)!r}); "
          f"sample it: python -m lustrain_trainer.generate {args.output}")
    return EXIT_OK


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from lustrain_trainer import prepare

    if any(given.partition("=")[0] in ("--stack", "--instance-type") for given in args.rest):
        return _prepare_on_stack(args.rest)
    return int(prepare.main(args.rest))


def _prepare_on_stack(rest: list[str]) -> int:
    """`lustrain data prepare s3://SRC s3://OUT --instances N --stack S`: the preparation as SageMaker Processing
    jobs of the stack (a kind: prepare run, submitted as `lustrain submit` submits a spec)."""
    import boto3

    from lustrain.submit import prepare_spec_of, stack_buckets, submit_prepare

    p = argparse.ArgumentParser(
        prog="lustrain data prepare",
        description="With --stack: tokenize s3://SRC into shards under s3://OUT on the stack's SageMaker Processing "
        "jobs (a plan stage, then --instances workers, then a merge).",
    )
    p.add_argument("src", metavar="SRC", help="the text's s3:// prefix")
    p.add_argument("out", metavar="OUT", help="where the shards and index.json go (an s3:// prefix)")
    p.add_argument("--stack", required=True, help="the deployed stack's name (its outputs name the buckets)")
    p.add_argument("--instances", type=int, default=1, help="processing instances of the work stage (default 1)")
    p.add_argument("--instance-type", default=None, help="the processing instances' type (default ml.c5.xlarge)")
    p.add_argument("--tokenizer", default="bytes", help="bytes | bpe:VOCAB | a tokenizer.json's s3:// URI")
    p.add_argument("--name", help="the run's name ([a-z0-9-], default: OUT's last folder)")
    p.add_argument("--size-gib", type=float, help="the source's size, when the stack should not measure it")
    p.add_argument("--region", help="the stack's region (default: the AWS configuration's)")
    p.add_argument("--team", help="the team the run is for, on a stack of several teams (jobs/TEAM/)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the run to start (default 60)")
    args = p.parse_args(rest)
    doc = prepare_spec_of(
        args.src,
        args.out,
        instances=args.instances,
        instance_type=args.instance_type,
        tokenizer=args.tokenizer,
        name=args.name,
        size_gib=args.size_gib,
    )
    session = boto3.Session(region_name=args.region) if args.region else boto3.Session()
    jobs, artifacts = stack_buckets(args.stack, session)
    done = submit_prepare(doc, jobs_bucket=jobs, artifacts_bucket=artifacts, session=session, team=args.team)
    return _started(args, session, done)


if __name__ == "__main__":
    sys.exit(main())
