r"""The study runner: arms (experiment.py command lines) trained one after
another, each to its frame budget, then tested; a record per arm written as
it goes; resumable; one figure of the curves.

    python3 benchmarks/study.py atari5 \
        --results benchmarks/results/atari5 --logdir_root /tmp/atari5

Every study here goes through this tool (Atari-5, the off-policy study, the
PBT comparison): a study is a name in STUDIES that gives its arms (`atari5`,
`atari3`, `atari3_val`, `atari5_val` and the tuning study `atari3_val_tuning`,
from atari_suites.py; `off_policy`: each task x each correction x {no replay,
replay 0.5}; `pbt`), or arms given with --arm 'NAME: FLAGS' (repeatable).
For each arm, in order:

* `<results>/<arm>.json` complete (trained to its budget and tested): the
  arm is skipped, whichever commit made it (a result is never overwritten).
* absent, or incomplete from this commit with the same command: the arm
  trains (`train_until.train`: experiment.py as a child, its log read as
  it is written) with --logdir=<logdir_root>/<arm>, so an arm stopped
  part-way (SIGINT or SIGTERM to this script, or --minutes) continues from
  its last checkpoint when the same command is run again, its curve kept.
  Then test mode plays --test_episodes games with the final checkpoint.
* incomplete from another commit, or with another command: one line naming
  the file, both commits (or commands) and the fix; exit 2, nothing written.

The record: the arm's training and test commands, the code's commit, the
machine, the date, the curve (frames, minutes, mean of the last 100
training episodes and the episode count every --point_minutes minutes,
with the machine's load beside the run at that point: the load average and
the cores that processes other than the run's used), how each training
segment ended, the test results (each episode's return and length, their
mean, the human-normalised score where the level has published scores),
the settings of the run's own record, its mean policy lag and --beside (a
free note of what else ran). The figure (--figure, default
<results>/curves.png) draws each record's curve in a panel of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import atari_suites  # noqa: E402
import common  # noqa: E402
import train_until  # noqa: E402

ATARI5_FRAMES = atari_suites.ATARI5_FRAMES


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


def atari_suite_arms(suite: str, frames: int) -> list[Arm]:
    """One expert a game of an Atari suite, Atari's default command (the
    level flag alone) with the frame budget."""
    return [Arm(name, flags) for name, flags in atari_suites.suite_arms(suite, frames)]


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
# off (burn-in beyond the budget), at an equal total budget; the burn-in and
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


STUDIES = {
    "atari5": lambda frames: atari_suite_arms("atari5", frames or ATARI5_FRAMES),
    "atari3_val": lambda frames: atari_suite_arms(
        "atari3_val", frames or ATARI5_FRAMES
    ),
    "atari3": lambda frames: atari_suite_arms("atari3", frames or ATARI5_FRAMES),
    "atari5_val": lambda frames: atari_suite_arms(
        "atari5_val", frames or ATARI5_FRAMES
    ),
    "atari3_val_tuning": lambda frames: [
        Arm(name, flags) for name, flags in atari_suites.tuning_arms(frames)
    ],
    "off_policy": off_policy_arms,
    "pbt": pbt_arms,
}


class StudyError(Exception):
    """A refusal: one line for the user, exit 2."""


# -- the code and the machine's load ----------------------------------------------


def code_commit(repo: str = common.REPO) -> dict:
    """The commit of the code that runs (HEAD of `repo`), and its code files
    that differ from it (uncommitted changes, new files included)."""
    from runtime import run_record

    commit, changed = run_record.git_state(repo, untracked=True)
    return {
        "commit": commit or "unknown",
        "uncommitted_code": [path for path in changed if common._is_code(path)],
    }


def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def _tree_jiffies(pid: int) -> int:
    """CPU time (utime + stime, and that of waited-for children) of `pid`
    and its descendants."""
    total, pending = 0, [pid]
    while pending:
        p = pending.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])
        except (OSError, IndexError):
            continue
        pending.extend(common.children(p))
    return total


class LoadMeter:
    """The load beside a run: between two calls of `sample`, the cores that
    processes outside the run's process tree kept busy."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.last: tuple[float, int, int] | None = None

    def sample(self) -> dict:
        now = time.time()
        busy = _busy_jiffies()
        mine = _tree_jiffies(self.pid) if self.pid else 0
        result = {"load_average": round(os.getloadavg()[0], 2)}
        if self.pid and not mine:
            # The run has ended: its CPU time can no longer be told apart.
            self.last = None
            return result
        if self.last is not None and now > self.last[0]:
            seconds = now - self.last[0]
            others = (busy - self.last[1]) - max(0, mine - self.last[2])
            result["cores_beside"] = round(
                max(0.0, others / common.CLK_TCK / seconds), 2
            )
        self.last = (now, busy, mine)
        return result


