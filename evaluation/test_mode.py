"""Test mode (--mode=test): play each level with a checkpoint's weights.

`test` builds one actor per level (one environment, the training unroll),
restores the newest whole checkpoint and lets `play_episodes` run each
actor's unrolls until enough episodes have ended (recording the first one as
a GIF with --test_video_dir); it writes the returns, and a suite's
human-normalised scores, to <logdir>/test_results.json.
"""

import json
import os
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from absl import logging

import environments
import py_process
from actor.envs import create_flow_environment
from actor.unroll import build_actor
from agent import create_agent
from config import Config
from evaluation import video
from runtime import checkpoints, sessions
from runtime.errors import FlagError
from trajectory import ActorOutput

TEST_RESULTS_FILE = "test_results.json"


def play_episodes(
    session: tf.compat.v1.train.SingularMonitoredSession,
    actor_output: ActorOutput,
    level_name: str,
    num_episodes: int,
    recorder: video.EpisodeRecorder | None = None,
    progress_secs: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[float], list[int]]:
    """Returns the returns and the lengths (agent steps, each
    --num_action_repeats frames) of the first `num_episodes` episodes that
    end.

    Every `progress_secs` (--progress_secs) it logs the episodes ended and
    the agent steps played so far: a policy that never ends a game (a
    Breakout agent that never serves) plays every episode to the level's
    cap, 27,000 agent steps on Atari, and the log says it is still at work.

    Args:
      session: a session in which `actor_output`'s weights are restored.
      actor_output: one actor's unroll (env_outputs [T + 1, ...]).
      level_name: the level, for the log.
      num_episodes: how many episodes to play.
      recorder: when given, it gets every unroll, and writes the first
        episode's GIF when that episode ends.
      progress_secs: seconds between progress lines.
      clock: seconds, monotonic (a test's own clock).
    """
    env_outputs = actor_output.env_outputs
    fetches = {"done": env_outputs.done, "info": env_outputs.info}
    if recorder is not None:
        fetches["frames"] = env_outputs.observation[0]
    returns: list[float] = []
    steps: list[int] = []
    played = 0
    last_line = clock()
    while len(returns) < num_episodes:
        values = session.run(fetches)
        done, info = values["done"], values["info"]
        played += len(done) - 1
        # Step 0 repeats the previous unroll's last step. At a done step the
        # info is the ended episode's (its return and length).
        returns.extend(float(r) for r in info.episode_return[1:][done[1:]])
        steps.extend(int(n) for n in info.episode_step[1:][done[1:]])
        if recorder is not None and (
            path := recorder.add_unroll(values["frames"], done, info.episode_return)
        ):
            logging.info("Video of the first episode written to %s.", path)
        now = clock()
        if now - last_line >= progress_secs and len(returns) < num_episodes:
            last_line = now
            logging.info(
                "Level %s: %d of %d episodes ended, %d agent steps played.",
                level_name,
                len(returns),
                num_episodes,
                played,
            )
    del returns[num_episodes:], steps[num_episodes:]
    logging.info(
        "Level %s: mean return %.2f over %d episodes.",
        level_name,
        np.mean(returns),
        len(returns),
    )
    return returns, steps


def test(config: Config) -> dict:
    """Plays test_num_episodes episodes per level with the latest checkpoint.

    Logs the mean return per level (and the suite's human-normalised scores)
    and writes them to <logdir>/test_results.json. Returns that dict.
    """
    run, environment = config.run, config.environment
    level_names = environment.level_names
    # The newest checkpoint that reads back whole, found the way training
    # finds the one it resumes from; test mode writes nothing but its JSON.
    candidates = checkpoints.find_checkpoints(run.logdir)
    if not candidates:
        raise FlagError(
            f"--logdir={run.logdir}: no checkpoint to test; train first with "
            f"--mode=train --logdir={run.logdir}, or point --logdir at a run."
        )
    checkpoint = checkpoints.newest_whole_checkpoint(run.logdir, candidates, "testing")
    checkpoints.ensure_logdir(run.logdir)  # test_results.json goes there.
    if run.test_video_dir:
        checkpoints.ensure_logdir(run.test_video_dir, flag="test_video_dir")
    level_returns, level_steps = {}, {}
    with tf.Graph().as_default():
        # The actions are sampled from the policy: seeded, as training is,
        # so that a test run repeats on the same machine.
        tf.compat.v1.set_random_seed(run.seed)
        agent = create_agent(config.agent)
        outputs = {}
        for name in level_names:
            _, env = create_flow_environment(name, run.seed, environment, is_test=True)
            outputs[name], _ = build_actor(
                agent, env, name, config.learner.unroll_length
            )
        checkpoints.check_checkpoint_fits(
            checkpoint, run.logdir, config.describe_model()
        )
        with tf.compat.v1.train.SingularMonitoredSession(
            checkpoint_filename_with_path=checkpoint,
            hooks=[py_process.PyProcessHook()],
            config=sessions.session_config(),
        ) as session:
            logging.info("Testing %s from %s.", environment.level_name, checkpoint)
            for name in level_names:
                recorder = None
                if run.test_video_dir:
                    recorder = video.EpisodeRecorder(run.test_video_dir, name)
                level_returns[name], level_steps[name] = play_episodes(
                    session,
                    outputs[name],
                    name,
                    run.test_num_episodes,
                    recorder,
                    progress_secs=run.progress_secs,
                )
    results = {
        "level_name": environment.level_name,
        "checkpoint": checkpoint,
        "levels": {
            name: {
                "mean_return": float(np.mean(r)),
                "returns": r,
                "episode_steps": level_steps[name],
            }
            for name, r in level_returns.items()
        },
    }
    if environment.is_suite:
        scores = environments.suite_scores(environment.level_name, level_returns)
        results["human_normalized"] = scores
        logging.info("Human-normalised scores: %s", scores)
    path = os.path.join(run.logdir, TEST_RESULTS_FILE)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    logging.info("Test results written to %s.", path)
    print(results_table(results), flush=True)
    return results


def results_table(results: dict) -> str:
    """Test mode's results (the test_results.json dict) as a text table: a row
    per level (episodes, mean return, human-normalised score where the level
    has published human and random scores), then the suite's scores."""
    rows = [("level", "episodes", "mean return", "human-normalised %")]
    for level, record in results["levels"].items():
        score = environments.level_score(level, record["returns"])
        rows.append(
            (
                level,
                str(len(record["returns"])),
                f"{record['mean_return']:.2f}",
                "-" if score is None else _one_decimal(score),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for name, value in results.get("human_normalized", {}).items():
        what = (
            "estimate of the 57-game median"  # families/atari57.py
            if name == "median57_estimate"
            else f"human-normalised {name}"
        )
        lines.append(f"{results['level_name']} {what}: {_one_decimal(value)} %")
    return "\n".join(lines)


def _one_decimal(value: float) -> str:
    # A score a hair below zero (an agent at random level) rounds to "-0.0",
    # which reads as a sign that means something; it does not.
    text = f"{value:.1f}"
    return "0.0" if text == "-0.0" else text
