"""The TensorBoard scalars of one run, drawn as a PNG (for the README).

Reads every `events.out.tfevents.*` file under --logdir (what experiment.py's
learner writes; TensorBoard shows the same) and plots the chosen tags
against the environment frame count (the summaries' step), one panel each.

    python3 benchmarks/learning/scalars_plot.py --logdir /tmp/pong_demo \\
        --out benchmarks/plots/tensorboard_scalars.png
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import (
    common,  # noqa: E402
    figures,  # noqa: E402
)

DEFAULT_TAGS = (
    "atari/pong/episode_return",
    "total_loss",
    "policy_entropy",
    "frames_per_second",
)


def read_scalars(logdir: str, tags) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] sorted by step, from every events file."""
    rows, _ = common.read_scalar_events(logdir, lambda tag: tag in tags)
    values: dict[str, list[tuple[int, float]]] = {tag: [] for tag in tags}
    for _, step, tag, value in rows:
        values[tag].append((step, value))
    return {tag: sorted(points) for tag, points in values.items()}


def plot(scalars: dict, out: str, title: str) -> None:
    plt = figures.require_pyplot()

    fig, axes = plt.subplots(1, len(scalars), figsize=(3.2 * len(scalars), 2.8))
    for axis, (tag, points) in zip(axes, scalars.items(), strict=True):
        if points:
            steps, values = zip(*points, strict=True)
            # Episodes as dots (one per episode); the rest as lines.
            style = "." if tag.endswith("episode_return") else ".-"
            axis.plot([s / 1e6 for s in steps], values, style, markersize=3)
        axis.set_title(tag, fontsize=9)
        axis.set_xlabel("environment frames (millions)", fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--out", default="benchmarks/plots/tensorboard_scalars.png")
    parser.add_argument("--tags", default=",".join(DEFAULT_TAGS))
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    scalars = read_scalars(args.logdir, [t for t in args.tags.split(",") if t])
    for tag, points in scalars.items():
        print(f"{tag}: {len(points)} points")
    plot(scalars, args.out, args.title or args.logdir)
    print(f"Plot: {args.out}")


if __name__ == "__main__":
    main()