# -- records ----------------------------------------------------------------------


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


# -- one arm ----------------------------------------------------------------------


@dataclasses.dataclass
class Options:
    results: str
    logdir_root: str
    test_episodes: int = 30
    point_minutes: float = 3.0
    minutes: float | None = None
    beside: str = ""
    program: str = os.path.join(common.REPO, "experiment.py")


def _expanded(arm: Arm, logdir: str) -> list[str]:
    """The arm's flags, "{logdir_root}" made the folder of its `logdir`."""
    root = os.path.dirname(logdir)
    return [f.replace("{logdir_root}", root) for f in arm.flags]


def train_command(arm: Arm, logdir: str) -> list[str]:
    return [*_expanded(arm, logdir), f"--logdir={logdir}"]


def test_command(arm: Arm, logdir: str, episodes: int) -> list[str]:
    """Test mode on the arm's levels with its agent flags (the training-only
    flags left out), the final checkpoint of `logdir`."""
    kept = [
        f
        for f in _expanded(arm, logdir)
        if not f.startswith("--total_environment_frames=")
    ]
    return [
        *kept,
        "--mode=test",
        f"--test_num_episodes={episodes}",
        f"--logdir={logdir}",
    ]


def _command_text(flags: list[str]) -> str:
    return " ".join(["python3 experiment.py", *map(shlex.quote, flags)])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_arm(arm: Arm, options: Options, commit: dict) -> dict:
    """Trains and tests one arm (see the module's docstring); returns its
    record."""
    path = os.path.join(options.results, f"{arm.name}.json")
    logdir = os.path.join(options.logdir_root, arm.name)
    train_flags = train_command(arm, logdir)
    command = _command_text(train_flags)
    record = load_record(path)
    if record is not None and record.get("complete"):
        print(f"{arm.name}: complete ({path}, commit {record.get('commit')}); skipped.")
        return record
    if record is not None:
        check_resumable(path, record, commit["commit"], command)
    else:
        target = arm.flag("total_environment_frames")
        record = {
            "arm": arm.name,
            "command": command,
            "test_command": _command_text(
                test_command(arm, logdir, options.test_episodes)
            ),
            "commit": commit["commit"],
            "uncommitted_code": commit["uncommitted_code"],
            "machine": common.machine_info(),
            "frames_target": int(target) if target else None,
            "frames": 0,
            "curve": [],
            "segments": [],
            "beside": [],
            "complete": False,
        }
    if options.beside:
        record["beside"].append({"from": _now(), "note": options.beside})
    os.makedirs(options.logdir_root, exist_ok=True)

    if record["frames"] and not _has_checkpoint(logdir):
        # The run's logdir is gone (another machine, a cleaned /tmp): the
        # arm trains anew, and its record says so.
        record.update(frames=0, curve=[], episodes=0)
        record["segments"].append({"started": _now(), "how": f"{logdir} lost: anew"})
    if not training_done(record):
        _train(arm, record, path, logdir, train_flags, options)
        if not training_done(record):
            return record
    if "test" not in record:
        _test(arm, record, path, logdir, options)
    record["complete"] = "test" in record
    write_record(path, record)
    return record


