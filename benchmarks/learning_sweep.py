"""Several learning runs on one figure: the rolling mean of the episode
return against environment frames and against wall-clock time.

Each run is LABEL=LOGDIR (its TensorBoard events, read as
learning_curve.py reads them). Prints, per run, the frames and minutes at
which the rolling mean of the last --window episodes first reached each
threshold.

    python3 benchmarks/learning_sweep.py --window 100 \\
        --run "batch 8, eps 1e-4=/tmp/runs/pong_b8" \\
        --run "batch 8, eps 0.01, 4x4 envs=/tmp/runs/pong_k4" \\
        --out benchmarks/plots/pong_sweep.png
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import learning_curve  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="append", required=True, help="LABEL=LOGDIR")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--thresholds", default="-20,-19,-15,0,15,18")
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="atari/pong: settings compared")
    args = parser.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.3), sharey=True)
    for spec in args.run:
        label, _, logdir = spec.rpartition("=")
        episodes, start = learning_curve.read_events(logdir)
        if not episodes:
            print(f"{label}: no episodes in {logdir}")
            continue
        returns = [e.episode_return for e in episodes]
        rolling = learning_curve.rolling_mean(returns, args.window)
        full = slice(args.window - 1, None)
        frames = [e.frames / 1e6 for e in episodes][full]
        minutes = [(e.wall_time - start) / 60 for e in episodes][full]
        by_frames.plot(frames, rolling[full], label=label)
        by_time.plot(minutes, rolling[full], label=label)
        summary = learning_curve.summarize(episodes, start, args.window, thresholds)
        print(f"{label} ({logdir}): {summary}")
    for threshold in thresholds:
        for ax in (by_frames, by_time):
            ax.axhline(threshold, color="grey", lw=0.5, ls=":")
    by_frames.set_xlabel("environment frames (millions)")
    by_time.set_xlabel("wall-clock minutes since the run started")
    by_frames.set_ylabel(f"mean return of the last {args.window} episodes")
    by_frames.legend(fontsize=8)
    for ax in (by_frames, by_time):
        ax.grid(alpha=0.3)
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"Plot: {args.out}")


if __name__ == "__main__":
    main()
