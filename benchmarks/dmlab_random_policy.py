"""The random policy's episode return on a DeepMind Lab level: the baseline
for learning curves.

Plays --episodes whole episodes with uniformly random actions from the
agent's 9 actions, through the training environment class (96x72, 4 action
repeats, the training level settings, not test mode), in this process (no
agent, no TensorFlow). Prints each return, their mean and standard error.

    python3 benchmarks/dmlab_random_policy.py [--level explore_goal_locations_small] [--episodes 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dmlab  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="explore_goal_locations_small")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    level = dmlab.DMLAB30_PREFIX + args.level
    config = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}
    env = dmlab.PyProcessDmLab(level, config, 4, seed=args.seed)
    env.initial()
    rng = np.random.RandomState(args.seed)
    returns, episode_return = [], 0.0
    while len(returns) < args.episodes:
        reward, done, _ = env.step(rng.randint(len(dmlab.DEFAULT_ACTION_SET)))
        episode_return += float(reward)
        if done:
            returns.append(episode_return)
            print(f"episode {len(returns)}: return {episode_return:.1f}", flush=True)
            episode_return = 0.0
    env.close()
    mean = float(np.mean(returns))
    sem = float(np.std(returns, ddof=1) / np.sqrt(len(returns)))
    print(
        f"random policy on {args.level}: mean return {mean:.2f} +- {sem:.2f} (SEM) "
        f"over {len(returns)} episodes"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"level": args.level, "returns": returns, "mean": mean, "sem": sem}, f
            )


if __name__ == "__main__":
    main()
