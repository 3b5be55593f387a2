"""The random policy's episode return on any level: the baseline for
learning curves.

Plays --episodes whole episodes with uniformly random actions from the
agent's action set, through the training environment class of the level's
family (`environments.environment_class`: 4 action repeats, the training
settings, not test mode), in this process (no agent, no TensorFlow). Prints
each return, their mean and standard error. --run_levels gives the level
the environment settings and action set of a run of several levels (a
multi-task run's ViZDoom scenarios share the suite's 10 actions, where a
scenario alone has its own 3 to 7).

    python3 benchmarks/learning/random_policy.py --level explore_goal_locations_small --episodes 8
    python3 benchmarks/learning/random_policy.py --level vizdoom/defend_the_center --episodes 20
    python3 benchmarks/learning/random_policy.py --level vizdoom/take_cover \
        --run_levels vizdoom/defend_the_center,vizdoom/take_cover
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
import config  # noqa: E402
import environments  # noqa: E402
from benchmarks.core import common  # noqa: E402 - it puts the repository on the path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="explore_goal_locations_small")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--run_levels",
        default="",
        help="the levels of the run whose settings and actions to use "
        "(comma-separated); default: --level alone",
    )
    args = parser.parse_args()
    (level,) = environments.expand_level_names(args.level)
    run_levels = args.run_levels or level
    level_names = tuple(
        name
        for part in run_levels.split(",")
        for name in environments.expand_level_names(part)
    )
    run = config.EnvironmentConfig(
        level_name=run_levels,
        level_names=level_names,
        num_actions=environments.num_actions(level_names),
    )
    options = environments.family_of(level).run_options(run, is_test=False)
    env_type, kwargs = environments.environment_class(level, args.seed, **options)
    env = env_type(**kwargs)
    env.initial()
    num_actions = run.num_actions
    rng = np.random.RandomState(args.seed)
    returns, episode_return = [], 0.0
    while len(returns) < args.episodes:
        reward, done, _ = env.step(rng.randint(num_actions))
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
    common.write_json(
        args.json,
        {
            "level": args.level,
            "run_levels": run_levels,
            "num_actions": num_actions,
            "returns": returns,
            "mean": mean,
            "sem": sem,
        },
    )


if __name__ == "__main__":
    main()
