"""The figure of a population: each evolving hyperparameter of each member
over frames, drawn from the population's records and lineage (pbt/), with
each copy marked (from which member), and each member's fitness at each of
its evolutions.

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
    hyperparameter (population.json's priors),
    "copies": [(frames, from member)], "fitness": [(frames, fitness)]}: its
    values from its start (frame 0,
    the first evolution's `before`, or its record without one) through each
    evolution to its record's last frames, as steps; its fitness as each
    evolution measured it."""
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


def draw(population_dir: str, out: str) -> None:
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
    figure, axes = plt.subplots(
        len(names) + 1,
        1,
        figsize=(8, 2.6 * (len(names) + 1)),
        sharex=True,
        squeeze=False,
    )
    for ax, name in zip(axes[:-1, 0], names, strict=True):
        for member, s in series.items():
            frames = [f / 1e6 for f in s["frames"]]
            (line,) = ax.step(frames, s[name], where="post", label=f"member {member}")
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
            ax.plot([f / 1e6 for f in frames], fitness, marker=".", label=f"{member}")
    ax.set_ylabel("fitness at each evolution")
    ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
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
    args = parser.parse_args(argv)
    draw(args.population_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
