"""The figure of a population: each evolving hyperparameter of each member
over frames, drawn from the population's records and lineage (pbt/), with
each copy marked (from which member), and each member's fitness at each of
its evolutions; with --study_results (the PBT study's records), each
member's training curve above them beside its twin's with evolution off.

    python3 benchmarks/pbt_figure.py --population_dir /tmp/population \
        --out benchmarks/plots/pbt.png

Needs matplotlib (benchmarks/requirements.txt).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402, F401  (puts the repository on the path)

from pbt import records  # noqa: E402


def trajectories(population_dir: str) -> dict[int, dict]:
    """Per member: {"frames": [...], name: [...] for each evolving
    hyperparameter (population.json's priors), "copies": [(frames, from
    member)], "fitness": [(frames, fitness)]}: its values from its start
    (frame 0, the first evolution's `before`, or its record without one)
    through each evolution to its record's last frames, as steps; its
    fitness as each evolution measured it."""
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
    arms (benchmarks/study.py's `pbt_arms`: `pbt_k`, `fixed_k`): {"pbt":
    [(frames, mean of the last 100 episodes)], "fixed": [...]}, each arm
    that has a record."""
    import study

    result: dict[int, dict[str, list]] = {}
    for arm in study.pbt_arms(None):
        record = study.load_record(os.path.join(results_dir, f"{arm.name}.json"))
        if record is None:
            continue
        result.setdefault(int(arm.flag("population_member")), {})[arm.group] = [
            (point["frames"], point["mean"])
            for point in record.get("curve", [])
            if point.get("mean") is not None
        ]
    return result


def draw(population_dir: str, out: str, study_results: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = trajectories(population_dir)
    if not series:
        raise SystemExit(f"pbt_figure.py: no member records in {population_dir}")
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
        ax.set_ylabel("training, last 100")
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
    axes[-1, 0].set_xlabel("frames (M)")
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
