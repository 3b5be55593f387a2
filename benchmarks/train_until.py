r"""Trains until a return or a time limit, recording the curve as it goes.

Runs `python3 experiment.py <flags>` as a child, its log (stdout and stderr)
to --log, and reads that log as it is written: the progress lines give the
frame count, the `Episode on <level>: return R` lines the returns. After each
episode it updates the mean of the last --window episodes and notes the
frames and minutes at which that mean first reached each of --thresholds.
When it reaches --stop_at (with a full window), or after --minutes, the child
gets SIGINT: experiment.py writes its checkpoint and exits. The record
(--json) is rewritten at every threshold and at the end, so a run stopped
from outside still leaves what it had shown.

    python3 benchmarks/train_until.py --json /tmp/pong_a.json \
        --log /tmp/pong_a.log --stop_at 18 --minutes 60 -- \
        --logdir=/tmp/pong_a --entropy_cost=0.005

Everything after `--` goes to experiment.py unchanged.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

_EPISODE = re.compile(r"Episode on (\S+): return (-?[\d.]+)")
_PROGRESS = re.compile(r"\] frames ([\d,]+) / ([\d,]+)")


class Curve:
    """The rolling mean of the last `window` returns and the first frames
    and seconds at which it reached each threshold (ascending)."""

    def __init__(self, window: int, thresholds: list[float]):
        self.window = window
        self.thresholds = sorted(thresholds)
        self.returns: collections.deque[float] = collections.deque(maxlen=window)
        self.frames = 0
        self.episodes = 0
        self.reached: dict[float, dict] = {}
        self.best = None

    def line(self, text: str, seconds: float) -> bool:
        """Reads one log line; True when it made the mean cross a threshold."""
        if m := _PROGRESS.search(text):
            self.frames = int(m.group(1).replace(",", ""))
            return False
        m = _EPISODE.search(text)
        if not m:
            return False
        self.returns.append(float(m.group(2)))
        self.episodes += 1
        mean = self.mean()
        if len(self.returns) == self.window:
            self.best = mean if self.best is None else max(self.best, mean)
        crossed = False
        for threshold in self.thresholds:
            if threshold not in self.reached and self.full() and mean >= threshold:
                self.reached[threshold] = dict(
                    frames=self.frames, minutes=round(seconds / 60, 1)
                )
                crossed = True
        return crossed

    def mean(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    def full(self) -> bool:
        return len(self.returns) == self.window

    def record(self) -> dict:
        return dict(
            window=self.window,
            episodes=self.episodes,
            frames=self.frames,
            last_mean=round(self.mean(), 2) if self.returns else None,
            best_mean=None if self.best is None else round(self.best, 2),
            reached={f"{t:g}": self.reached[t] for t in sorted(self.reached)},
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, forwarded = (argv, [])
    if "--" in argv:
        i = argv.index("--")
        own, forwarded = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="the record, rewritten")
    parser.add_argument("--log", required=True, help="experiment.py's log")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--thresholds", default="-20,-15,0,15,18")
    parser.add_argument("--stop_at", type=float, default=None)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--program", default=os.path.join(common.REPO, "experiment.py"))
    args = parser.parse_args(own)
    thresholds = [float(t) for t in args.thresholds.split(",") if t]
    curve = Curve(args.window, thresholds)
    command = [sys.executable, args.program, *forwarded]
    record = dict(
        command=" ".join(["python3 experiment.py", *forwarded]),
        machine=common.machine_info(),
        stop_at=args.stop_at,
        minutes_limit=args.minutes,
    )

    def write(ended: str | None = None, seconds: float = 0.0) -> None:
        record.update(curve.record(), minutes=round(seconds / 60, 1), ended=ended)
        record["load_average"] = os.getloadavg()
        common.write_json(args.json, record)

    start = time.time()
    with open(args.log, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    stopped = None
    write()
    # SIGINT or SIGTERM to this script stops the run the same way, so that
    # the record still ends with what it had shown.
    told = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda n, _: told.append(signal.Signals(n).name))
    with open(args.log, errors="replace") as reader:
        while True:
            text = reader.readline()
            seconds = time.time() - start
            if told and stopped is None:
                stopped = f"{told[0]} to train_until.py"
                child.send_signal(signal.SIGINT)
            if not text:
                if child.poll() is not None:
                    break
                if stopped is None and seconds > args.minutes * 60:
                    stopped = f"time limit ({args.minutes:g} min)"
                    child.send_signal(signal.SIGINT)
                time.sleep(1.0)
                continue
            if curve.line(text, seconds):
                write(None, seconds)
            target = args.stop_at
            if stopped is None and target is not None and target in curve.reached:
                stopped = f"mean of {args.window} reached {target:g}"
                child.send_signal(signal.SIGINT)
    seconds = time.time() - start
    write(stopped or f"experiment.py exited {child.returncode}", seconds)
    print(json.dumps(curve.record()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