def _train(arm, record, path, logdir, train_flags, options) -> None:
    earlier = list(record["curve"])
    minutes_before = earlier[-1]["minutes"] if earlier else 0.0
    curve = train_until.Curve(100, [])
    meter = LoadMeter()
    segment = {"started": _now(), "ended": None, "how": None}
    record["segments"].append(segment)

    def update(seconds: float) -> None:
        if curve.points and not curve.points[-1].get("load"):
            curve.points[-1]["minutes"] = round(
                minutes_before + curve.points[-1]["minutes"], 1
            )
            curve.points[-1]["load"] = meter.sample()
        record["curve"] = earlier + curve.points
        record["frames"] = max(record.get("frames", 0), curve.frames)
        record["episodes"] = record.get("episodes_before", 0) + curve.episodes
        record["games"] = record.get("games_before", 0) + curve.games
        record["unit"] = curve.unit
        record["last_mean"] = curve.record()["last_mean"]
        write_record(path, record)

    record["episodes_before"] = record.get("episodes", 0)
    record["games_before"] = record.get("games", 0)
    write_record(path, record)
    log_path = os.path.join(options.logdir_root, f"{arm.name}.log")

    def started(child) -> None:
        meter.pid = child.pid
        meter.sample()

    how, returncode, _ = train_until.train(
        train_flags,
        log_path,
        curve,
        minutes=options.minutes,
        program=options.program,
        point_secs=options.point_minutes * 60,
        on_update=update,
        on_start=started,
    )
    # experiment.py's last line gives its final frame count ("Training
    # done", or the checkpoint written at a stop); the last progress line
    # may be from a little before it.
    curve.frames = max(curve.frames, _final_frames(log_path))
    curve.points[-1]["frames"] = curve.frames
    if lag := _policy_lag(log_path):
        record["policy_lag"] = lag
    if settings := _run_settings(logdir):
        record["settings"] = settings
        if population := _population_record(settings):
            record["population"] = population
    update(0.0)
    segment.update(ended=_now(), how=how, exit_status=returncode)
    write_record(path, record)


def _has_checkpoint(logdir: str) -> bool:
    return os.path.exists(os.path.join(logdir, "checkpoint"))


def _final_frames(log_path: str) -> int:
    import re

    frames = 0
    with open(log_path, errors="replace") as f:
        for line in f:
            if m := re.search(r"Training done: (\d+) environment frames", line):
                frames = int(m.group(1))
    return frames


def _policy_lag(log_path: str) -> dict | None:
    """The last training session's mean policy lag in updates, from its
    `Training done` line: {"fresh": x, "replayed": y or None}; None without
    one (a stopped segment)."""
    import re

    lag = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if m := re.search(
                r"mean policy lag ([\d.]+) updates(?: \(replayed ([\d.]+)\))?", line
            ):
                replayed = float(m.group(2)) if m.group(2) else None
                lag = {"fresh": float(m.group(1)), "replayed": replayed}
    return lag


def _run_settings(logdir: str) -> dict | None:
    """{setting: value} of the arm's run record (runtime/run_record.py), the
    settings it trained with; None without one."""
    try:
        with open(os.path.join(logdir, "run_record.json")) as f:
            settings = json.load(f)["settings"]
    except (OSError, ValueError, KeyError):
        return None
    return {name: entry["value"] for name, entry in sorted(settings.items())}


def _population_record(settings: dict) -> dict | None:
    """A population member's record and its evolutions (pbt/records.py),
    so that the study's record keeps them; None for a run of no population."""
    directory = settings.get("population_dir")
    if not directory:
        return None
    from pbt import records

    member = settings["population_member"]
    return {
        "member": records.read_member(directory, member),
        "lineage": [
            e for e in records.read_lineage(directory) if e["member"] == member
        ],
    }


