"""Trains and tests a study's arms, one after another or a group at a
time, writing each arm's record as it goes (benchmarks/study.py is the
command line; its docstring says what a record holds and how a stopped arm
continues).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

from benchmarks.core import common
from benchmarks.learning import train_until
from benchmarks.studies.records import (
    Arm,
    StudyError,
    check_resumable,
    level_score,
    load_record,
    training_done,
    write_record,
)

# The command line a group's study processes run.
STUDY_SCRIPT = os.path.join(common.REPO, "benchmarks", "study.py")


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


def command_text(flags: list[str]) -> str:
    return " ".join(["python3 experiment.py", *map(shlex.quote, flags)])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def run_arm(arm: Arm, options: Options, commit: dict) -> dict:
    """Trains and tests one arm (see the module's docstring); returns its
    record."""
    path = os.path.join(options.results, f"{arm.name}.json")
    logdir = os.path.join(options.logdir_root, arm.name)
    train_flags = train_command(arm, logdir)
    command = command_text(train_flags)
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
            "test_command": command_text(
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
        score = level_score(level, result["returns"])
        if score is not None:
            entry["human_normalized"] = round(score, 2)
        levels[level] = entry
    record["test"] = {
        "date": _now(),
        "minutes": round((time.time() - start) / 60, 1),
        "checkpoint": os.path.basename(results["checkpoint"]),
        "levels": levels,
    }


# -- arms that train together --------------------------------------------------------


def batches(arms: list[Arm]) -> list[list[Arm]]:
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
            [sys.executable, STUDY_SCRIPT, args.study, "--only", a.name] + passed
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
