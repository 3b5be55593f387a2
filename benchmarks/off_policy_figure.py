"""The off-policy study's figure, laid out as the paper's Table 2 compares:
one axes per task and replay setting, the four corrections overlaid on it,
one y-scale per task (both replay settings share it), each line's legend
entry with its mean policy lag.

    python3 benchmarks/off_policy_figure.py \
        --results benchmarks/results/off_policy \
        --out benchmarks/results/off_policy/curves.png

x: environment frames (millions); y: the mean return of the last 100
training episodes (whole games on Atari) at each curve point, as the study
runner records it. `benchmarks/study.py off_policy` draws this figure
itself.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import study  # noqa: E402

COLOURS = {
    "vtrace": "tab:blue",
    "one_step_is": "tab:orange",
    "epsilon_correction": "tab:green",
    "no_correction": "tab:red",
}
LABELS = {
    "vtrace": "V-trace",
    "one_step_is": "1-step IS",
    "epsilon_correction": "epsilon-correction",
    "no_correction": "no correction",
}


def layout(records: list[dict]) -> dict[tuple[str, bool], list[tuple[str, dict]]]:
    """(task, replay) -> that panel's (correction, record) pairs, in the
    study's order (its arms, `study.off_policy_arms`); records of no
    off-policy arm are left out."""
    by_name = {r.get("arm"): r for r in records}
    panels: dict[tuple[str, bool], list[tuple[str, dict]]] = {}
    for arm in study.off_policy_arms(None):
        if arm.name not in by_name:
            continue
        task = next(t for t in study.OFF_POLICY_TASKS if arm.name.startswith(t))
        replay = arm.flag("replay_proportion") is not None
        panels.setdefault((task, replay), []).append(
            (arm.flag("off_policy_correction"), by_name[arm.name])
        )
    return panels


def draw(records: list[dict], path: str):
    """The figure of `records` (the study's), written to `path`, and
    returned (closed: its axes can still be read)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = layout(records)
    tasks = list(dict.fromkeys(task for task, _ in panels))
    figure, axes = plt.subplots(
        len(tasks), 2, figsize=(11, 3.6 * len(tasks)), squeeze=False, sharey="row"
    )
    for row, task in enumerate(tasks):
        for column, replay in enumerate((False, True)):
            ax = axes[row][column]
            drawn = panels.get((task, replay), [])
            for correction, record in drawn:
                points = [p for p in record["curve"] if p.get("mean") is not None]
                lag = record.get("policy_lag") or {}
                lag_text = f"lag {lag['fresh']:.0f}" if lag.get("fresh") else ""
                if lag.get("replayed"):
                    lag_text += f", replayed {lag['replayed']:.0f}"
                ax.plot(
                    [p["frames"] / 1e6 for p in points],
                    [p["mean"] for p in points],
                    color=COLOURS[correction],
                    lw=1.5,
                    label=f"{LABELS[correction]} ({lag_text} updates)",
                )
            unit = (
                "games" if drawn and drawn[0][1].get("unit") == "game" else "episodes"
            )
            ax.set_title(f"{task}, {'replay 0.5' if replay else 'no replay'}")
            ax.set_xlabel("environment frames (M)")
            if column == 0:
                ax.set_ylabel(f"mean return, last 100 training {unit}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    figure.suptitle("Off-policy corrections (the paper's Table 2), mean policy lag")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="benchmarks/results/off_policy")
    parser.add_argument("--out", default=None, help="default <results>/curves.png")
    args = parser.parse_args(argv)
    names = sorted(n for n in os.listdir(args.results) if n.endswith(".json"))
    records = [study.load_record(os.path.join(args.results, n)) for n in names]
    draw(
        [r for r in records if r], args.out or os.path.join(args.results, "curves.png")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
