"""The throughput benchmark's report (benchmarks/throughput/throughput_bench.py
measures; this draws): the Markdown tables of a part's record (frames/s
against the raw-ALE ceiling, the CPU each thread group used) and the plots
of benchmarks/plots/ from the committed records
(`python3 benchmarks/throughput/throughput_bench.py --plot`).
"""

from __future__ import annotations

import json
import os

from benchmarks.core import (
    common,
    figures,  # noqa: E402
)

RESULTS_DIR = os.path.join(common.REPO, "benchmarks", "results")
PLOTS_DIR = os.path.join(common.REPO, "benchmarks", "plots")
# Environment frames an agent step (the action repeat).
FRAMES_PER_AGENT_STEP = 4


def _env_label(config: dict) -> str:
    env = config.get("env")
    if env is None:
        return ""
    return " " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(default threads)")


def table(result: dict) -> str:
    ceiling = result["ceiling_frames_per_s"]
    ceiling_per_cpu = sum(c["frames_per_cpu_s"] for c in result["ceilings"]) / len(
        result["ceilings"]
    )
    lines = [
        f"Ceiling (raw ALE + preprocessing, {result['machine']['nproc']} processes, no agent): "
        + ", ".join(
            f"{c['frames_per_s']:.0f} (load {c['load']:.1f})"
            for c in result["ceilings"]
        )
        + f" frames/s; mean {ceiling:.0f}. One stepping process: {ceiling_per_cpu:.0f} frames per CPU-second.",
        "",
        "| code, repeat | agent | actors | batch | unroll | dynamic batching | frames/s | agent steps/s "
        "| learner steps/s | fraction of ceiling | batched / unbatched | cores used: learner process + env processes "
        "| frames per CPU-second | CPU-normalised fraction of ceiling | load (start-end) | start-up s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]

    def key(run: dict, dynamic_batching: bool) -> tuple:
        c = run["config"]
        return (
            run["code"],
            run["repeat"],
            c["agent"],
            c["num_actors"],
            c.get("envs_per_actor", 1),
            c.get("envs_per_process", 1),
            c.get("torso_dtype", "float32"),
            c.get("use_lstm", "true"),
            c.get("replay_proportion", 0),
            c["batch_size"],
            c["unroll_length"],
            dynamic_batching,
            json.dumps(c.get("env")),
        )

    by_key = {
        key(run, run["config"]["dynamic_batching"]): run for run in result["runs"]
    }
    for run in result["runs"]:
        c = run["config"]
        if "frames_per_s" not in run:
            lines.append(
                f"| {run['code']}, {run['repeat'] + 1} | {c['agent']} | {c['num_actors']} | {c['batch_size']} | {c['unroll_length']} | {c['dynamic_batching']} | failed | | | | | | | | | |"
            )
            continue
        fps = run["frames_per_s"]
        k = c.get("envs_per_actor", 1)
        actors = f"{c['num_actors']} x {k} envs" if k > 1 else str(c["num_actors"])
        if c.get("envs_per_process", 1) > 1:
            actors += f", {c['envs_per_process']} per process"
        agent = c["agent"]
        if c.get("torso_dtype", "float32") != "float32":
            agent += f" ({c['torso_dtype']})"
        if c.get("use_lstm", "true") == "false":
            agent += ", feed-forward"
        if c.get("replay_proportion"):
            agent += f", replay {c['replay_proportion']} of {c['replay_capacity']:,}"
        if c.get("family_defaults"):
            agent += ", no layout flags (Atari's defaults)"
        ratio = ""
        if c["dynamic_batching"]:
            other = by_key.get(key(run, False))
            if other and other.get("frames_per_s"):
                ratio = f"{fps / other['frames_per_s']:.2f}x"
        cpu = run["cpu_s"]
        env_cpu = cpu.get("environment processes", 0.0)
        main_cpu = run["cpu_total_s"] - env_cpu
        per_cpu = fps * run["window_s"] / run["cpu_total_s"]
        lines.append(
            f"| {run['code']}{_env_label(c)}, {run['repeat'] + 1} | {agent} | {actors} | {c['batch_size']} | {c['unroll_length']} "
            f"| {'on' if c['dynamic_batching'] and k == 1 else 'off'} | {fps:.0f} | {fps / FRAMES_PER_AGENT_STEP:.0f} "
            f"| {run['learner_steps_per_s']:.2f} | {fps / ceiling:.1%} | {ratio} "
            f"| {main_cpu / run['window_s']:.2f} + {env_cpu / run['window_s']:.2f} "
            f"| {per_cpu:.0f} | {per_cpu / ceiling_per_cpu:.1%} "
            f"| {run['load_start']:.1f}-{run['load_end']:.1f} | {run['startup_s']:.0f} |"
        )
    return "\n".join(lines)


def cpu_table(result: dict) -> str:
    lines = [
        "| code | repeat | thread group / process | CPU s over window | cores |",
        "|---|---:|---|---:|---:|",
    ]
    for run in result["runs"]:
        if "cpu_s" not in run:
            continue
        cpu = run["cpu_s"]
        for group, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
            if seconds >= 0.05:
                lines.append(
                    f"| {run['code']} | {run['repeat']} | {group} | {seconds:.1f} | {seconds / run['window_s']:.2f} |"
                )
    return "\n".join(lines)


def _actor_axes(axes, xlabel: str) -> None:
    """Log-2 actor counts 1-16 on the x axis of every panel."""
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)


