"""Test-mode scores of each checkpoint a training run kept: whole games
during training.

A training run's episode returns are per life on Atari (loss of life ends a
training episode, atari.py) and come from the sampling policy, so they are not
the figures published scores are. This script plays `--episodes` whole games
(test mode, `experiment.py --mode=test`) with each checkpoint in `--logdir`,
oldest first, and writes one record per checkpoint:

    {"frames": 12345, "wall_time": ..., "mean_return": 3.1, "returns": [...]}

`frames` is the checkpoint's environment-frame count (its name), `wall_time`
the modification time of its index file (when it was written), so
benchmarks/learning/learning_curve.py --test_points can draw the records on both of its
panels.

Each checkpoint is tested from a scratch directory holding links to its files
only (test mode always takes a directory's newest checkpoint); the run's
directory is only read.

    python3 benchmarks/learning/evaluate_checkpoints.py --logdir /tmp/runs/breakout \\
        --level_name=atari/breakout --episodes 10 \\
        --out benchmarks/results/breakout_checkpoints.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402

ROOT = common.REPO
_STEP = re.compile(r"model\.ckpt-(\d+)$")


def checkpoint_prefixes(logdir: str) -> list[str]:
    """`model.ckpt-N` prefixes in logdir with an index file, oldest first."""
    prefixes = []
    for index in glob.glob(os.path.join(glob.escape(logdir), "model.ckpt-*.index")):
        prefix = index[: -len(".index")]
        if _STEP.search(prefix):
            prefixes.append(prefix)
    return sorted(prefixes, key=lambda p: int(_STEP.search(p).group(1)))


def evaluate(prefix: str, level_name: str, episodes: int, extra: list[str]) -> dict:
    """Test mode on checkpoint `prefix` alone; its record."""
    with tempfile.TemporaryDirectory(prefix="evaluate_checkpoint_") as scratch:
        for path in glob.glob(glob.escape(prefix) + ".*"):
            if not path.endswith(".meta"):  # Test mode builds its own graph.
                os.symlink(
                    os.path.abspath(path), os.path.join(scratch, os.path.basename(path))
                )
        command = [
            sys.executable,
            os.path.join(ROOT, "experiment.py"),
            "--mode=test",
            f"--level_name={level_name}",
            f"--logdir={scratch}",
            f"--test_num_episodes={episodes}",
            *extra,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        results_path = os.path.join(scratch, "test_results.json")
        if result.returncode != 0 or not os.path.exists(results_path):
            raise RuntimeError(
                f"test mode on {prefix} exited {result.returncode}:\n"
                + result.stderr[-3000:]
            )
        with open(results_path) as f:
            results = json.load(f)
    level = results["levels"][level_name]
    return {
        "checkpoint": prefix,
        "frames": int(_STEP.search(prefix).group(1)),
        "wall_time": os.path.getmtime(prefix + ".index"),
        "mean_return": level["mean_return"],
        "returns": level["returns"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--logdir", required=True, help="the training run's --logdir")
    parser.add_argument("--level_name", required=True)
    parser.add_argument("--episodes", type=int, default=10, help="games per checkpoint")
    parser.add_argument(
        "--out", required=True, help='the JSON record written ({"checkpoints": [...]})'
    )
    parser.add_argument(
        "extra",
        nargs="*",
        help="more experiment.py flags for test mode (after --), e.g. --seed=2",
    )
    args = parser.parse_args()
    prefixes = checkpoint_prefixes(args.logdir)
    if not prefixes:
        sys.exit(f"evaluate_checkpoints.py: --logdir={args.logdir} holds no checkpoint")
    records = []
    for prefix in prefixes:
        record = evaluate(prefix, args.level_name, args.episodes, args.extra)
        records.append(record)
        print(
            f"{record['frames']:>12,} frames: mean return {record['mean_return']:+.2f} "
            f"over {len(record['returns'])} games",
            flush=True,
        )
    common.write_json(args.out, {"checkpoints": records})


if __name__ == "__main__":
    main()
