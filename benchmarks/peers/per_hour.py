"""Learning per hour, side by side: ours and a peer (CleanRL's PPO by
default), each alone on the machine for the same wall-clock time, in turn,
in one invocation; each one's curve (the mean return of its last 100 whole
games) against minutes and against frames.

    python3 benchmarks/peers/per_hour.py --level atari/phoenix --minutes 60 \
        --json benchmarks/results/per_hour_phoenix.json \
        --figure benchmarks/plots/per_hour_phoenix.png

Ours is `python3 experiment.py --level_name=LEVEL` and nothing else (the
family's defaults; benchmarks/learning/train_until.py runs and stops it);
the peer is its script in benchmarks/peers/ at its own defaults
(cleanrl_ppo_peer.sh says what had to change to run on a CPU). Both count
frames with the frame skip of 4 and score whole games, unclipped.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common, figures  # noqa: E402
from benchmarks.learning import train_until  # noqa: E402
from benchmarks.peers import peers  # noqa: E402

WINDOW = 100
POINT_MINUTES = 1.0


def gym_id(level: str) -> str:
    """atari/ms_pacman -> MsPacmanNoFrameskip-v4 (the ids CleanRL trains on:
    no frame skip in the emulator, the wrappers skip 4)."""
    game = level.split("/", 1)[1]
    return "".join(word.capitalize() for word in game.split("_")) + "NoFrameskip-v4"


def episode_curve(
    episodes: list[tuple[float, int, float]], minutes: float, every: float
) -> list[dict]:
    """A curve from (seconds, frames, return) games: a point every `every`
    minutes up to `minutes`, with the frames of the last game by then and
    the mean of the last WINDOW games (None before the first)."""
    points, recent, frames, index = [], collections.deque(maxlen=WINDOW), 0, 0
    ordered = sorted(episodes)
    steps = int(round(minutes / every))
    for k in range(1, steps + 1):
        limit = k * every * 60
        while index < len(ordered) and ordered[index][0] <= limit:
            _, frames, value = ordered[index]
            recent.append(value)
            index += 1
        mean = round(sum(recent) / len(recent), 2) if recent else None
        points.append(dict(minutes=round(k * every, 2), frames=frames, mean=mean))
    return points


def run_ours(level: str, minutes: float) -> dict:
    logdir = tempfile.mkdtemp(prefix="per_hour_")
    flags = [f"--level_name={level}", f"--logdir={logdir}/run"]
    curve = train_until.Curve(WINDOW, [])
    ended, status, seconds = train_until.train(
        flags,
        os.path.join(logdir, "log.txt"),
        curve,
        minutes=minutes,
        point_secs=POINT_MINUTES * 60,
    )
    return dict(
        command="python3 experiment.py " + flags[0],
        ended=ended,
        exit_status=status,
        frames=curve.frames,
        frames_per_s=round(curve.frames / seconds) if seconds else None,
        mean_return=curve.record()["last_mean"],
        unit=curve.unit,
        curve=curve.points,
        logdir=logdir,
    )


def run_peer(peer: peers.Peer, level: str, minutes: float) -> dict:
    result = peers.run(peer, minutes * 60, {"CLEANRL_ENV": gym_id(level)})
    result["curve"] = episode_curve(result.pop("episodes"), minutes, POINT_MINUTES)
    result["unit"] = "game"
    return result


def draw(record: dict, path: str):
    """Two panels: each side's curve against minutes, and against frames."""
    plt = figures.require_pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for index, (label, side) in enumerate(record["sides"].items()):
        points = [p for p in side["curve"] if p.get("mean") is not None]
        means = [p["mean"] for p in points]
        axes[0].plot([p["minutes"] for p in points], means, color=f"C{index}")
        axes[1].plot(
            [p["frames"] / 1e6 for p in points], means, color=f"C{index}", label=label
        )
    axes[0].set_xlabel("minutes, each alone on the machine")
    axes[1].set_xlabel(figures.X_LABEL)
    axes[0].set_ylabel(f"mean return, last {WINDOW} training games")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    figure.suptitle(f"{record['level']}: {record['minutes']:g} minutes each")
    figure.tight_layout()
    figures.save(figure, path)
    plt.close(figure)
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--level", default="atari/phoenix")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--json", required=True)
    parser.add_argument("--figure", default=None)
    args = parser.parse_args(argv)
    if not args.level.startswith("atari/"):
        parser.error(f"--level={args.level}: an Atari level (atari/<game>)")
    print(common.machine_line(), flush=True)
    record = dict(
        machine=common.machine_info(),
        level=args.level,
        minutes=args.minutes,
        load_start=common.loadavg(),
        sides={},
    )
    record["sides"]["ours"] = run_ours(args.level, args.minutes)
    common.write_json(args.json, record)
    peer = peers.CLEANRL_PPO
    record["sides"][peer.label] = run_peer(peer, args.level, args.minutes)
    record["load_end"] = common.loadavg()
    common.write_json(args.json, record)
    for label, side in record["sides"].items():
        print(
            f"{label}: {side['frames']} frames, {side['frames_per_s']} frames/s, "
            f"mean of the last {WINDOW} games {side['mean_return']}"
        )
    if args.figure:
        draw(record, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
