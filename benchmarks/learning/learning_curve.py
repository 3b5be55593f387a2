"""Learning curve of a training run: episode return against frames and time.

Reads a run's TensorBoard events (every `events.out.tfevents.*` file under
--logdir, via tf.compat.v1.train.summary_iterator; the `<level>/episode_return`
summaries that experiment.py writes at each finished episode, with the
environment frame count as the step) and, if given, its log file (`Episode on
<level>: return R, ...` lines, with frames taken from the progress lines,
used when the events have no episodes yet). Only reads: safe on a run in
progress.

Draws one figure with two panels (return against environment frames, and
against wall-clock time since the run started), each episode as a dot and the
rolling mean of the last --window (20) episodes as a line, and prints the
frames and the time at which the rolling mean first reached each threshold
(0 and +15 by default), or the best rolling mean reached.

Optionally, labelled reference lines (--reference "human=30.5", repeated) and
test-mode scores of the run's checkpoints (--test_points, the JSON that
benchmarks/learning/evaluate_checkpoints.py writes: whole games, where training
episodes on Atari are single lives) drawn as black markers on both panels.

    python3 benchmarks/learning/learning_curve.py --logdir /tmp/runs/pong_learning \\
        --log /tmp/runs/pong_learning.log --out /tmp/pong_learning.png
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import (
    common,  # noqa: E402
    figures,  # noqa: E402
)

Episode = collections.namedtuple("Episode", "wall_time frames episode_return")


def read_events(
    logdir: str, tag_suffix: str = "/episode_return"
) -> tuple[list[Episode], float | None]:
    """Episodes from every events file under logdir; and the earliest event time."""
    rows, start = common.read_scalar_events(logdir, lambda t: t.endswith(tag_suffix))
    return [Episode(wall, step, value) for wall, step, _, value in rows], start


_TIME = r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d+)"
_EPISODE = re.compile(_TIME + r".*Episode on \S+: return (-?[\d.]+)")
# "frames 1,280 / 10,000,000 (0.0 %) | ..."
_PROGRESS = re.compile(_TIME + r".*\] frames ([\d,]+) /")


def read_log(path: str, year: int) -> tuple[list[Episode], float | None]:
    """Episodes from an experiment.py log (absl lines); frames interpolated
    from the progress lines ("frames N / TARGET ..."), every 10 s."""

    def when(mmdd: str, hms: str) -> float:
        stamp = datetime.datetime.strptime(f"{year}{mmdd} {hms}", "%Y%m%d %H:%M:%S.%f")
        return stamp.replace(tzinfo=datetime.UTC).timestamp()

    raw, progress, start = [], [], None
    with open(path, errors="replace") as f:
        for line in f:
            m = _EPISODE.match(line)
            if m:
                raw.append((when(m.group(1), m.group(2)), float(m.group(3))))
            m = _PROGRESS.match(line)
            if m:
                progress.append(
                    (when(m.group(1), m.group(2)), int(m.group(3).replace(",", "")))
                )
            if start is None:
                m = re.match(_TIME, line)
                if m:
                    start = when(m.group(1), m.group(2))
    if not progress:
        return [], start
    import numpy as np

    times, frames = zip(*progress, strict=True)
    episodes = [Episode(t, int(np.interp(t, times, frames)), r) for t, r in raw]
    return episodes, start


def remove_gaps(
    episodes: list[Episode], test_points: list[dict], max_gap_s: float
) -> tuple[list[Episode], list[dict], float]:
    """Takes out of the time axis every pause longer than max_gap_s between
    consecutive episodes (a run stopped and resumed later): returns the
    shifted episodes and test points, and the seconds removed."""
    shifted, removed, previous = [], 0.0, None
    cuts = []  # (wall time where a gap ends, seconds removed up to there)
    for e in episodes:
        if previous is not None and e.wall_time - previous > max_gap_s:
            removed += e.wall_time - previous - max_gap_s
            cuts.append((e.wall_time, removed))
        previous = e.wall_time
        shifted.append(e._replace(wall_time=e.wall_time - removed))

    def shift(t: float) -> float:
        return t - max((r for end, r in cuts if end <= t), default=0.0)

    points = [dict(p, wall_time=shift(p["wall_time"])) for p in test_points]
    return shifted, points, removed


def summarize(episodes: list[Episode], start: float, window: int, thresholds) -> dict:
    rolling = common.rolling_mean([e.episode_return for e in episodes], window)
    full = list(range(window - 1, len(episodes)))  # rolling means over a full window
    summary = {
        "episodes": len(episodes),
        "last_frames": episodes[-1].frames,
        "last_time_s": episodes[-1].wall_time - start,
        "window": window,
        "thresholds": {},
    }
    if full:
        best = max(full, key=lambda i: rolling[i])
        summary["best_rolling_mean"] = float(rolling[best])
        summary["best_at_frames"] = episodes[best].frames
        summary["best_at_time_s"] = episodes[best].wall_time - start
        summary["final_rolling_mean"] = float(rolling[-1])
    for threshold in thresholds:
        hit = next((i for i in full if rolling[i] >= threshold), None)
        summary["thresholds"][str(threshold)] = (
            None
            if hit is None
            else {
                "frames": episodes[hit].frames,
                "time_s": episodes[hit].wall_time - start,
            }
        )
    return summary


def parse_references(items: list[str]) -> list[tuple[str, float]]:
    """["human=30.5", ...] -> [("human", 30.5), ...]."""
    references = []
    for item in items:
        label, sep, value = item.rpartition("=")
        try:
            if not sep or not label:
                raise ValueError
            references.append((label, float(value)))
        except ValueError:
            sys.exit(f"learning_curve.py: --reference={item!r} is not LABEL=NUMBER")
    return references


def plot(
    episodes,
    start,
    window,
    thresholds,
    out,
    title,
    references=(),
    test_points=(),
    time_label="wall-clock time (minutes since start)",
    ylim=None,
):
    plt = figures.require_pyplot()
    import numpy as np

    returns = np.array([e.episode_return for e in episodes])
    frames = np.array([e.frames for e in episodes]) / 1e6
    minutes = (np.array([e.wall_time for e in episodes]) - start) / 60.0
    rolling = common.rolling_mean(returns, window)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    test_x = x_of_test(test_points, start)
    for panel, (ax, x, label) in enumerate(
        (
            (axes[0], frames, "environment frames (millions)"),
            (axes[1], minutes, time_label),
        )
    ):
        ax.scatter(
            x, returns, s=6, alpha=0.25, color="tab:blue", label="episode return"
        )
        ax.plot(
            x,
            rolling,
            color="tab:red",
            lw=1.8,
            label=f"mean of the last {window} episodes",
        )
        for threshold in thresholds:
            ax.axhline(threshold, color="grey", lw=0.8, ls=":")
        for i, (name, value) in enumerate(references):
            color = ("tab:green", "tab:purple", "tab:brown", "tab:olive")[i % 4]
            ax.axhline(value, color=color, lw=1.2, ls="--", label=f"{name}: {value:g}")
        if test_points:
            ax.plot(
                test_x[panel],
                [p["mean_return"] for p in test_points],
                "k^-",
                ms=6,
                lw=1,
                label="test mode, whole games (mean per checkpoint)",
            )
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    if ylim:
        axes[0].set_ylim(*ylim)  # the axes share y
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)


def x_of_test(test_points, start) -> tuple[list[float], list[float]]:
    """Test points' frames (millions) and minutes since `start`."""
    return (
        [p["frames"] / 1e6 for p in test_points],
        [(p["wall_time"] - start) / 60.0 for p in test_points],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--logdir", help="the run's --logdir (TensorBoard events)")
    parser.add_argument(
        "--log", help="the run's log file (stdout/stderr of experiment.py)"
    )
    parser.add_argument("--out", default="benchmarks/plots/learning_curve.png")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--thresholds", default="0,15")
    parser.add_argument(
        "--year",
        type=int,
        default=datetime.datetime.now(datetime.UTC).year,
        help="log lines carry no year",
    )
    parser.add_argument("--title", default="")
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        help='a labelled line, "LABEL=RETURN" (repeatable), e.g. "human=30.5"',
    )
    parser.add_argument(
        "--ylim",
        help='"LOW,HIGH" for the return axis (rare outliers left off the plot; '
        "the summary keeps them)",
    )
    parser.add_argument(
        "--max_gap_s",
        type=float,
        default=0.0,
        help="take pauses longer than this (s) between episodes out of the time "
        "axis (a run stopped and resumed later); 0 keeps wall-clock time",
    )
    parser.add_argument(
        "--test_points",
        help="evaluate_checkpoints.py's JSON: test-mode means per checkpoint",
    )
    args = parser.parse_args()
    if not args.logdir and not args.log:
        parser.error("give --logdir (events) and/or --log (log file)")
    thresholds = [float(t) for t in args.thresholds.split(",") if t]
    episodes, start, source = [], None, None
    if args.logdir:
        episodes, start = read_events(args.logdir)
        source = "events"
    if not episodes and args.log:
        episodes, start = read_log(args.log, args.year)
        source = "log"
    elif (
        args.log
    ):  # The log's first line is the process start: earlier than the events file.
        _, log_start = read_log(args.log, args.year)
        if log_start is not None and start is not None and log_start < start:
            start = log_start
    if not episodes:
        sys.exit(
            "learning_curve.py: no finished episodes found in "
            + " / ".join(filter(None, [args.logdir, args.log]))
        )
    references = parse_references(args.reference)
    test_points = []
    if args.test_points:
        with open(args.test_points) as f:
            test_points = sorted(json.load(f)["checkpoints"], key=lambda p: p["frames"])
    removed = 0.0
    if args.max_gap_s > 0:
        episodes, test_points, removed = remove_gaps(
            episodes, test_points, args.max_gap_s
        )
    summary = summarize(episodes, start, args.window, thresholds)
    summary["source"] = source
    summary["gaps_removed_s"] = removed
    if test_points:
        summary["test_points"] = [
            {"frames": p["frames"], "mean_return": p["mean_return"]}
            for p in test_points
        ]
    title = args.title or f"{args.logdir or args.log}: {len(episodes)} episodes"
    plot(
        episodes,
        start,
        args.window,
        thresholds,
        args.out,
        title,
        references,
        test_points,
        ylim=[float(v) for v in args.ylim.split(",")] if args.ylim else None,
        time_label=(
            "training time (minutes since start, pauses removed)"
            if removed
            else "wall-clock time (minutes since start)"
        ),
    )
    if removed:
        print(f"Time axis: {removed / 60:.1f} min of pauses removed.")
    print(
        f"{summary['episodes']} episodes (from {source}); last at {summary['last_frames']:,} frames, {summary['last_time_s'] / 60:.1f} min."
    )
    if "best_rolling_mean" in summary:
        print(
            f"Rolling mean of the last {args.window}: final {summary['final_rolling_mean']:.2f}; best "
            f"{summary['best_rolling_mean']:.2f} at {summary['best_at_frames']:,} frames, "
            f"{summary['best_at_time_s'] / 60:.1f} min."
        )
    for threshold, hit in summary["thresholds"].items():
        if hit:
            print(
                f"Reached {float(threshold):+g}: at {hit['frames']:,} frames, {hit['time_s'] / 60:.1f} min."
            )
        else:
            print(f"Reached {float(threshold):+g}: not (yet).")
    for p in test_points:
        print(
            f"Test mode at {p['frames']:,} frames: mean {p['mean_return']:+.2f} "
            f"over {len(p['returns'])} games."
        )
    print(f"Plot: {args.out}")
    common.write_json(args.json, summary)


if __name__ == "__main__":
    main()
