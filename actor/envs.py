"""An actor's environments: their processes (not started) and the
FlowEnvironments the unroll steps, one environment to a process or several
(families/vector.py), and which level and seeds each actor plays.
"""

from __future__ import annotations

import environments
import py_process
from config import EnvironmentConfig


def create_flow_environment(
    level_name: str, seed: int, config: EnvironmentConfig, is_test: bool = False
) -> tuple[py_process.PyProcess, environments.FlowEnvironment]:
    """The level's environment process (not started) and its FlowEnvironment.

    `level_name` is one of `config.level_names`.
    """
    process = environments.create_environment(
        level_name,
        seed,
        is_test,
        **environments.run_options(level_name, config, is_test),
    )
    _set_timeout(process, config, num_envs=1)
    return process, environments.FlowEnvironment(process.proxy)


def create_flow_environments(
    level_name: str, seeds: list[int], config: EnvironmentConfig, is_test: bool = False
) -> tuple[py_process.PyProcess, environments.FlowEnvironment]:
    """len(seeds) environments of the level in one process (not started) and
    their FlowEnvironment (num_envs=len(seeds))."""
    process = environments.create_environment_vector(
        level_name,
        seeds,
        is_test,
        **environments.run_options(level_name, config, is_test),
    )
    _set_timeout(process, config, num_envs=len(seeds))
    return process, environments.FlowEnvironment(process.proxy, len(seeds))


def _set_timeout(
    process: py_process.PyProcess, config: EnvironmentConfig, num_envs: int
) -> None:
    # A hung environment (a stopped process, a library stuck in a loop) is
    # killed after this long; the actor then restarts it like a dead one. A
    # process of several environments steps them in turn: it gets as many
    # times the time.
    process.call_timeout_s = (config.timeout_secs * num_envs) or None


def actor_environments(
    level_name: str, seeds: list[int], config: EnvironmentConfig, envs_per_process: int
) -> tuple[tuple[py_process.PyProcess, ...], tuple[environments.FlowEnvironment, ...]]:
    """One actor's environments, one per seed: their processes (not started)
    and FlowEnvironments, one environment to a process, or envs_per_process
    (a divisor of len(seeds)) to a process when it is more than 1."""
    if envs_per_process < 1 or len(seeds) % envs_per_process:
        raise ValueError(
            f"envs_per_process={envs_per_process} does not divide the actor's "
            f"{len(seeds)} environments."
        )
    if envs_per_process == 1:
        made = [create_flow_environment(level_name, s, config) for s in seeds]
    else:
        made = [
            create_flow_environments(
                level_name, seeds[j : j + envs_per_process], config
            )
            for j in range(0, len(seeds), envs_per_process)
        ]
    processes, envs = zip(*made, strict=True)
    return processes, envs


def actor_level_and_seeds(
    level_names, index: int, seed: int, envs_per_actor: int
) -> tuple[str, list[int]]:
    """Actor `index`'s level and its environments' seeds, for the
    single-machine actors and the cluster's actor tasks alike: the levels
    round-robin (actor i plays level i mod len(level_names), as the reference
    assigns them) and environment k of actor i has seed
    `seed + i * envs_per_actor + k`."""
    level_name = level_names[index % len(level_names)]
    return level_name, [
        seed + index * envs_per_actor + k for k in range(envs_per_actor)
    ]
