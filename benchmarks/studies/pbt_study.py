"""The PBT study (docs/pbt.md): an evolving population against the same
draws with evolution off, its arms and table for the study runner; and the
figure of a population: each evolving hyperparameter of each member
over frames, drawn from the population's records and lineage (pbt/), with
each copy marked (from which member), and each member's fitness at each of
its evolutions; with --study_results (the PBT study's records), each
member's training curve above them beside its twin's with evolution off.

    python3 benchmarks/study.py pbt \
        --results benchmarks/results/pbt --logdir_root /tmp/pbt
    python3 benchmarks/studies/pbt_study.py --population_dir /tmp/population \
        --out benchmarks/plots/pbt.png

Needs matplotlib (benchmarks/requirements.txt).
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import (
    common,  # noqa: E402, F401  (puts the repository on the path)
    figures,  # noqa: E402
)
from benchmarks.studies.records import Arm, load_record  # noqa: E402

# the episodes between evolutions scaled down for it. Each arm's members
# train together; their population directories are under --logdir_root.
PBT_MEMBERS = 4
# 3 M frames a member: each arm (12 M frames) trains in 47 minutes on 2 cores.
PBT_FRAMES = 3_000_000
PBT_TASK = (
    "--flagfile=flagfiles/vizdoom_defend_the_center.cfg",
    # 4 members at once on 2 cores: 2 actors of 4 environments each.
    "--num_actors=2",
    "--save_checkpoint_secs=120",
)
PBT_BURN_IN_FRAMES = 1_000_000
PBT_RULE = (
    "--pbt_ready_episodes=200",
    # Fitness is the return here (no published scores): 1 kill.
    "--pbt_copy_threshold=1",
)


def pbt_arms(frames: int | None) -> list[Arm]:
    """Each member of the evolving population ('pbt_k') and of the same
    draws without evolution ('fixed_k'); `frames` replaces the budget."""
    arms = []
    for kind in ("pbt", "fixed"):
        burn_in = 10**15 if kind == "fixed" else PBT_BURN_IN_FRAMES
        for k in range(PBT_MEMBERS):
            arms.append(
                Arm(
                    f"{kind}_{k}",
                    (
                        *PBT_TASK,
                        f"--pbt_burn_in_frames={burn_in}",
                        *PBT_RULE,
                        f"--population_dir={{logdir_root}}/{kind}_population",
                        f"--population_size={PBT_MEMBERS}",
                        f"--population_member={k}",
                        f"--seed={k + 1}",
                        f"--total_environment_frames={frames or PBT_FRAMES}",
                    ),
                    group=kind,
                )
            )
    return arms


def pbt_table(records: list[dict]) -> str:
    """The PBT study: a row per arm (the evolving population, the same draws
    without evolution) with each member's test mean, the best and the
    median of them, the members' last-100 training means, and each member's
    evolutions and copies (its lineage in the record)."""
    import statistics

    rows = [
        "| arm | members' test means | best | median | training, last 100 "
        "| evolutions / copies |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for kind in ("pbt", "fixed"):
        members = sorted(
            (r for r in records if r.get("arm", "").startswith(f"{kind}_")),
            key=lambda r: r["arm"],
        )
        tests = [
            next(iter(r["test"]["levels"].values()))["mean_return"]
            for r in members
            if r.get("complete")
        ]
        if not tests:
            rows.append(f"| {kind} | - | - | - | - | - |")
            continue
        trained = ", ".join(f"{r.get('last_mean', 0):.2f}" for r in members)
        lineages = [r.get("population", {}).get("lineage", []) for r in members]
        evolved = ", ".join(
            f"{len(entries)} / {sum(e.get('copied_from') is not None for e in entries)}"
            for entries in lineages
        )
        rows.append(
            f"| {kind} | {', '.join(f'{t:.2f}' for t in tests)} | {max(tests):.2f} "
            f"| {statistics.median(tests):.2f} | {trained} | {evolved} |"
        )
    return "\n".join(rows)


def trajectories(population_dir: str) -> dict[int, dict]:
    """Per member: {"frames": [...], name: [...] for each evolving
    hyperparameter (population.json's priors), "copies": [(frames, from
    member)], "fitness": [(frames, fitness)]}: its values from its start
    (frame 0, the first evolution's `before`, or its record without one)
    through each evolution to its record's last frames, as steps; its
    fitness as each evolution measured it."""
    from pbt import records  # TensorFlow comes with it: only for this figure

    members = records.read_members(population_dir)
    lineage = records.read_lineage(population_dir)
    shared = records.read_json(f"{population_dir}/{records.POPULATION_FILE}") or {}
    evolving = [prior["name"] for prior in shared.get("priors", [])]
    result = {}
    for member, record in sorted(members.items()):
        events = sorted(
            (e for e in lineage if e["member"] == member), key=lambda e: e["frames"]
        )
        start = events[0]["before"] if events else record["hyperparameters"]
        points = [(0, dict(start))]
        copies = []
        for event in events:
            points.append((event["frames"], dict(event["after"])))
            if event.get("copied_from") is not None:
                copies.append((event["frames"], event["copied_from"]))
        points.append((record.get("frames", 0), dict(points[-1][1])))
        series = {
            "frames": [frames for frames, _ in points],
            "copies": copies,
            "fitness": [(e["frames"], e["fitness"]) for e in events],
        }
        for name in evolving or start:
            series[name] = [values[name] for _, values in points]
        result[member] = series
    return result


def study_curves(results_dir: str) -> dict[int, dict[str, list]]:
    """Per member k, the training curve of the PBT study's records of its
    arms (`pbt_arms`: `pbt_k`, `fixed_k`): {"pbt":
    [(frames, mean of the last 100 episodes)], "fixed": [...]}, each arm
    that has a record."""
    result: dict[int, dict[str, list]] = {}
    for arm in pbt_arms(None):
        record = load_record(os.path.join(results_dir, f"{arm.name}.json"))
        if record is None:
            continue
        result.setdefault(int(arm.flag("population_member")), {})[arm.group] = [
            (point["frames"], point["mean"])
            for point in record.get("curve", [])
            if point.get("mean") is not None
        ]
    return result


def draw(population_dir: str, out: str, study_results: str | None = None) -> None:
    plt = figures.require_pyplot()

    series = trajectories(population_dir)
    if not series:
        raise SystemExit(f"pbt_study.py: no member records in {population_dir}")
    names = [
        n
        for n in next(iter(series.values()))
        if n not in ("frames", "copies", "fitness")
    ]
    curves = study_curves(study_results) if study_results else {}
    top = 1 if curves else 0  # the training curves' panel, first
    panels = top + len(names) + 1
    figure, axes = plt.subplots(
        panels, 1, figsize=(8, 2.6 * panels), sharex=True, squeeze=False
    )
    if curves:
        ax = axes[0, 0]
        for member, arms in sorted(curves.items()):
            for kind, style in (("pbt", "-"), ("fixed", "--")):
                if arms.get(kind):
                    frames, means = zip(*arms[kind], strict=True)
                    ax.plot(
                        [f / 1e6 for f in frames],
                        means,
                        style,
                        color=f"C{member}",
                        label=f"{member} {'evolving' if kind == 'pbt' else 'fixed'}",
                    )
        ax.set_ylabel("mean return, last 100 training episodes", fontsize=8)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
    for ax, name in zip(axes[top:-1, 0], names, strict=True):
        for member, s in series.items():
            frames = [f / 1e6 for f in s["frames"]]
            (line,) = ax.step(
                frames,
                s[name],
                where="post",
                color=f"C{member}",
                label=f"member {member}",
            )
            for copy_frames, donor in s["copies"]:
                index = s["frames"].index(copy_frames)
                ax.annotate(
                    f"<{donor}",
                    (copy_frames / 1e6, s[name][index]),
                    color=line.get_color(),
                    fontsize=7,
                )
        ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    ax = axes[-1, 0]
    for member, s in series.items():
        if s["fitness"]:
            frames, fitness = zip(*s["fitness"], strict=True)
            ax.plot([f / 1e6 for f in frames], fitness, marker=".", color=f"C{member}")
    ax.set_ylabel("fitness at each evolution")
    ax.grid(alpha=0.3)
    axes[top, 0].legend(fontsize=7)
    axes[-1, 0].set_xlabel(figures.X_LABEL)
    figure.suptitle(
        "PBT: hyperparameters and fitness over frames "
        f"({os.path.basename(os.path.normpath(population_dir))})"
    )
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=110)
    print(f"Figure: {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--population_dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--study_results", default=None, help="the PBT study's records' folder"
    )
    args = parser.parse_args(argv)
    draw(args.population_dir, args.out, args.study_results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
