"""The learner tasks benchmark's configurations and report
(benchmarks/throughput/learner_tasks_bench.py measures): its Markdown
table, the projection to N learner tasks from the measured cost of the
second, and the plot of benchmarks/plots/learner_tasks.png
(`python3 benchmarks/throughput/learner_tasks_bench.py --plot RECORDS`).
"""

from __future__ import annotations

import json
import os

from benchmarks.core import common, figures

REPO = common.REPO
NUM_ACTION_REPEATS = 4
# (name, learner tasks, cores each task is pinned to: None = unpinned)
CONFIGURATIONS = [
    ("1 task, 1 core", 1, [[0]]),
    ("2 tasks, 1 core each", 2, [[0], [1]]),
    ("1 task, 2 cores", 1, [None]),
]


# Frames/s a 2-core actor host delivers, from BENCHMARKS.md (same machine
# kind, AMD): shallow, 2 actor tasks of 8 environments on loopback, the
# learner on the same cores (a lower bound); deep, single-machine 8 x 4
# float32. Environments per actor task: how many frames one weight copy
# serves.
ACTOR_HOST_FRAMES_PER_S = {"shallow": 8_000, "deep": 1_800}
ENVS_PER_ACTOR = 8


def project(
    results: list[dict],
    learner_tasks=(1, 2, 4, 8, 16),
    link_gbit: float = 10.0,
    actor_host_frames_per_s: dict | None = None,
) -> list[dict]:
    """N learner tasks (a core each, as measured) and the actor hosts that
    would feed them, from the measured per-task costs.

    t(N) = t1 + (N - 1) x max(c, b / W): t1 the update of one task on one
    core, c what one remote tower added to it here (2 tasks against 1), b
    the bytes it moved per update, W the chief's link; the remote towers'
    parameters and gradients all cross the chief's link, and each costs at
    least what it cost here. Frames/s = N x B x T x 4 / t(N); actor hosts =
    that / an actor host's frames/s; the chief's link carries the towers'
    bytes and every actor's weight copy (parameters per ENVS_PER_ACTOR x T
    x 4 frames; the unrolls go to their own learner task and are left out).
    """
    actor_host_frames_per_s = actor_host_frames_per_s or ACTOR_HOST_FRAMES_PER_S
    link = link_gbit * 1e9 / 8
    rows = []
    for agent_name in dict.fromkeys(r["agent"] for r in results):
        by_name = {r["configuration"]: r for r in results if r["agent"] == agent_name}
        one = by_name.get(CONFIGURATIONS[0][0])
        two = by_name.get(CONFIGURATIONS[1][0])
        if one is None or two is None:
            continue
        t1 = one["ms_per_update"] / 1e3
        remote = max(two["ms_per_update"] / 1e3 - t1, 0.0)
        moved = two["bytes_per_update"][0]
        frames_per_update = (
            one["batch_size_per_tower"] * one["unroll_length"] * NUM_ACTION_REPEATS
        )
        # Bytes of weights per frame an actor delivers.
        weight_copy = one["parameter_bytes"] / (
            ENVS_PER_ACTOR * one["unroll_length"] * NUM_ACTION_REPEATS
        )
        for n in learner_tasks:
            t = t1 + (n - 1) * max(remote, moved / link)
            frames = n * frames_per_update / t
            link_bytes = (n - 1) * moved / t + frames * weight_copy
            rows.append(
                {
                    "agent": agent_name,
                    "learner_tasks": n,
                    "ms_per_update": 1e3 * t,
                    "frames_per_s": frames,
                    "speed_up": frames / one["frames_per_s"],
                    "actor_hosts": frames / actor_host_frames_per_s[agent_name],
                    "chief_link_gbit": 8 * link_bytes / 1e9,
                    "link_gbit": link_gbit,
                }
            )
    return rows


