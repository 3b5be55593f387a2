"""The Atari suites' studies for the study runner (benchmarks/study.py):
Atari-5 and its validation sets, one expert a game with Atari's default
command, and the tuning study of Atari's default on Atari-3-Val; each
suite's estimate of the 57-game median (families/atari57.py) in the tables;
the figure that overlays folders of records (a baseline and a new default)
game by game:

    python3 benchmarks/studies/atari_study.py benchmarks/results/atari5 \
        benchmarks/results/atari5_new --out benchmarks/plots/atari5.png

    python3 benchmarks/study.py atari3_val_tuning \
        --results benchmarks/results/atari3_val_tuning \
        --logdir_root /tmp/tuning --test_episodes 10
    python3 benchmarks/study.py atari3_val_tuning \
        --results benchmarks/results/atari3_val_tuning \
        --logdir_root /tmp/tuning --table

The tuning study chooses by the Atari-3-Val estimate and never trains on an
Atari-5 game (Aitchison et al.: tune on the validation set, report on the
test set). It is staged so that no arm is wasted: replay first, at the
capacity the default would use; the learning rate, the batch x unroll
layout and the entropy cost then around the replay winner.
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
from benchmarks.studies.records import (  # noqa: E402
    Arm,
    folder_records,
    level_score,
    markdown_table,
)

ATARI5_FRAMES = 40_000_000
TUNING_FRAMES = 10_000_000
TUNING_SUITE = "atari3_val"
# An arm of the tuning study is named '<configuration>.<game>'.
SEPARATOR = "."
# The replay capacity every replay arm uses: the paper's 10,000 unrolls,
# the capacity a replaying default would ship with.
TUNING_REPLAY_CAPACITY = 10_000
# Stage 1: replay, everything else Atari's default. Configuration name ->
# the flags it adds to the level and the budget.
TUNING_CONFIGS: dict[str, tuple[str, ...]] = {
    "replay0": (),
    "replay050": (
        "--replay_proportion=0.5",
        f"--replay_capacity={TUNING_REPLAY_CAPACITY}",
    ),
    "replay075": (
        "--replay_proportion=0.75",
        f"--replay_capacity={TUNING_REPLAY_CAPACITY}",
    ),
}
# Stage 2: one change at a time around stage 1's winner (the replay setting
# with the best Atari-3-Val estimate), each named '<winner>_<change>'. The
# feed-forward agent first: the usual network for stacked Atari frames
# (DQN's, PPO's), and a third less learner time a step here, which every
# later arm and the Atari-5 runs would be paid in.
TUNING_STAGE1_WINNER = "replay075"
TUNING_STAGE2_CHANGES: dict[str, tuple[str, ...]] = {
    "nolstm": ("--use_lstm=false",),
}
TUNING_CONFIGS.update(
    {
        f"{TUNING_STAGE1_WINNER}_{change}": (
            *TUNING_CONFIGS[TUNING_STAGE1_WINNER],
            *flags,
        )
        for change, flags in TUNING_STAGE2_CHANGES.items()
    }
)


def suite_arms(suite: str, frames: int | None) -> list[Arm]:
    """One expert a game of an Atari suite, Atari's default command (the
    level flag alone) with the frame budget (ATARI5_FRAMES by default)."""
    from families import atari57

    return [
        Arm(
            game,
            (
                f"--level_name=atari/{game}",
                f"--total_environment_frames={frames or ATARI5_FRAMES}",
            ),
        )
        for game in atari57.SUBSETS[suite]
    ]


def tuning_arms(frames: int | None) -> list[Arm]:
    """Each configuration x each Atari-3-Val game, configurations in order,
    named '<configuration>.<game>'."""
    return [
        Arm(f"{config}{SEPARATOR}{arm.name}", (*arm.flags, *extra))
        for config, extra in TUNING_CONFIGS.items()
        for arm in suite_arms(TUNING_SUITE, frames or TUNING_FRAMES)
    ]


def _game(record: dict) -> tuple[str, float | None]:
    """(game, test human-normalised score) of a one-game record."""
    levels = record.get("test", {}).get("levels", {})
    if len(levels) != 1:
        return record.get("arm", "?").split(SEPARATOR)[-1], None
    ((level, result),) = levels.items()
    # From the returns: the record's score is rounded to 0.01.
    score = level_score(level, result["returns"]) if "returns" in result else None
    if score is None:
        score = result.get("human_normalized")
    return level.split("/")[-1], score


def suite_estimate_line(suite: str, records: list[dict]) -> str | None:
    """'Atari-5 estimate of the 57-game median: 41.2 % (stated error
    10.4 %)' from one-game records covering the suite's games; None when a
    game has no test score."""
    from families import atari57

    scores = {}
    for record in records:
        game, score = _game(record)
        if score is not None:
            scores[game] = score
    if any(game not in scores for game in atari57.SUBSETS[suite]):
        return None
    estimate = atari57.median57_estimate(suite, scores)
    return (
        f"{suite} estimate of the 57-game median: {estimate:.1f} % "
        f"(stated error {atari57.SUBSET_ERROR_PERCENT[suite]} %)"
    )


def tuning_table(records: list[dict]) -> str:
    """A row per configuration: each Atari-3-Val game's test mean and
    human-normalised score, and the configuration's Atari-3-Val estimate of
    the 57-game median ('-' until every game is tested)."""
    from families import atari57

    games = atari57.SUBSETS[TUNING_SUITE]
    by_config: dict[str, dict[str, dict]] = {}
    for record in records:
        config, _, game = record.get("arm", "").partition(SEPARATOR)
        by_config.setdefault(config, {})[game] = record
    rows = [
        "| configuration | " + " | ".join(games) + " | Atari-3-Val estimate |",
        "| --- | " + " | ".join("---:" for _ in games) + " | ---: |",
    ]
    for config, found in by_config.items():
        cells, scores = [], {}
        for game in games:
            record = found.get(game)
            score = None if record is None else _game(record)[1]
            if score is None:
                cells.append("-")
                continue
            scores[game] = score
            (result,) = record["test"]["levels"].values()
            cells.append(f"{result['mean_return']:,.0f} ({score:.1f} %)")
        estimate = (
            f"{atari57.median57_estimate(TUNING_SUITE, scores):.1f} %"
            if len(scores) == len(games)
            else "-"
        )
        rows.append(f"| {config} | " + " | ".join(cells) + f" | {estimate} |")
    return "\n".join(rows)


def suite_table(suite: str, records: list[dict]) -> str:
    """The records' table and the suite's estimate of the 57-game median."""
    line = suite_estimate_line(suite, records)
    return (
        markdown_table(records)
        + "\n"
        + (line or f"No {suite} estimate: a game is untested.")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Atari suites' records of several folders overlaid, a panel "
        "a game, and each folder's suite estimate."
    )
    parser.add_argument(
        "folders",
        nargs="+",
        help="results folders, e.g. a baseline's and a new default's",
    )
    parser.add_argument("--suite", default="atari5")
    parser.add_argument("--out", required=True, help="the figure's PNG")
    args = parser.parse_args(argv)
    found = {}
    for folder in args.folders:
        records = folder_records(folder)
        label = os.path.basename(os.path.normpath(folder))
        line = suite_estimate_line(args.suite, records)
        estimate = line.split(": ")[1].split(" (")[0] if line else "untested"
        print(f"{label}: {line or 'a game is untested'}")
        found[f"{label} ({args.suite} estimate {estimate})"] = records
    figures.overlay_figure(
        found,
        args.out,
        f"{args.suite}: "
        + " against ".join(os.path.basename(os.path.normpath(f)) for f in args.folders),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
