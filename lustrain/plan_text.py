"""The plan as `lustrain plan` prints it: the network, the file system, the output, the quota, the cost, the memory
and checkpoint plan, the goodput, each row in words (`--json` gives the same plan whole)."""

from __future__ import annotations

from typing import Any

from lustrain_core.planner import Plan


def _preload_rows(preload: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A cold first epoch (FSx loads each file from S3 on its first read while the fleet bills) next to the
    data.preload warm-up, in time and money (planner.plan_preload)."""
    if not preload:
        return []
    if preload["cold_first_epoch_seconds"] is None:
        cold = "unknown (give data.size_gib, or plan with the data readable, for its size)"
    else:
        cold = (
            f"{preload['cold_first_epoch_seconds'] / 3600:,.2f} h reading {preload['data_gib']:,.0f} GiB from S3 at "
            f"<= {preload['import_mb_s']:,.0f} MB/s while the fleet bills: {_usd(preload['cold_first_epoch_usd'])}"
        )
    if preload["warmup_seconds"] is None:
        warm = f"1 x {preload['warmup_instance_type']}, time unknown (data size unknown)"
    else:
        warm = (
            f"{preload['warmup_seconds'] / 3600:,.2f} h on 1 x {preload['warmup_instance_type']} at "
            f"{preload['warmup_read_mb_s']:,.0f} MB/s before the GPUs start: ${preload['warmup_usd']:,.2f}"
        )
    state = "on" if preload["enabled"] else "off (data.preload: true)"
    return [("  cold 1st epoch", cold), ("  warm-up", f"{state}: {warm}")]


def goodput_line(g: dict[str, Any]) -> str:
    """The plan's goodput object in one line (each figure's source is in `lustrain plan --json`, goodput.sources);
    "?" where the plan cannot say (no preset named, so no memory plan)."""

    def figure(key: str, fmt: str = ",.1f") -> str:
        value = g.get(key)
        return "?" if value is None else format(value, fmt)

    every = g.get("checkpoint_every_minutes")
    interval = f"every {every:g} min" if every else "by steps only"
    fraction = g.get("fraction")
    return (
        f"checkpoint {interval} (blocks {figure('checkpoint_blocking_s', '.3g')} s, written in "
        f"{figure('checkpoint_write_s')} s); stop request polled every {figure('stop_request_poll_s', 'g')} s, saved "
        f"{figure('stop_to_saved_s')} s after, StopTrainingJob after {figure('stop_wait_s', 'g')} s; resume reads "
        f"{figure('resume_read_gb_per_host', ',.2f')} GB a host in {figure('resume_s')} s; "
        f"{figure('expected_interruptions', '.2f')} interruptions expected: {figure('lost_gpu_hours')} of "
        f"{figure('billed_gpu_hours', ',.0f')} GPU-hours lost, "
        + ("? train" if fraction is None else f"{fraction:.2%} train")
    )


def _usd(figure: float | None) -> str:
    return "unknown (no price for the instance type)" if figure is None else f"${figure:,.2f}"


def render_plan(name: str, p: Plan) -> str:
    n, f, c = p.network, p.filesystem, p.cost
    rows: list[tuple[str, str]] = [
        ("network", ""),
        (
            "  IPs needed",
            f"{n.ips_needed} ({n.ips_for_instances} for the instances, {n.ips_per_instance} each with "
            f"{n.efa_interfaces} EFA interfaces; {n.ips_for_filesystem} for Lustre; {n.ips_headroom} headroom)",
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
    if f.checkpoints:
        ck = f.checkpoints
        rows.append(
            (
                "  checkpoints",
                f"{ck['held_at_once']} x {ck['state_gb']:,.1f} GB on Lustre ({ck['kept_gib']:,.0f} GiB); each written "
                f"in {ck['target_write_s']} s needs {ck['burst_mb_s']:,.0f} MB/s",
            )
        )
    rows += _preload_rows(p.preload)
    rows += [
        (
            "output",
            f"{p.output['s3_uri']} ({p.output['expected_size_gib']:g} GiB; local usable "
            f"{p.output['local_usable_gib']:,.0f} GiB{'; via Lustre' if p.output['to_filesystem'] else ''})",
        ),
        ("  model upload", f"{p.output['compression']}: {p.output['compression_why']}"),
        (
            "quota",
            f"{p.quota['instances_requested']} x {p.quota['instance_type']} ('{p.quota['quota_name']}')"
            if not p.quota.get("training_plan")
            else f"{p.quota['instances_requested']} x {p.quota['instance_type']} from training plan "
            f"{p.quota['training_plan']} (its status, type, count, zone and window are checked when the run "
            "is registered)",
        ),
        (
            "cost",
            f"${c.total_usd:,.2f} at most (compute ${c.compute_usd or 0:,.2f}, file system ${c.filesystem_usd:,.2f}, "
            f"control plane ${c.control_plane_usd:.4f}; prices of {c.prices_as_of})"
            if c.total_usd is not None
            else f"unknown: {p.quota['instance_type']} has no confirmed price (file system ${c.filesystem_usd:,.2f}, "
            f"control plane ${c.control_plane_usd:.4f}; prices of {c.prices_as_of}; --prices gives one)",
        ),
        ("recommend", p.recommendation["why"]),
    ]
    m = p.memory
    if m is not None:
        rows += [
            ("memory", f"{int(m['parameters']):,} parameters, {m['sharding']} (shard group {m['shard_group']}, "
                       f"{m['replicas']} replica(s)); peak {m['peak_gib_per_gpu']} of {m['gpu_gib']} GiB a GPU: "
                       f"fits {m['fits']}"),
            ("checkpoint", f"{m['checkpoint_gb']} GB ({m['checkpoint_gb_per_host']} GB a host), training blocked "
                           f"{m['checkpoint_blocking_s']} s, written to local NVMe in {m['checkpoint_write_s']} s; SIGTERM to "
                           f"saved {m['stop_to_saved_s']} s at worst"),
        ]
    if p.goodput is not None:
        rows.append(("goodput", goodput_line(p.goodput)))
    width = max(len(k) for k, _ in rows)
    lines = [f"plan for {name}"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"  warning: {w}" for w in p.warnings]
    return "\n".join(lines)
