"""The `lustrain` command: validate and plan job specs, rehearse whole runs on the local twin.

Exit codes of every command: 0 ok, 1 the run or an AWS call failed, 2 invalid spec or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from lustrain_core.errors import LustrainError, SpecInvalid
from lustrain_core.launch import compile_offline
from lustrain_core.planner import Plan
from lustrain_core.prices import PriceTable
from lustrain_core.spec import json_schema, load_spec_file

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
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
    sb.set_defaults(command=cmd_submit)

    d = sub.add_parser("data", help="prepare training data").add_subparsers(required=True, metavar="ACTION")
    dp = d.add_parser(
        "prepare", help="turn a tree of text files into token shards for Lustre", add_help=False
    )
    dp.add_argument("rest", nargs=argparse.REMAINDER)
    dp.set_defaults(command=cmd_data_prepare)

    _add_twin_commands(sub)
    return p


def _add_twin_commands(sub: Any) -> None:
    """The twin's commands live with the twin; importing them lazily keeps `plan` fast."""
    from lustrain.twin import commands

    commands.register(sub)


def cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec_file(args.spec)
    _, launch = compile_offline(spec)
    print(
        f"{args.spec}: valid job spec {spec.name!r}; every request of the run is within AWS's limits "
        f"(image {launch.image_uri}, quota '{launch.quota.name}')"
    )
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
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
        print(render_plan(spec.name, result))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    import boto3

    from lustrain.submit import stack_buckets, submit

    session = boto3.Session(region_name=args.region) if args.region else boto3.Session()
    if args.stack:
        jobs, artifacts = stack_buckets(args.stack, session)
    elif not args.artifacts_bucket:
        raise SpecInvalid.one("--artifacts-bucket", None, "is required with --jobs-bucket")
    else:
        jobs, artifacts = args.jobs_bucket, args.artifacts_bucket
    done = submit(args.spec, jobs_bucket=jobs, artifacts_bucket=artifacts, session=session)
    if done.code_s3_uri:
        print(f"code uploaded to {done.code_s3_uri}")
    print(f"spec dropped at {done.spec_s3_uri} (estimated at most ${done.estimated_cost_usd:,.2f})")
    print("the jobs rule starts the state machine; watch it in the Step Functions console")
    return EXIT_OK


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from lustrain_trainer import prepare

    return int(prepare.main(args.rest))


def render_plan(name: str, p: Plan) -> str:
    n, f, c = p.network, p.filesystem, p.cost
    rows: list[tuple[str, str]] = [
        ("network", ""),
        (
            "  IPs needed",
            f"{n.ips_needed} ({n.ips_for_instances} instances + {n.ips_for_filesystem} Lustre "
            f"+ {n.ips_headroom} headroom; {n.ips_per_instance} per instance)",
        ),
    ]
    if n.reuse_subnet_id:
        rows.append(("  subnet", f"{n.reuse_subnet_id} (existing: free IPs checked at run time)"))
    else:
        rows.append(
            (
                "  subnet",
                f"{n.subnet_cidr} (/{n.subnet_prefix_length}: {n.usable_ips} usable) in {n.vpc_cidr}",
            )
        )
    rows.append(("filesystem", ""))
    if f.reuse_file_system_id:
        rows.append(("  reuse", f.reuse_file_system_id))
    else:
        rows += [
            ("  type", f"{f.deployment_type}, {f.compression} compression"),
            ("  capacity", f"{f.storage_gib:,} GiB" if f.storage_gib else "-"),
            ("  throughput", f"{f.throughput_mb_s:,.0f} MB/s ({f.throughput_per_tib} MB/s per TiB)"),
            ("  why", f.reason),
        ]
    rows.append(("  GPU demand", f"{f.demand_mb_s:,.0f} MB/s"))
    rows += [
        (
            "output",
            f"{p.output['s3_uri']} ({p.output['expected_size_gib']:g} GiB; local usable "
            f"{p.output['local_usable_gib']:,.0f} GiB{'; via Lustre' if p.output['to_filesystem'] else ''})",
        ),
        (
            "quota",
            f"{p.quota['instances_requested']} x {p.quota['instance_type']} ('{p.quota['quota_name']}')",
        ),
        (
            "cost",
            f"${c.total_usd:,.2f} at most (compute ${c.compute_usd:,.2f}, file system ${c.filesystem_usd:,.2f}, "
            f"control plane ${c.control_plane_usd:.4f}; prices of {c.prices_as_of})",
        ),
        ("recommend", p.recommendation["why"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"plan for {name}"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"  warning: {w}" for w in p.warnings]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
