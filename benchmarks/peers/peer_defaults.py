"""The comparison a user makes: each project at its own defaults, in turn,
for the same wall-clock time, in one invocation.

Ours is `python3 experiment.py --level_name=LEVEL` and nothing else (the
family's defaults, from its tested flag file; benchmarks/learning/train_until.py
runs it and stops it); Sample Factory 2.1.1 is its own example for that
environment with nothing but the CPU device
(benchmarks/peers/sample_factory_peer.sh with SF_LAYOUT=defaults: its Atari
example for atari/pong, its ViZDoom example for vizdoom/defend_the_center).
For each: environment frames/s, the median of its 10-second figures after a
warm-up (both count frames with the frame skip of 4), the frames reached
and the mean return of its last 100 episodes at the end.

    python3 benchmarks/peers/peer_defaults.py --level atari/pong --minutes 10
    python3 benchmarks/peers/peer_defaults.py --level vizdoom/defend_the_center --minutes 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402
from benchmarks.peers import peers  # noqa: E402

# Sample Factory's name for each level this comparison runs.
PEER_ENVS = {
    "atari/pong": "atari_pong",
    "vizdoom/defend_the_center": "doom_defend_the_center",
}
WARMUP_S = 60.0

# absl's prefix (I1205 15:12:44.123456 ...) and our progress line.
_PROGRESS = re.compile(
    r"^[IWE]\d{4} (\d\d:\d\d:\d\d)\.\d+ .*\] frames ([\d,]+) / [\d,]+ \([^)]*\) "
    r"\| ([\d,]+) frames/s"
)


def progress_figures(log_text: str, warmup_s: float = WARMUP_S) -> list[float]:
    """The frames/s of our progress lines logged `warmup_s` or more after
    the first one (each is the rate over its ~10 s interval)."""
    figures, first, day = [], None, datetime.timedelta(0)
    previous = None
    for line in log_text.splitlines():
        match = _PROGRESS.search(line)
        if not match:
            continue
        when = datetime.datetime.strptime(match.group(1), "%H:%M:%S") + day
        if previous is not None and when < previous:  # past midnight
            day += datetime.timedelta(days=1)
            when += datetime.timedelta(days=1)
        previous = when
        first = first or when
        if (when - first).total_seconds() >= warmup_s:
            figures.append(float(match.group(3).replace(",", "")))
    return figures


def run_ours(level: str, minutes: float) -> dict:
    logdir = tempfile.mkdtemp(prefix="peer_defaults_")
    record_path = os.path.join(logdir, "curve.json")
    log_path = os.path.join(logdir, "log.txt")
    flags = [f"--level_name={level}", f"--logdir={logdir}/run"]
    subprocess.run(
        [
            sys.executable,
            os.path.join(common.REPO, "benchmarks", "learning", "train_until.py"),
            f"--json={record_path}",
            f"--log={log_path}",
            f"--minutes={minutes}",
            "--",
            *flags,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(record_path) as f:
        curve = json.load(f)
    with open(log_path, errors="replace") as f:
        log_text = f.read()
    figures = progress_figures(log_text)
    first_line = re.search(r"\] (Training (?!done).*)", log_text)
    return dict(
        command="python3 experiment.py " + " ".join(flags[:1]),
        frames_per_s=statistics.median(figures) if figures else None,
        frames=curve["frames"],
        mean_return=curve["last_mean"],
        episodes=curve["episodes"],
        first_line=first_line.group(1) if first_line else None,
        logdir=logdir,
    )


def run_peer(level: str, minutes: float) -> dict:
    return peers.run(
        peers.SAMPLE_FACTORY,
        minutes * 60,
        {"SF_ENV": PEER_ENVS[level], "SF_LAYOUT": "defaults"},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--level", choices=sorted(PEER_ENVS), default="atari/pong")
    parser.add_argument("--minutes", type=float, default=10.0)
    common.add_json_argument(parser)
    args = parser.parse_args()
    print(common.machine_line(), flush=True)
    record = dict(
        machine=common.machine_info(),
        level=args.level,
        minutes=args.minutes,
        started=datetime.datetime.now(datetime.UTC).isoformat(),
        load_start=common.loadavg(),
    )
    record["ours"] = run_ours(args.level, args.minutes)
    print(f"ours: {json.dumps(record['ours'])}", flush=True)
    record["sample_factory"] = run_peer(args.level, args.minutes)
    print(f"sample_factory: {json.dumps(record['sample_factory'])}", flush=True)
    record["load_end"] = common.loadavg()
    common.write_json(args.json, record)
    ours, peer = record["ours"], record["sample_factory"]
    ratio = (
        f"{ours['frames_per_s'] / peer['frames_per_s']:.2f}x"
        if ours["frames_per_s"] and peer["frames_per_s"]
        else "?"
    )
    print(f"\n{args.level}, {args.minutes:g} min each ({ratio} Sample Factory)\n")
    print("| run | frames/s | frames | mean return (last 100) |")
    print("| --- | ---: | ---: | ---: |")
    for name, run in (("ours", ours), ("Sample Factory", peer)):
        fps = f"{run['frames_per_s']:,.0f}" if run["frames_per_s"] else "?"
        frames = f"{run['frames']:,}" if run["frames"] else "?"
        print(f"| {name} | {fps} | {frames} | {run['mean_return']} |")


if __name__ == "__main__":
    main()
