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

    python3 benchmarks/learning/train_until.py --json /tmp/pong_a.json \
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

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402

_EPISODE = re.compile(r"Episode on (\S+): return (-?[\d.]+)")
# With life loss (Atari's training) an episode is one life; the environment
# process also writes each whole game's return (families/atari.py).
GAME = re.compile(r"Game on (\S+): return (-?[\d.]+)")
_PROGRESS = re.compile(r"\] frames ([\d,]+) / ([\d,]+)")


class Curve:
    """The rolling mean of the last `window` returns and the first frames
    and seconds at which it reached each threshold (ascending).

    The returns are the learner's episodes' (`Episode on` lines) until the
    log shows a whole game (`Game on`, Atari's training with life loss):
    from then on they are whole games', as published scores are
    (`unit` says which)."""

    def __init__(self, window: int, thresholds: list[float]):
        self.window = window
        self.thresholds = sorted(thresholds)
        self.returns: collections.deque[float] = collections.deque(maxlen=window)
        self.frames = 0
        self.episodes = 0
        self.games = 0
        self.unit = "episode"
        self.reached: dict[float, dict] = {}
        self.best = None
        # The curve itself: (frames, minutes, mean, episodes), one per
        # `point` call (a runner calls it every few minutes).
        self.points: list[dict] = []

    def point(self, seconds: float) -> dict:
        """Appends and returns the curve's point at `seconds` from start."""
        point = dict(
            frames=self.frames,
            minutes=round(seconds / 60, 1),
            mean=round(self.mean(), 2) if self.returns else None,
            episodes=self.episodes,
            games=self.games,
        )
        self.points.append(point)
        return point

    def line(self, text: str, seconds: float) -> bool:
        """Reads one log line; True when it made the mean cross a threshold."""
        if m := _PROGRESS.search(text):
            self.frames = int(m.group(1).replace(",", ""))
            return False
        if m := GAME.search(text):
            self.games += 1
            if self.unit != "game":
                self.unit = "game"
                self.returns.clear()
                self.best = None
        elif m := _EPISODE.search(text):
            self.episodes += 1
            if self.unit == "game":
                return False
        else:
            return False
        self.returns.append(float(m.group(2)))
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
            games=self.games,
            unit=self.unit,
            frames=self.frames,
            last_mean=round(self.mean(), 2) if self.returns else None,
            best_mean=None if self.best is None else round(self.best, 2),
            reached={f"{t:g}": self.reached[t] for t in sorted(self.reached)},
        )


def train(
    forwarded: list[str],
    log_path: str,
    curve: Curve,
    *,
    stop_at: float | None = None,
    minutes: float | None = None,
    program: str = os.path.join(common.REPO, "experiment.py"),
    point_secs: float | None = None,
    on_update=None,
    on_start=None,
) -> tuple[str, int, float]:
    """Runs `program` with `forwarded` flags until its end, `stop_at` (the
    curve's mean over a full window) or `minutes`, its log to `log_path`,
    feeding `curve` as the log grows. `on_update(seconds)` is called at
    each threshold crossed and each curve point (every `point_secs`),
    `on_start(child)` with the child's Popen once it runs.
    SIGINT or SIGTERM to this process stops the child the same way (SIGINT:
    its checkpoint is written). Returns (why it ended, the child's exit
    status, seconds)."""
    command = [sys.executable, program, *forwarded]
    start = time.time()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    if on_start:
        on_start(child)
    stopped = None
    told = []
    previous = {
        signum: signal.signal(signum, lambda n, _: told.append(signal.Signals(n).name))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    next_point = point_secs
    try:
        with open(log_path, errors="replace") as reader:
            while True:
                text = reader.readline()
                seconds = time.time() - start
                if told and stopped is None:
                    stopped = f"{told[0]} to {os.path.basename(sys.argv[0])}"
                    child.send_signal(signal.SIGINT)
                if next_point is not None and seconds >= next_point:
                    next_point += point_secs
                    curve.point(seconds)
                    if on_update:
                        on_update(seconds)
                if not text:
                    if child.poll() is not None:
                        break
                    if stopped is None and minutes and seconds > minutes * 60:
                        stopped = f"time limit ({minutes:g} min)"
                        child.send_signal(signal.SIGINT)
                    time.sleep(1.0)
                    continue
                if curve.line(text, seconds) and on_update:
                    on_update(seconds)
                if stopped is None and stop_at is not None and stop_at in curve.reached:
                    stopped = f"mean of {curve.window} reached {stop_at:g}"
                    child.send_signal(signal.SIGINT)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
            child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    seconds = time.time() - start
    if point_secs is not None:
        curve.point(seconds)
    return (
        stopped or f"experiment.py exited {child.returncode}",
        child.returncode,
        seconds,
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

    write()
    ended, _, seconds = train(
        forwarded,
        args.log,
        curve,
        stop_at=args.stop_at,
        minutes=args.minutes,
        program=args.program,
        on_update=lambda seconds: write(None, seconds),
    )
    write(ended, seconds)
    print(json.dumps(curve.record()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
