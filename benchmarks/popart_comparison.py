"""PopArt against plain IMPALA on a multi-task Atari set, same frames.

Trains flagfiles/atari3_multitask.cfg (one agent on Pong, Breakout and
Ms. Pac-Man) three ways, one after the other:

  popart     --popart --reward_clipping=none
  unclipped  --reward_clipping=none (one value scale for every game)
  clipped    plain IMPALA: rewards clipped to [-1, 1]

then plays whole games with each run's final checkpoint (test mode,
--test_episodes per game), and with --plot draws each game's training
return (per life: training episodes end at a lost life) against frames, arm
by arm, and writes the record: test-mode returns, human-normalised scores
per game, their median and mean.

    python3 benchmarks/popart_comparison.py --root /tmp/popart     # all arms
    python3 benchmarks/popart_comparison.py --root /tmp/popart --arm popart
    python3 benchmarks/popart_comparison.py --root /tmp/popart --plot
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FLAGFILE = os.path.join(common.REPO, "flagfiles", "atari3_multitask.cfg")
ARMS = {
    "popart": ["--popart", "--reward_clipping=none"],
    "unclipped": ["--reward_clipping=none"],
    "clipped": ["--reward_clipping=abs_one"],
}
RECORD = os.path.join(common.REPO, "benchmarks", "results", "popart_comparison.json")
PLOT = os.path.join(common.REPO, "benchmarks", "plots", "popart_comparison.png")


def levels() -> list[str]:
    with open(FLAGFILE) as f:
        for line in f:
            if line.startswith("--level_name="):
                return line.strip().split("=", 1)[1].split(",")
    raise ValueError(f"{FLAGFILE} has no --level_name")


def run(command: list[str], log_path: str) -> int:
    print(" ".join(command), flush=True)
    with open(log_path, "a") as log:
        return subprocess.run(
            command, cwd=common.REPO, stdout=log, stderr=subprocess.STDOUT
        ).returncode


def train_and_test(arm: str, root: str, test_episodes: int, extra: list[str]) -> dict:
    logdir = os.path.join(root, arm)
    os.makedirs(root, exist_ok=True)
    experiment = [sys.executable, os.path.join(common.REPO, "experiment.py")]
    started = time.time()
    rc = run(
        [
            *experiment,
            f"--flagfile={FLAGFILE}",
            *ARMS[arm],
            *extra,
            f"--logdir={logdir}",
        ],
        os.path.join(root, f"{arm}.log"),
    )
    train_s = time.time() - started
    if rc != 0:
        raise SystemExit(f"{arm}: training exited {rc}; see {root}/{arm}.log")
    rc = run(
        [
            *experiment,
            "--mode=test",
            f"--level_name={','.join(levels())}",
            f"--test_num_episodes={test_episodes}",
            f"--logdir={logdir}",
        ],
        os.path.join(root, f"{arm}_test.log"),
    )
    if rc != 0:
        raise SystemExit(f"{arm}: test mode exited {rc}; see {root}/{arm}_test.log")
    return {"train_s": train_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="where the runs' logdirs go")
    parser.add_argument("--arm", choices=[*ARMS, "all"], default="all")
    parser.add_argument("--test_episodes", type=int, default=5)
    parser.add_argument("--plot", action="store_true", help="plot and write the record")
    parser.add_argument(
        "--references",
        default=None,
        help="with --plot: a JSON file {level: {random: R, best: B}}; each "
        "arm's test returns are then also normalised between them "
        "(normalised_scores), with their median and mean over the levels",
    )
    parser.add_argument(
        "extra", nargs="*", help="more experiment.py flags for training (after --)"
    )
    args = parser.parse_args()
    if not args.plot:
        arms = list(ARMS) if args.arm == "all" else [args.arm]
        for arm in arms:
            timing = train_and_test(arm, args.root, args.test_episodes, args.extra)
            with open(os.path.join(args.root, f"{arm}_timing.json"), "w") as f:
                json.dump(timing, f)
    else:
        references = None
        if args.references:
            with open(args.references) as f:
                references = json.load(f)
        plot(args.root, references=references)


def plot(root: str, window: int = 100, references: dict | None = None) -> None:
    """Per-game training returns of each arm against frames, and the record
    (test-mode returns and human-normalised scores of each arm)."""
    import learning_curve
    import matplotlib

    from families import atari57

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = levels()
    record = {"machine": common.machine_info(), "flagfile": FLAGFILE, "arms": {}}
    fig, axes = plt.subplots(1, len(games), figsize=(5 * len(games), 4.2))
    for arm, flags in ARMS.items():
        logdir = os.path.join(root, arm)
        results_path = os.path.join(logdir, "test_results.json")
        if not os.path.exists(results_path):
            print(f"{arm}: no test results in {logdir}; skipped")
            continue
        with open(results_path) as f:
            test = json.load(f)
        timing_path = os.path.join(root, f"{arm}_timing.json")
        timing = {}
        if os.path.exists(timing_path):
            with open(timing_path) as f:
                timing = json.load(f)
        entry = {
            "flags": flags,
            "train_s": timing.get("train_s"),
            "test": {
                game: {
                    "mean_return": test["levels"][game]["mean_return"],
                    "returns": test["levels"][game]["returns"],
                    "human_normalized": atari57.human_normalized_score(
                        game, test["levels"][game]["returns"]
                    ),
                }
                for game in games
            },
            "human_normalized": test.get("human_normalized", {}),
            "training_final_rolling_mean": {},
        }
        for ax, game in zip(axes, games, strict=True):
            episodes, _ = learning_curve.read_events(logdir, f"{game}/episode_return")
            if not episodes:
                continue
            frames = [e.frames / 1e6 for e in episodes]
            returns = common.rolling_mean([e.episode_return for e in episodes], window)
            entry["training_final_rolling_mean"][game] = float(returns[-1])
            entry["frames"] = max(entry.get("frames", 0), episodes[-1].frames)
            ax.plot(frames, returns, label=f"{arm} ({' '.join(flags)})")
        if "--popart" in flags:
            entry["popart_statistics"] = popart_statistics(logdir, games)
        if references is not None:
            entry["normalised"] = normalised_scores(
                {g: test["levels"][g]["returns"] for g in games}, references
            )
        record["arms"][arm] = entry
    for ax, game in zip(axes, games, strict=True):
        ax.set_title(game, fontsize=10)
        ax.set_xlabel("environment frames (millions, all games)")
        ax.set_ylabel(f"training return per life (mean of last {window})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "One shallow agent on three Atari games, 2-core CPU: PopArt with "
        "unclipped rewards, unclipped without PopArt, clipped",
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    common.write_json(RECORD, record)
    print(f"Wrote {PLOT}")
    print(table(record))


def popart_statistics(logdir: str, games: list[str]) -> dict:
    """Each game's mean and scale in the run's newest checkpoint."""
    import tensorflow as tf

    from learner import popart

    reader = tf.train.load_checkpoint(logdir)
    mean = reader.get_tensor("popart/mean")
    scale = popart.scale_from_moments(mean, reader.get_tensor("popart/second_moment"))
    return {
        game: {"mean": float(m), "scale": float(s)}
        for game, m, s in zip(games, mean, scale, strict=True)
    }


def normalised_scores(level_returns: dict, references: dict) -> dict:
    """Test-mode returns made comparable across levels of different reward
    scales: each level's mean return placed between its random policy's
    (0 %) and a reference run's (100 %, e.g. the best single-task run).

    level_returns: {level: [episode returns]}; references: {level:
    {"random": R, "best": B}} with B != R. Returns {"levels": {level:
    {"mean_return", "standard_error" (of the mean; 0 for one episode),
    "episodes", "normalised" (%)}}, "median", "mean"} (over the levels, %).
    """
    levels = {}
    for level, returns in level_returns.items():
        returns = np.asarray(returns, dtype=np.float64)
        if returns.size == 0:
            raise ValueError(f"{level}: no test episodes")
        random, best = references[level]["random"], references[level]["best"]
        if best == random:
            raise ValueError(f"{level}: its random and best references are equal")
        error = returns.std(ddof=1) / np.sqrt(returns.size) if returns.size > 1 else 0.0
        levels[level] = {
            "mean_return": float(returns.mean()),
            "standard_error": float(error),
            "episodes": int(returns.size),
            "normalised": float(100.0 * (returns.mean() - random) / (best - random)),
        }
    scores = [entry["normalised"] for entry in levels.values()]
    return {
        "levels": levels,
        "median": float(np.median(scores)),
        "mean": float(np.mean(scores)),
    }


def table(record: dict) -> str:
    games = levels()
    lines = [
        "| arm | "
        + " | ".join(f"{g} test return (human-normalised %)" for g in games)
        + " | median | mean | training time |",
        "|---" * (len(games) + 4) + "|",
    ]
    for arm, entry in record["arms"].items():
        cells = [
            f"{entry['test'][g]['mean_return']:.1f} "
            f"({entry['test'][g]['human_normalized']:.1f})"
            for g in games
        ]
        scores = entry["human_normalized"]
        minutes = f"{entry['train_s'] / 60:.0f} min" if entry.get("train_s") else ""
        lines.append(
            f"| {arm} | "
            + " | ".join(cells)
            + f" | {scores.get('median', float('nan')):.1f} "
            f"| {scores.get('mean', float('nan')):.1f} | {minutes} |"
        )
    for arm, entry in record["arms"].items():
        if "popart_statistics" in entry:
            lines.append("")
            lines.append(
                f"{arm}: statistics at the end: "
                + ", ".join(
                    f"{g} mean {s['mean']:.2f}, scale {s['scale']:.2f}"
                    for g, s in entry["popart_statistics"].items()
                )
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
