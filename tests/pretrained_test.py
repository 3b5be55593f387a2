"""The committed Pong agent, pretrained/atari_pong: what it holds, and the
README's command that evaluates it (with a video, decoded back here).

These use the committed files themselves, not a stand-in; test mode writes
its results into --logdir, so the command runs on a copy.
"""

import json
import os
import shutil

import imageio.v3 as iio
import numpy as np
import pytest
import tensorflow as tf
from run_helpers import REPO_ROOT, run_experiment

import agent as agent_lib
from runtime import checkpoints

PRETRAINED = os.path.join(REPO_ROOT, "pretrained", "atari_pong")
MAX_BYTES = 8 * 2**20  # the bound on committed weights


def agent_variables() -> dict[str, list[int]]:
    """Name -> shape of every variable of the agent the README's command
    builds for atari/pong (the shallow agent, 6 actions, no instructions)."""
    with tf.Graph().as_default():
        agent = agent_lib.Agent(6, torso="shallow", use_instruction=False)
        frame = tf.zeros([1, 1, 84, 84, 4], tf.uint8)
        agent.unroll(
            tf.zeros([1, 1], tf.int32),
            _step_output(frame),
            agent.initial_state(1),
        )
        return {v.op.name: v.shape.as_list() for v in agent.variables}


def _step_output(frame):
    from families.contract import StepOutput

    zeros = tf.zeros([1, 1])
    return StepOutput(
        reward=zeros,
        info=None,
        done=tf.zeros([1, 1], tf.bool),
        observation=(frame, tf.fill([1, 1], "")),
    )


def test_pretrained_folder_holds_the_shallow_agents_weights_only():
    files = os.listdir(PRETRAINED)
    size = sum(os.path.getsize(os.path.join(PRETRAINED, f)) for f in files)
    assert size <= MAX_BYTES, size
    saved = dict(tf.train.list_variables(PRETRAINED))
    assert all(checkpoints.is_weight(name) for name in saved), sorted(saved)
    assert checkpoints.saved_agent(PRETRAINED, agent_lib.TORSOS) == ("shallow", True)
    # Exactly the variables, with the shapes, of the agent test mode builds.
    assert {n: list(s) for n, s in saved.items()} == agent_variables()
    for name in saved:
        assert np.all(np.isfinite(tf.train.load_variable(PRETRAINED, name))), name


def test_readme_command_evaluates_the_agent_and_writes_a_video(tmp_path):
    logdir = tmp_path / "atari_pong"
    shutil.copytree(PRETRAINED, logdir)
    videos = tmp_path / "videos"
    # The README's command (3 episodes, as it says), with the video flag.
    result = run_experiment(
        "--mode=test",
        "--level_name=atari/pong",
        f"--logdir={logdir}",
        "--test_num_episodes=3",
        f"--test_video_dir={videos}",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(logdir / "test_results.json") as f:
        returns = json.load(f)["levels"]["atari/pong"]["returns"]
    # The agent samples its actions (seeded by --seed: the same games on one
    # machine; another CPU's arithmetic may play others). It scored +19.2
    # over 10 games on one machine, +15.75 over 8 unseeded games on another
    # (+7 to +20), and wins every game; a broken restore, a wrong action set
    # or a scrambled frame plays at about -21.
    assert len(returns) == 3 and min(returns) > 0, returns
    assert sum(returns) / 3 >= 12, returns
    (gif,) = videos.iterdir()
    assert gif.name == f"atari_pong_return{returns[0]:+g}.gif"
    pictures = iio.imread(gif, index=None)
    # A whole game: 21 points to one side, each a few dozen agent steps or
    # more (identical consecutive frames are merged by the GIF writer).
    assert len(pictures) >= 500, len(pictures)
    assert pictures.shape[1:3] == (252, 252)  # 84 x 84, enlarged 3x
    assert pictures.dtype == np.uint8
    assert len(np.unique(pictures)) > 2


@pytest.mark.parametrize(
    "name,weight",
    [
        ("agent/shallow_torso/conv1/w", True),
        ("agent/core_lstm/w_i", True),
        ("agent/shallow_torso/conv1/w/RMSProp", False),
        ("agent/shallow_torso/conv1/w/Adam", False),
        ("agent/shallow_torso/conv1/w/Adam_1", False),
        ("beta1_power", False),
        ("global_step", False),
    ],
)
def test_optimiser_slots_are_not_weights(name, weight):
    """export_weights keeps the agent's weights only, RMSProp's and Adam's
    slots out."""
    assert checkpoints.is_weight(name) is weight
