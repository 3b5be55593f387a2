"""Frames/s: a learner with N actor tasks (launch.py) vs single-machine training.

    python3 benchmarks/distributed_bench.py [--actors=2,4] [--window_lines=1]

For each N, runs in turn, with the same flags (atari/pong, the shallow agent,
batch 2, unroll 20):

- single machine: `experiment.py --num_actors=N` (N actor threads, dynamic
  batching as by default);
- distributed: `launch.py --num_actors=N`, a learner task and N actor tasks
  on loopback (free ports), each actor with its own local copy of the
  weights, refreshed at every unroll.

Each run trains until the learner has logged `--window_lines` + 1 progress
lines (one every 10 s, the first 10 s after the first learner step, so the
warm-up is left out); the figure is the frame rate from the first to the last
of them, from the lines' own frame counts and timestamps. Then the run is
stopped and its files deleted. Prints a Markdown table, with the load average
at the start of each run: on a shared machine other processes change the
figures.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "--level_name=atari/pong",
    "--agent=shallow",
    "--batch_size=2",
    "--unroll_length=20",
    "--total_environment_frames=1000000000",
]
# absl line: I1130 09:55:54.351949 <thread> experiment.py:NNN] frames 1280 | ...
PROGRESS = re.compile(
    r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\] frames ([\d,]+) [|/] ", re.MULTILINE
)
START_TIMEOUT_S = 150
LINE_TIMEOUT_S = 60


def _progress(log_path: str) -> list[tuple[float, int]]:
    """(seconds since midnight, frames) of each progress line of a log."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [
        (int(h) * 3600 + int(m) * 60 + float(s), int(frames.replace(",", "")))
        for h, m, s, frames in PROGRESS.findall(text)
    ]


def _stop(process: subprocess.Popen, kind: str) -> None:
    """Ends a run: SIGKILL for the single-machine one (its group holds its
    environment processes too); SIGINT for launch.py, which stops its tasks
    (each in its own session); SIGKILL if that takes too long."""
    steps = [(signal.SIGKILL, 10)]
    if kind == "distributed":
        steps.insert(0, (signal.SIGINT, 30))
    for signum, wait in steps:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def measure(kind: str, num_actors: int, window_lines: int) -> float:
    """Frames/s of one run; kind is 'single' or 'distributed'."""
    workdir = tempfile.mkdtemp(prefix=f"distributed_bench_{kind}_")
    logdir = os.path.join(workdir, "logdir")
    if kind == "single":
        cmd = [
            sys.executable,
            os.path.join(REPO, "experiment.py"),
            f"--num_actors={num_actors}",
            f"--logdir={logdir}",
            *FLAGS,
        ]
        log_path = os.path.join(workdir, "single.log")
    else:
        cmd = [
            sys.executable,
            os.path.join(REPO, "launch.py"),
            "--kill_grace_secs=3",  # Its tasks' final checkpoint is not needed.
            f"--num_actors={num_actors}",
            f"--logdir={logdir}",
            *FLAGS,
        ]
        log_path = os.path.join(logdir, "logs", "learner_0.log")
    needed = window_lines + 1
    os.makedirs(workdir, exist_ok=True)
    # absl logs to stderr: the single-machine log is that; launch.py writes
    # each task's log under <logdir>/logs and prints its own lines.
    output_path = log_path if kind == "single" else os.path.join(workdir, "launch.log")
    with open(output_path, "wb") as output:
        process = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S + needed * LINE_TIMEOUT_S
        while len(lines := _progress(log_path)) < needed:
            if process.poll() is not None:
                raise RuntimeError(f"{kind} run exited early; see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{kind} run: too few progress lines; see {log_path}"
                )
            time.sleep(0.5)
    finally:
        _stop(process, kind)
    (t0, f0), (t1, f1) = lines[0], lines[window_lines]
    if t1 < t0:  # Past midnight.
        t1 += 86400
    shutil.rmtree(workdir, ignore_errors=True)
    return (f1 - f0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="2,4", help="comma-separated N values")
    parser.add_argument(
        "--window_lines", type=int, default=1, help="progress intervals measured"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.actors.split(",")]
    print(f"date: {datetime.date.today()}  nproc: {os.cpu_count()}")
    rows = []
    for n in counts:
        for kind in ("single", "distributed"):
            load_before = os.getloadavg()[0]
            fps = measure(kind, n, args.window_lines)
            rows.append((n, kind, fps, load_before))
            print(f"N={n} {kind}: {fps:.0f} frames/s (load average {load_before:.1f})")
    print()
    print(
        "| actors N | single machine (frames/s) | learner + N actor tasks (frames/s) | ratio |"
    )
    print("| --- | --- | --- | --- |")
    for n in counts:
        single = next(r[2] for r in rows if r[0] == n and r[1] == "single")
        dist = next(r[2] for r in rows if r[0] == n and r[1] == "distributed")
        print(f"| {n} | {single:.0f} | {dist:.0f} | {dist / single:.2f} |")


if __name__ == "__main__":
    main()