def projection_table(rows: list[dict]) -> str:
    lines = [
        "| agent | learner tasks | ms per update | frames learnt/s | vs 1 task "
        "| actor hosts to feed it | chief's link (Gb/s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        over = " (over the link)" if r["chief_link_gbit"] > r["link_gbit"] else ""
        lines.append(
            f"| {r['agent']} | {r['learner_tasks']} | {r['ms_per_update']:,.0f} "
            f"| {r['frames_per_s']:,.0f} | {r['speed_up']:.1f}x "
            f"| {r['actor_hosts']:.1f} | {r['chief_link_gbit']:.1f}{over} |"
        )
    return "\n".join(lines)


PLOT = os.path.join(REPO, "benchmarks", "plots", "learner_tasks.png")


def plot(record_paths: list[str], path: str = PLOT) -> None:
    """One panel per record (its frames learnt/s per configuration and
    agent, relative to one task on one core) and, from the first record with
    a projection, the projected frames/s against the number of learner
    tasks beside the ideal N x."""
    plt = figures.require_pyplot()

    records = []
    for record_path in record_paths:
        with open(record_path) as f:
            records.append((os.path.basename(record_path), json.load(f)))
    fig, axes = plt.subplots(1, len(records) + 1, figsize=(5 * (len(records) + 1), 4))
    for axis, (name, record) in zip(axes, records, strict=False):
        results = record["results"]
        agents = list(dict.fromkeys(r["agent"] for r in results))
        names = [c[0] for c in CONFIGURATIONS]
        for i, agent_name in enumerate(agents):
            rows = {r["configuration"]: r for r in results if r["agent"] == agent_name}
            unit = rows[names[0]]["frames_per_s"]
            axis.bar(
                [j + 0.4 * i for j in range(len(names))],
                [rows[n]["frames_per_s"] / unit for n in names],
                width=0.4,
                label=agent_name,
            )
        axis.axhline(2.0, color="grey", ls=":", label="ideal for 2 tasks")
        axis.set_xticks([j + 0.2 for j in range(len(names))])
        axis.set_xticklabels(
            [
                n
                + (
                    " (split batch)"
                    if record.get("split_batch") and "2 tasks" in n
                    else ""
                )
                for n in names
            ],
            fontsize=7,
        )
        axis.set_ylabel("frames learnt/s, x one task on one core")
        axis.set_title(f"{record['network']}: {name}", fontsize=9)
        axis.legend(fontsize=7)
    projection = next((r["projection"] for _, r in records if r.get("projection")), [])
    axis = axes[-1]
    for agent_name in dict.fromkeys(p["agent"] for p in projection):
        rows = [p for p in projection if p["agent"] == agent_name]
        tasks = [p["learner_tasks"] for p in rows]
        axis.plot(
            tasks, [p["speed_up"] for p in rows], "o-", label=f"{agent_name}, projected"
        )
    if projection:
        tasks = sorted({p["learner_tasks"] for p in projection})
        axis.plot(tasks, tasks, ":", color="grey", label="ideal")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log", base=2)
    axis.set_xlabel("learner tasks (a core each)")
    axis.set_ylabel("frames learnt/s, x one task")
    axis.set_title("projection from the measured costs", fontsize=9)
    axis.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"Wrote {path}")


def table(results: list[dict]) -> str:
    """The Markdown table of a record's results, with each two-task row's
    speed-up over the one-task, one-core row of its agent."""
    lines = [
        "| agent | learner tasks | batch per tower | ms per update | frames learnt/s "
        "| vs 1 task, 1 core | cores used (per task) | MB per update through task 1 "
        "| parameters (MB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in results:
        unit = next(
            u["frames_per_s"]
            for u in results
            if u["agent"] == r["agent"] and u["configuration"] == CONFIGURATIONS[0][0]
        )
        moved = (
            f"{r['bytes_per_update'][0] / 1e6:.1f}" if r["bytes_per_update"] else "-"
        )
        lines.append(
            f"| {r['agent']} | {r['configuration']} | {r['batch_size_per_tower']} "
            f"| {r['ms_per_update']:,.0f} "
            f"| {r['frames_per_s']:,.0f} | {r['frames_per_s'] / unit:.2f}x "
            f"| {' / '.join(f'{c:.2f}' for c in r['cores_per_task'])} | {moved} "
            f"| {r['parameter_bytes'] / 1e6:.1f} |"
        )
    return "\n".join(lines)