def _test(arm, record, path, logdir, options) -> None:
    flags = test_command(arm, logdir, options.test_episodes)
    log_path = os.path.join(options.logdir_root, f"{arm.name}.test.log")
    start = time.time()
    with open(log_path, "w") as log:
        status = subprocess.run(
            [sys.executable, options.program, *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
        ).returncode
    if status != 0:
        raise StudyError(
            f"{arm.name}: test mode exited {status}; its log is {log_path}. "
            "Training is complete in its record; run the study again to retry "
            "the test."
        )
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    levels = {}
    for level, result in results["levels"].items():
        entry = dict(result, episodes=len(result["returns"]))
        score = _level_score(level, result["returns"])
        if score is not None:
            entry["human_normalized"] = round(score, 2)
        levels[level] = entry
    record["test"] = {
        "date": _now(),
        "minutes": round((time.time() - start) / 60, 1),
        "checkpoint": os.path.basename(results["checkpoint"]),
        "levels": levels,
    }


def _level_score(level: str, returns) -> float | None:
    from families import atari57

    try:
        return atari57.human_normalized_score(level, returns)
    except ValueError:
        return None


# -- the figure -------------------------------------------------------------------


def in_study_order(records: list[dict], arms: list[Arm]) -> list[dict]:
    """`records` in the order of the study's arms (all of them, not only
    those --only runs now), then records of no arm here by name."""
    order = {a.name: i for i, a in enumerate(arms)}
    return sorted(
        records, key=lambda r: (order.get(r.get("arm"), len(order)), r.get("arm", ""))
    )


def draw_figure(records: list[dict], path: str, title: str) -> None:
    """Each record's curve (mean of the last 100 training episodes against
    frames) in a panel of its own; the off-policy study's in
    off_policy_figure's layout. Needs matplotlib (requirements.txt); without
    it, says so and draws nothing."""
    try:
        import matplotlib
    except ImportError:
        print("No figure: matplotlib is not installed (requirements.txt).")
        return

    if title == "off_policy":
        import off_policy_figure  # the corrections overlaid, a panel a task

        off_policy_figure.draw(records, path)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in records if r.get("curve")]
    if not records:
        return
    columns = min(len(records), 3)
    rows = -(-len(records) // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False
    )
    for ax in axes.flat[len(records) :]:
        ax.axis("off")
    for ax, record in zip(axes.flat, records, strict=False):
        points = [p for p in record["curve"] if p.get("mean") is not None]
        ax.plot(
            [p["frames"] / 1e6 for p in points], [p["mean"] for p in points], lw=1.5
        )
        test = record.get("test", {}).get("levels", {})
        for result in test.values():
            ax.axhline(result["mean_return"], ls="--", lw=1, color="gray")
        ax.set_title(record["arm"])
        ax.set_xlabel("frames (M)")
        unit = "games" if record.get("unit") == "game" else "episodes"
        ax.set_ylabel(f"mean return, last 100 {unit}")
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"Figure: {path}")


# -- the table ----------------------------------------------------------------------


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


# -- arms that train together --------------------------------------------------------


def _batches(arms: list[Arm]) -> list[list[Arm]]:
    """The arms in order, the consecutive arms of one group together."""
    batches: list[list[Arm]] = []
    for arm in arms:
        if arm.group and batches and batches[-1][0].group == arm.group:
            batches[-1].append(arm)
        else:
            batches.append([arm])
    return batches


