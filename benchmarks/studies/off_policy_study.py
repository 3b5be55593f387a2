"""The off-policy study (the paper's Table 2, docs/off-policy.md): each
task x each off-policy correction x {no replay, replay 0.5}, trained by the
study runner; its table in the paper's layout; its figure laid out as Table
2 compares: one axes per task and replay setting, the four corrections
overlaid on it, one y-scale per task (both replay settings share it), each
line's legend entry with its mean policy lag.

    python3 benchmarks/study.py off_policy \
        --results benchmarks/results/off_policy --logdir_root /tmp/off_policy
    python3 benchmarks/studies/off_policy_study.py \
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

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import figures  # noqa: E402
from benchmarks.studies.records import Arm, folder_records  # noqa: E402

# The off-policy study (the paper's Table 2, docs/off-policy.md): each task
# with its tested command, a frame budget and a replay capacity that fits a
# 24 GB machine (10,000 unrolls of Breakout's 80 steps would take 23 GB).
OFF_POLICY_TASKS = {
    "defend_the_center": (
        ("--flagfile=flagfiles/vizdoom_defend_the_center.cfg",),
        4_000_000,
        10_000,
    ),
    "breakout": (("--level_name=atari/breakout",), 8_000_000, 4_000),
}
OFF_POLICY_CORRECTIONS = (
    "vtrace",
    "no_correction",
    "epsilon_correction",
    "one_step_is",
)
OFF_POLICY_REPLAY = 0.5
# The paper's Table 2 (Espeholt et al. 2018, section 5.2.2): the average
# final return over the 3 best of 24 hyperparameter settings, on
# rooms_watermaze, rooms_keys_doors_puzzle, lasertag_three_opponents_small,
# explore_goal_locations_small and seekavoid_arena_01; keyed by correction
# and replay.
PAPER_TABLE_2 = {
    ("vtrace", False): (46.8, 32.9, 31.3, 229.2, 43.8),
    ("one_step_is", False): (51.8, 35.9, 25.4, 215.8, 43.7),
    ("epsilon_correction", False): (44.2, 27.3, 4.3, 107.7, 41.5),
    ("no_correction", False): (40.3, 29.1, 5.0, 94.9, 16.1),
    ("vtrace", True): (47.1, 35.8, 34.5, 250.8, 46.9),
    ("one_step_is", True): (54.7, 34.4, 26.4, 204.8, 41.6),
    ("epsilon_correction", True): (30.4, 30.2, 3.9, 101.5, 37.6),
    ("no_correction", True): (35.0, 21.1, 2.8, 85.0, 11.2),
}


def off_policy_arms(frames: int | None) -> list[Arm]:
    """Each task x each correction x {no replay, replay 0.5}, task by task,
    the replay arms after the others; `frames` replaces every budget."""
    arms = []
    for task, (flags, budget, capacity) in OFF_POLICY_TASKS.items():
        for replay in (False, True):
            for correction in OFF_POLICY_CORRECTIONS:
                replay_flags = (
                    (
                        f"--replay_proportion={OFF_POLICY_REPLAY}",
                        f"--replay_capacity={capacity}",
                    )
                    if replay
                    else ()
                )
                arms.append(
                    Arm(
                        f"{task}_{correction}{'_replay' if replay else ''}",
                        (
                            *flags,
                            f"--off_policy_correction={correction}",
                            *replay_flags,
                            f"--total_environment_frames={frames or budget}",
                        ),
                    )
                )
    return arms


# The PBT study (docs/pbt.md): a population of 4 on ViZDoom defend_the_center
# from the paper's priors, against the same 4 draws and seeds with evolution


def off_policy_table(records: list[dict]) -> str:
    """The off-policy study in the layout of the paper's Table 2: a row per
    correction and replay, a column per task; each cell the mean of the last
    100 training episodes, the test mean and the mean policy lag (fresh, and
    replayed with replay), '-' for an arm not run yet; the last column the
    paper's Table 2 for the same correction and replay."""
    by_arm = {record.get("arm"): record for record in records}
    rows = [
        "| correction | replay | "
        + " | ".join(f"{task}: last 100 / test / lag" for task in OFF_POLICY_TASKS)
        + " | the paper's Table 2, 5 DeepMind Lab tasks |",
        "| --- | --- |" + " --- |" * (len(OFF_POLICY_TASKS) + 1),
    ]
    for replay in (False, True):
        for correction in OFF_POLICY_CORRECTIONS:
            cells = [correction, f"{OFF_POLICY_REPLAY}" if replay else "none"]
            for task in OFF_POLICY_TASKS:
                record = by_arm.get(f"{task}_{correction}{'_replay' if replay else ''}")
                cells.append(_off_policy_cell(record))
            cells.append(" / ".join(f"{v}" for v in PAPER_TABLE_2[correction, replay]))
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _off_policy_cell(record: dict | None) -> str:
    if not record or not record.get("complete"):
        return "-"
    (result,) = record["test"]["levels"].values()
    lag = record.get("policy_lag") or {}
    lag_text = f"{lag['fresh']:.1f}" if lag else "?"
    if lag.get("replayed") is not None:
        lag_text += f" ({lag['replayed']:.0f})"
    return f"{record.get('last_mean'):.2f} / {result['mean_return']:.2f} / {lag_text}"


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
    study's order (its arms, `off_policy_arms`); records of no
    off-policy arm are left out."""
    by_name = {r.get("arm"): r for r in records}
    panels: dict[tuple[str, bool], list[tuple[str, dict]]] = {}
    for arm in off_policy_arms(None):
        if arm.name not in by_name:
            continue
        task = next(t for t in OFF_POLICY_TASKS if arm.name.startswith(t))
        replay = arm.flag("replay_proportion") is not None
        panels.setdefault((task, replay), []).append(
            (arm.flag("off_policy_correction"), by_name[arm.name])
        )
    return panels


def draw(records: list[dict], path: str):
    """The figure of `records` (the study's), written to `path`, and
    returned (closed: its axes can still be read)."""
    plt = figures.pyplot()
    if plt is None:
        return None
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
            ax.set_xlabel(figures.X_LABEL)
            if column == 0:
                ax.set_ylabel(f"mean return, last 100 training {unit}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    figure.suptitle("Off-policy corrections (the paper's Table 2), mean policy lag")
    figure.tight_layout()
    figures.save(figure, path, dpi=90)
    plt.close(figure)
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="benchmarks/results/off_policy")
    parser.add_argument("--out", default=None, help="default <results>/curves.png")
    args = parser.parse_args(argv)
    draw(
        folder_records(args.results),
        args.out or os.path.join(args.results, "curves.png"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