def plot_layouts(result: dict, out: str) -> None:
    """benchmarks/plots/throughput_layouts.png: frames/s and fraction of the
    ceiling against actors, per agent and environments per actor."""
    plt = figures.require_pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple, list] = {}
    for run in result["runs"]:
        c = run["config"]
        if "frames_per_s" in run and c["unroll_length"] == 20:
            key = (c["agent"], c.get("envs_per_actor", 1), run["code"])
            series.setdefault(key, []).append(run)
    ceiling = result["ceiling_frames_per_s"]
    for (agent, k, code), runs in sorted(series.items()):
        runs.sort(key=lambda r: r["config"]["num_actors"])
        xs = [r["config"]["num_actors"] for r in runs]
        fps = [r["frames_per_s"] for r in runs]
        label = f"{agent}, {k} env{'s' if k > 1 else ''} per actor" + (
            " (dynamic batching)" if k == 1 else ""
        )
        if code != "current":
            label += f", {code}"
        style = ":^" if code != "current" else ("-o" if k == 1 else "--s")
        axes[0].plot(xs, fps, style, label=label)
        axes[1].plot(xs, [f / ceiling for f in fps], style, label=label)
    axes[0].axhline(ceiling, color="grey", lw=0.8, ls=":")
    axes[0].text(1, ceiling, " raw-ALE ceiling", va="bottom", fontsize=8, color="grey")
    axes[1].axhline(0.30, color="tab:red", lw=0.8, ls=":")
    axes[1].text(1, 0.30, " target 30 % (shallow)", va="bottom", fontsize=8)
    _actor_axes(axes, "actors (threads)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("environment frames/s (steady window)")
    axes[1].set_ylabel("fraction of the raw-ALE ceiling (same invocation)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "atari/pong, batch 8, unroll 20, 2-core CPU: environments per actor",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"Wrote {out}")


def plot_cpu_breakdown(result: dict, out: str, targets=None, title=None) -> None:
    """benchmarks/plots/throughput_envs_per_process.png: each configuration's frames/s
    as a fraction of the ceiling, and its CPU-ms per agent step by thread
    group, one process per environment against M to a process (and bfloat16
    torsos, the torso_dtype part's plot). `targets`: (fraction, label) lines."""
    plt = figures.require_pyplot()

    ceiling = result["ceiling_frames_per_s"]
    runs = [r for r in result["runs"] if "frames_per_s" in r]
    labels, fractions, colors, parts = [], [], [], []
    groups = (
        ("environment processes", "environment processes"),
        ("TensorFlow inter-op threads", "inter-op (executor, py_func)"),
        ("TensorFlow intra-op threads", "intra-op (kernels)"),
    )
    for run in runs:
        c = run["config"]
        k, m = c.get("envs_per_actor", 1), c.get("envs_per_process", 1)
        code = "before" if run["code"] != "current" else "after"
        label = f"{code}: {c['agent']} {c['num_actors']}x{k}"
        label += f", {m}/proc" if m > 1 else ""
        label += f", T={c['unroll_length']}" if c["unroll_length"] != 20 else ""
        bfloat16 = c.get("torso_dtype") == "bfloat16"
        label += ", bfloat16" if bfloat16 else ""
        labels.append(label)
        fractions.append(run["frames_per_s"] / ceiling)
        colors.append(
            "tab:olive"
            if bfloat16
            else "tab:green"
            if m > 1
            else "tab:grey"
            if code == "before"
            else "tab:blue"
        )
        steps = run["frames_per_s"] / FRAMES_PER_AGENT_STEP * run["window_s"]
        cpu = run["cpu_s"]
        parts.append(
            [
                sum(v for g, v in cpu.items() if g.startswith(prefix)) / steps * 1e3
                for prefix, _ in groups
            ]
        )
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    ys = range(len(labels))
    axes[0].barh(ys, fractions, color=colors)
    for (fraction, name), ls in zip(
        targets or [(0.30, "target: 30 %")], ("--", ":"), strict=False
    ):
        axes[0].axvline(fraction, color="tab:red", ls=ls, lw=1, label=name)
    axes[0].set_xlabel(f"fraction of the raw-ALE ceiling ({ceiling:,.0f} frames/s)")
    axes[0].legend(fontsize=8, loc="lower right")
    left = [0.0] * len(labels)
    for i, (_, name) in enumerate(groups):
        widths = [p[i] for p in parts]
        color = ("tab:brown", "tab:orange", "tab:purple")[i]
        axes[1].barh(ys, widths, left=left, label=name, color=color)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes[1].set_xlabel("CPU-ms per agent step, by thread group")
    axes[1].legend(fontsize=8, loc="lower right")
    axes[0].set_yticks(list(ys), labels, fontsize=8)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        title
        or "atari/pong training, batch 8: grey = code before, blue = after with one "
        "process per environment, green = M environments per process (2 cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_torso_dtype(result: dict, out: str) -> None:
    """benchmarks/plots/throughput_torso_dtype.png: the torso_dtype part,
    with 1.5x the baseline's deep agent at 8 actors (when the record has a
    baseline) and 30 % of the ceiling for the shallow agent."""
    ceiling = result["ceiling_frames_per_s"]
    before = [
        r["frames_per_s"]
        for r in result["runs"]
        if r["code"] != "current" and r["config"]["agent"] == "deep"
    ]
    targets = [(0.30, "shallow target: 30 %")]
    if before:
        targets.insert(
            0,
            (1.5 * before[0] / ceiling, "1.5x the baseline's deep agent, 8 actors"),
        )
    plot_cpu_breakdown(
        result,
        out,
        targets,
        "atari/pong training, batch 8: grey = baseline code, blue/green = "
        "float32 torso, olive = bfloat16 torso (2 cores)",
    )


def record_path(part: str, json_path: str | None) -> str:
    """Where a part's record goes: `json_path` if given, else the default."""
    if json_path is not None:
        return os.path.abspath(json_path)
    return os.path.join(RESULTS_DIR, f"throughput_{part}.json")


def plot() -> None:
    for part, draw in (
        ("torso_dtype", plot_torso_dtype),
        ("envs_per_process", plot_cpu_breakdown),
        ("layouts", plot_layouts),
    ):
        path = record_path(part, None)
        if os.path.exists(path):
            with open(path) as f:
                os.makedirs(PLOTS_DIR, exist_ok=True)
                draw(json.load(f), os.path.join(PLOTS_DIR, f"throughput_{part}.png"))
