"""A study's arms and records (benchmarks/study.py runs them): an arm is a
name and experiment.py flags; its record, `<results>/<arm>.json`, is
written whole as the arm trains (the runner's docstring lists its fields)
and read back here for tables and figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Arm:
    """One run of a study: its name (the record's file name) and the
    experiment.py flags it trains with (never --logdir: the runner's)."""

    name: str
    flags: tuple[str, ...]
    # Arms of one group train at the same time (a population's members),
    # each in a study process of its own; "" trains alone, in order.
    group: str = ""

    def flag(self, name: str) -> str | None:
        """The value of --name in the arm's flags, or None."""
        for text in self.flags:
            if text.startswith(f"--{name}="):
                return text.split("=", 1)[1]
        return None


class StudyError(Exception):
    """A refusal: one line for the user, exit 2."""


def load_record(path: str) -> dict | None:
    """The record at `path`, None if absent; a file that is not a whole
    JSON object is a StudyError naming it (nothing is deleted)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise StudyError(
            f"{path}: not a study record ({e}); move it away (it is left as "
            "it is) and run the study again to retrain that arm."
        ) from None
    return record


def level_score(level: str, returns) -> float | None:
    """The human-normalised score of a level's test returns, None for a
    level without published scores."""
    from families import atari57

    try:
        return atari57.human_normalized_score(level, returns)
    except ValueError:
        return None


def folder_records(folder: str) -> list[dict]:
    """Every record of a study's results folder, by file name."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    return [load_record(os.path.join(folder, n)) for n in names]


def write_record(path: str, record: dict) -> None:
    """Writes `record` whole: a temporary file renamed over `path`, so a
    kill never leaves half a record."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(temporary, path)


def check_resumable(path: str, record: dict, commit: str, command: str) -> None:
    """Refuses (StudyError) to continue a record that another commit or
    another command started."""
    if record.get("commit") != commit:
        raise StudyError(
            f"{path}: an incomplete record of commit {record.get('commit')}, "
            f"but this code is commit {commit}; finish it from a worktree of "
            f"that commit (git worktree add DIR {record.get('commit')}) or "
            "move the file away; nothing was overwritten."
        )
    if record.get("command") != command:
        raise StudyError(
            f"{path}: an incomplete record of `{record.get('command')}`, but "
            f"this arm's command is `{command}`; move the file away to train "
            "the arm anew; nothing was overwritten."
        )


def training_done(record: dict) -> bool:
    """Whether a record's training reached its frame target."""
    target = record.get("frames_target")
    return bool(target) and record.get("frames", 0) >= target


def in_study_order(records: list[dict], arms: list[Arm]) -> list[dict]:
    """`records` in the order of the study's arms (all of them, not only
    those --only runs now), then records of no arm here by name."""
    order = {a.name: i for i, a in enumerate(arms)}
    return sorted(
        records, key=lambda r: (order.get(r.get("arm"), len(order)), r.get("arm", ""))
    )


def markdown_table(records: list[dict]) -> str:
    """A row per record: frames and minutes trained, the mean of the last
    100 training games (episodes where the log has no games), the test
    mean over its episodes with their range, and the human-normalised test
    score where the level has one."""
    rows = [
        "| arm | frames | minutes | training, last 100 | test (episodes, range) "
        "| human-normalised |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for record in records:
        curve = record.get("curve") or [{}]
        unit = "games" if record.get("unit") == "game" else "episodes"
        cells = [
            record.get("arm", "?"),
            f"{record.get('frames', 0) / 1e6:.1f} M",
            f"{curve[-1].get('minutes', 0):.0f}",
            f"{record.get('last_mean')} ({unit})",
        ]
        levels = record.get("test", {}).get("levels", {})
        if levels:
            (result,) = levels.values()
            returns = result["returns"]
            cells.append(
                f"{result['mean_return']:.1f} ({len(returns)}, "
                f"{min(returns):g} to {max(returns):g})"
            )
            score = result.get("human_normalized")
            cells.append("-" if score is None else f"{score:.1f} %")
        else:
            cells += ["not tested", "-"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


@dataclasses.dataclass(frozen=True)
class Study:
    """What the runner needs of a study: its arms for a frame budget (None:
    the study's own), its Markdown table of records, and its figure (None:
    a panel per arm, benchmarks/core/figures.py)."""

    arms: Callable[[int | None], list[Arm]]
    table: Callable[[list[dict]], str] = markdown_table
    figure: Callable[[list[dict], str], object] | None = None