def run_together(arms: list[Arm], args) -> list[dict]:
    """Trains and tests `arms` at the same time: a study process each
    (`--only` the arm, the same options), so that each arm is run, recorded
    and continued as any other. A SIGINT or SIGTERM here goes to each.
    Returns their records."""
    passed = [
        f"--results={args.results}",
        f"--logdir_root={args.logdir_root}",
        f"--test_episodes={args.test_episodes}",
        f"--point_minutes={args.point_minutes}",
        f"--program={args.program}",
        "--no_figure",
    ]
    passed += [f"--frames={args.frames}"] if args.frames else []
    passed += [f"--minutes={args.minutes}"] if args.minutes else []
    passed += [f"--beside={args.beside}"] if args.beside else []
    children = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), args.study, "--only", a.name]
            + passed
        )
        for a in arms
    ]

    def forward(signum, _frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {
        signum: signal.signal(signum, forward)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        codes = [child.wait() for child in children]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if 2 in codes:
        raise StudyError(
            f"an arm of group {arms[0].group} was refused (its line above); "
            "nothing else was changed."
        )
    return [
        load_record(os.path.join(args.results, f"{a.name}.json"))
        or {"arm": a.name, "complete": False}
        for a in arms
    ]


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


# -- the command line -------------------------------------------------------------


def parse_arm(text: str) -> Arm:
    name, _, flags = text.partition(":")
    name = name.strip()
    if not name or not flags.strip() or "/" in name:
        raise StudyError(
            f"--arm={text!r}: give 'NAME: FLAGS', e.g. 'pong_lr2: "
            "--level_name=atari/pong --learning_rate=0.0016'."
        )
    parsed = tuple(shlex.split(flags))
    if any(f.startswith("--logdir=") for f in parsed):
        raise StudyError(
            f"--arm={text!r}: leave --logdir out; each arm trains in "
            "<--logdir_root>/<NAME>."
        )
    return Arm(name, parsed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", nargs="?", help=f"one of {', '.join(STUDIES)}")
    parser.add_argument("--arm", action="append", default=[], help="'NAME: FLAGS'")
    parser.add_argument("--only", default="", help="these arms (comma-separated)")
    parser.add_argument("--results", required=True, help="the records' folder")
    parser.add_argument("--logdir_root", required=True, help="arms' logdirs")
    parser.add_argument("--frames", type=int, default=None, help="frames an arm")
    parser.add_argument("--test_episodes", type=int, default=30)
    parser.add_argument("--point_minutes", type=float, default=3.0)
    parser.add_argument("--minutes", type=float, default=None, help="per arm")
    parser.add_argument("--beside", default="", help="what else runs (a note)")
    parser.add_argument("--figure", default=None)
    parser.add_argument(
        "--no_figure",
        action="store_true",
        help="draw no figure (a study process of arms that train together)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="print the records' Markdown table and exit (nothing trains)",
    )
    parser.add_argument("--program", default=os.path.join(common.REPO, "experiment.py"))
    args = parser.parse_args(argv)
    try:
        arms = [parse_arm(text) for text in args.arm]
        if args.study is not None:
            if args.study not in STUDIES:
                raise StudyError(
                    f"Unknown study {args.study!r}: one of {', '.join(STUDIES)}, "
                    "or give the arms with --arm 'NAME: FLAGS'."
                )
            arms = STUDIES[args.study](args.frames) + arms
        elif args.frames:
            arms = [
                Arm(a.name, (*a.flags, f"--total_environment_frames={args.frames}"))
                for a in arms
            ]
        if not arms:
            raise StudyError("No arms: name a study or give --arm 'NAME: FLAGS'.")
        if args.table:
            found = [
                load_record(os.path.join(args.results, f"{arm.name}.json"))
                for arm in arms
            ]
            found = [r for r in found if r is not None]
            if args.study == "off_policy":
                print(off_policy_table(found))
            elif args.study == "pbt":
                print(pbt_table(found))
            elif args.study == "atari3_val_tuning":
                print(atari_suites.tuning_table(found))
            else:
                print(markdown_table(found))
                if args.study in ("atari5", "atari3", "atari3_val", "atari5_val"):
                    line = atari_suites.suite_estimate_line(args.study, found)
                    print(line or f"No {args.study} estimate: a game is untested.")
            return 0
        study_arms = list(arms)  # the figure's order, whichever arms run now
        if args.only:
            wanted = args.only.split(",")
            unknown = [w for w in wanted if w not in {a.name for a in arms}]
            if unknown:
                raise StudyError(
                    f"--only={args.only}: no arm {', '.join(unknown)}; the arms "
                    f"are {', '.join(a.name for a in arms)}."
                )
            arms = [a for a in arms if a.name in wanted]
        options = Options(
            results=args.results,
            logdir_root=args.logdir_root,
            test_episodes=args.test_episodes,
            point_minutes=args.point_minutes,
            minutes=args.minutes,
            beside=args.beside,
            program=args.program,
        )
        commit = code_commit(os.path.dirname(os.path.abspath(args.program)))
        # Every record is checked before any arm trains, so that a refusal
        # comes first, not after hours of another arm.
        for arm in arms:
            path = os.path.join(args.results, f"{arm.name}.json")
            record = load_record(path)
            if record is not None and not record.get("complete"):
                check_resumable(
                    path,
                    record,
                    commit["commit"],
                    _command_text(
                        train_command(arm, os.path.join(args.logdir_root, arm.name))
                    ),
                )
        records = []
        for batch in _batches(arms):
            if len(batch) == 1:
                done = [run_arm(batch[0], options, commit)]
            else:
                done = run_together(batch, args)
            records += done
            stopped = [r["arm"] for r in done if not r.get("complete")]
            if stopped:
                print(
                    f"{', '.join(stopped)}: stopped before the end; the same "
                    "command continues."
                )
                break
    except StudyError as e:
        print(f"study.py: {e}", file=sys.stderr)
        return 2
    names = sorted(f for f in os.listdir(args.results) if f.endswith(".json"))
    every = in_study_order(
        [load_record(os.path.join(args.results, n)) for n in names], study_arms
    )
    if not args.no_figure:
        figure = args.figure or os.path.join(args.results, "curves.png")
        draw_figure(every, figure, args.study or "study")
    print(f"Records in {args.results}.")
    return 0 if all(r.get("complete") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
