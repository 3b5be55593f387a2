"""The ViZDoom family on the real vizdoom package: specs, a whole episode,
seeds, the action sets, training and test mode end to end, a killed
environment process restarted, and unknown scenarios."""

from __future__ import annotations

import glob
import json
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import (
    one_error_line,
    process_exists,
    run_and_kill_one_environment,
    run_command_line,
    run_experiment,
)

import environments
from families import doom

SMALL = [
    "--agent=shallow",
    "--num_actors=2",
    # One environment an actor (ViZDoom's defaults give each actor 4).
    "--envs_per_actor=1",
    "--envs_per_process=1",
    "--batch_size=2",
    "--unroll_length=20",
    "--level_cache_dir=",
]


@pytest.fixture
def game():
    """Makes PyProcessVizdoom environments in this process; closes them."""
    made = []

    def make(scenario: str, seed: int = 1, **kwargs) -> doom.PyProcessVizdoom:
        made.append(doom.PyProcessVizdoom(scenario, seed, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()


@pytest.mark.parametrize("scenario", doom.SCENARIOS)
def test_the_action_sets_use_the_buttons_the_engine_offers(scenario, game):
    env = game(scenario)
    engine_buttons = [str(b).split(".")[-1] for b in env._game.get_available_buttons()]
    assert list(doom.scenario_buttons(scenario)) == engine_buttons
    actions = doom.scenario_actions(scenario)
    assert actions[0] == () and len(set(actions)) == len(actions)
    assert {b for action in actions for b in action} == set(engine_buttons)
    assert environments.num_actions([doom.PREFIX + scenario]) == len(actions)


def test_outputs_match_the_specs_and_an_episode_ends_at_the_scenarios_timeout(game):
    """basic: 300 tics, -1 a tic; with no-op (action 0) every episode lasts
    75 agent steps of 4 tics and returns -300; the step that ends it returns
    the first frame of the next episode."""
    env = game("basic", seed=3)
    frame, instruction = env.initial()
    specs = doom.PyProcessVizdoom._tensor_specs("step", {}, {})
    assert frame.shape == tuple(specs[2][0].shape) == (72, 96, 3)
    assert frame.dtype == np.uint8 and frame.std() > 0 and instruction == ""
    assert specs[0].dtype == tf.float32 and specs[1].dtype == tf.bool
    for _ in range(2):
        rewards, done, steps = [], False, 0
        while not done:
            reward, done, (frame, _) = env.step(0)
            assert reward.dtype == np.float32 and done.dtype == np.bool_
            rewards.append(float(reward))
            steps += 1
        assert steps == 75 and sum(rewards) == -300.0
        assert frame.shape == (72, 96, 3) and frame.std() > 0


def test_seeds_are_honoured(game):
    """my_way_home starts in a random room: the same seed gives the same
    first frames, another seed other ones."""
    first = [game("my_way_home", seed=s).initial()[0] for s in (5, 5, 6)]
    assert np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])


def test_a_shared_policy_uses_the_suites_actions(game):
    """Several scenarios in one run share SUITE_ACTIONS; an action whose
    buttons a scenario does not offer does nothing there."""
    names = environments.expand_level_names("vizdoom")
    assert names == [doom.PREFIX + s for s in doom.SCENARIOS]
    assert environments.num_actions(names) == len(doom.SUITE_ACTIONS) == 10
    env = game("basic", shared_actions=True)
    # basic's buttons: MOVE_LEFT, MOVE_RIGHT, ATTACK.
    by_name = dict(zip(doom.SUITE_ACTIONS, env._actions, strict=True))
    assert by_name[("ATTACK",)] == [0, 0, 1]
    assert by_name[("MOVE_LEFT",)] == [1, 0, 0]
    assert by_name[("TURN_LEFT",)] == [0, 0, 0]
    assert by_name[("MOVE_FORWARD", "TURN_LEFT")] == [0, 0, 0]


@pytest.mark.parametrize(
    "level, expected",
    [
        ("vizdoom/no_such_scenario", "not a ViZDoom scenario of this family"),
        ("vizdoom/my_way_hom", "vizdoom/my_way_home"),
        ("vizdoom/deathmatch", "single-agent scenarios"),
    ],
)
def test_an_unknown_scenario_is_one_line_naming_the_flag(
    level, expected, tmp_path, capsys
):
    # experiment.py's command line, in this process (its exit code as a
    # process: experiment_test's bad-flag processes).
    code = run_command_line(*SMALL, f"--level_name={level}", f"--logdir={tmp_path}")
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"experiment.py: error: Unknown --level_name='{level}'")
    assert expected in line
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_training_and_test_mode_end_to_end(tmp_path):
    """Two actors of 2 environments each, sharing one process (the family
    allows several per process); then test mode with a GIF."""
    logdir = str(tmp_path / "run")
    train = run_experiment(
        *SMALL,
        "--level_name=vizdoom/basic",
        "--envs_per_actor=2",
        "--envs_per_process=2",
        f"--logdir={logdir}",
        "--total_environment_frames=3200",
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert glob.glob(os.path.join(logdir, "model.ckpt-*.index"))
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    episodes = re.findall(
        r"Episode on vizdoom/basic: return (-?[\d.]+), (\d+) frames", train.stderr
    )
    assert episodes and all(int(frames) <= 300 for _, frames in episodes)
    videos = str(tmp_path / "videos")
    test = run_experiment(
        *SMALL,
        "--level_name=vizdoom/basic",
        f"--logdir={logdir}",
        "--mode=test",
        "--test_num_episodes=2",
        f"--test_video_dir={videos}",
    )
    assert test.returncode == 0, test.stderr[-3000:]
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    assert len(results["levels"]["vizdoom/basic"]["returns"]) == 2
    assert glob.glob(os.path.join(videos, "vizdoom_basic_return*.gif"))


@pytest.mark.slow
def test_a_killed_vizdoom_process_is_restarted_and_leaves_no_engine(tmp_path):
    """ViZDoom runs its engine in a process of its own, under the environment
    process. When the environment process is SIGKILLed (a crash, the OOM
    killer), its engine goes with it once the restart is made, and every
    engine is gone once the run ends."""
    run = run_and_kill_one_environment(
        [
            *SMALL,
            "--level_name=vizdoom/defend_the_center",
            f"--logdir={tmp_path / 'run'}",
            "--save_checkpoint_secs=2",
            "--total_environment_frames=1000000000",  # stopped by SIGINT
        ],
        tmp_path / "run.log",
    )
    assert run.returncode == 128 + signal.SIGINT, run.output[-3000:]
    assert re.search(
        r"Actor \d \(vizdoom/defend_the_center\): environment failed: PyProcess "
        rf"PyProcessVizdoom \(pid {run.killed}\) died: killed by signal SIGKILL",
        run.output,
    ), run.output[-3000:]
    assert "environment restarted" in run.output
    # The check can fail: the environment processes had engines under them.
    assert all(run.started.values()), run.started
    assert run.left_after_restart == []
    started = [pid for pids in run.started.values() for pid in pids]
    assert [pid for pid in started if process_exists(pid)] == []
