"""Frames/s: a learner with N actor tasks (launch.py) vs single-machine training.

    python3 benchmarks/throughput/distributed_bench.py [--actors=2,4] [--window_lines=1]
    python3 benchmarks/throughput/distributed_bench.py --kinds=single,netns --actors=1,2,4

For each N, runs in turn, with the same flags (atari/pong, the shallow agent,
batch 2, unroll 20):

- single machine: `experiment.py --num_actors=N` (N actor threads, dynamic
  batching as by default);
- distributed: `launch.py --num_actors=N`, a learner task and N actor tasks
  on loopback (free ports), each actor with its own local copy of the
  weights, refreshed at every unroll;
- netns: the same learner and N actor tasks, each on its own host of a
  virtual network (tests/virtual_network.py: a network namespace per task,
  joined by a bridge; root only). Also reports the bytes on the wire per
  unroll, from the actor hosts' interface counters over the window: what an
  actor receives (the weight copy at each unroll, plus protocol) and what
  it sends (the unroll, plus protocol).

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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)
from benchmarks.core import common  # noqa: E402

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


FRAMES_PER_UNROLL = 20 * 4  # --unroll_length x the default action repeats


def measure_netns(num_actors: int, window_lines: int) -> dict:
    """A learner and `num_actors` actor tasks, each on its own namespace
    host: frames/s over the window and bytes per unroll on the wire."""
    import virtual_network

    workdir = tempfile.mkdtemp(prefix="distributed_bench_netns_")
    logdir = os.path.join(workdir, "logdir")
    with virtual_network.VirtualNetwork(num_actors + 1) as network:
        learner_host = f"{network.addresses[0]}:8000"
        actor_hosts = ",".join(f"{a}:8001" for a in network.addresses[1:])
        common = [
            *FLAGS,
            f"--logdir={logdir}",
            f"--num_actors={num_actors}",
            f"--learner_host={learner_host}",
            f"--actor_hosts={actor_hosts}",
        ]
        log_path = os.path.join(workdir, "learner.log")
        for host in range(num_actors + 1):
            job = "learner" if host == 0 else "actor"
            task = 0 if host == 0 else host - 1
            path = log_path if host == 0 else os.path.join(workdir, f"actor{task}.log")
            with open(path, "wb") as output:
                network.popen(
                    host,
                    [
                        sys.executable,
                        os.path.join(REPO, "experiment.py"),
                        *common,
                        f"--job_name={job}",
                        f"--task={task}",
                    ],
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                )
        needed = window_lines + 1
        deadline = time.monotonic() + START_TIMEOUT_S + needed * LINE_TIMEOUT_S
        # The counters at each new progress line (polled every 50 ms, so
        # they lag the line's timestamp by at most that and the log's flush).
        counters: dict[int, list] = {}
        while True:
            lines = _progress(log_path)
            if len(lines) > len(counters):
                counters[len(lines) - 1] = [
                    network.counters(h) for h in range(1, num_actors + 1)
                ]
            if len(lines) >= needed:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"netns run: too few progress lines; see {log_path}")
            time.sleep(0.05)
    first, last = min(counters), max(counters)
    (t0, f0), (t1, f1) = lines[first], lines[last]
    start, end = counters[first], counters[last]
    unrolls = (f1 - f0) / FRAMES_PER_UNROLL
    received = sum(e[0] - s[0] for s, e in zip(start, end, strict=True))
    sent = sum(e[1] - s[1] for s, e in zip(start, end, strict=True))
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "frames_per_s": (f1 - f0) / ((t1 - t0) % 86400),
        "actor_rx_bytes_per_unroll": received / unrolls,
        "actor_tx_bytes_per_unroll": sent / unrolls,
    }


def measure(
    kind: str, num_actors: int, window_lines: int, extra: tuple[str, ...] = ()
) -> float:
    """Frames/s of one run; kind is 'single' or 'distributed'; `extra` flags
    follow FLAGS (a later flag wins)."""
    workdir = tempfile.mkdtemp(prefix=f"distributed_bench_{kind}_")
    logdir = os.path.join(workdir, "logdir")
    if kind == "single":
        cmd = [
            sys.executable,
            os.path.join(REPO, "experiment.py"),
            f"--num_actors={num_actors}",
            f"--logdir={logdir}",
            *FLAGS,
            *extra,
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
            *extra,
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
    parser.add_argument(
        "--kinds",
        default="single,distributed",
        help="which of single, distributed (loopback), netns (namespace hosts)",
    )
    parser.add_argument(
        "--extra_flags",
        default="",
        help="training flags after the fixed ones, space-separated, e.g. "
        "'--batch_size=8 --envs_per_actor=8 --envs_per_process=8' (single and "
        "distributed kinds)",
    )
    common.add_json_argument(parser)
    args = parser.parse_args()
    extra = tuple(args.extra_flags.split())
    counts = [int(n) for n in args.actors.split(",")]
    kinds = args.kinds.split(",")
    print(
        f"date: {datetime.date.today()}  nproc: {os.cpu_count()}  "
        f"flags: {' '.join((*FLAGS, *extra))}"
    )
    rows = {}
    for n in counts:
        for kind in kinds:
            load_before = os.getloadavg()[0]
            if kind == "netns":
                record = measure_netns(n, args.window_lines)
            else:
                record = {"frames_per_s": measure(kind, n, args.window_lines, extra)}
            record["load_before"] = load_before
            rows[n, kind] = record
            print(f"N={n} {kind}: {record} (load average {load_before:.1f})")
    print()
    print(
        "| actors N | "
        + " | ".join(f"{kind} (frames/s)" for kind in kinds)
        + (
            " | actor receives per unroll | actor sends per unroll"
            if "netns" in kinds
            else ""
        )
        + " |"
    )
    print("|" + " --- |" * (1 + len(kinds) + 2 * ("netns" in kinds)))
    for n in counts:
        cells = [f"{rows[n, kind]['frames_per_s']:.0f}" for kind in kinds]
        if "netns" in kinds:
            record = rows[n, "netns"]
            cells += [
                f"{record['actor_rx_bytes_per_unroll'] / 1e6:.2f} MB",
                f"{record['actor_tx_bytes_per_unroll'] / 1e6:.3f} MB",
            ]
        print(f"| {n} | " + " | ".join(cells) + " |")
    common.write_json(
        args.json,
        {
            "flags": [*FLAGS, *extra],
            "runs": [
                {"actors": n, "kind": kind, **record}
                for (n, kind), record in rows.items()
            ],
        },
    )


if __name__ == "__main__":
    main()
