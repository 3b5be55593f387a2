"""--popart end to end on the real ALE: one agent on two Atari games with
unclipped rewards trains, keeps per-level statistics that move with each
level's targets, writes them to TensorBoard and to its checkpoints, resumes
with them, and evaluates in test mode; and without --popart the graph is the
paper's (no statistics, one value per step). The loss itself is tested in
tests/popart_test.py; the cluster actor tasks in tests/distributed_test.py.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import run_experiment

from actor.unroll import actor_output_specs
from agent import create_agent
from config import AgentConfig, LearnerConfig
from learner import pipeline
from learner.loss import REWARD_CLIPPINGS

LEVELS = "atari/pong,atari/breakout"
RUN = [
    f"--level_name={LEVELS}",
    "--agent=shallow",
    "--num_actors=2",
    "--envs_per_actor=1",
    "--envs_per_process=1",
    "--batch_size=2",
    "--unroll_length=20",
    "--popart",
    "--reward_clipping=none",
    # Far from the paper's 3e-4, so that a few updates move the statistics
    # visibly.
    "--popart_beta=0.3",
]
VECTOR = [*RUN, "--envs_per_actor=2", "--envs_per_process=2"]


def statistics(prefix: str) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {
        name: reader.get_tensor(name)
        for name in (
            "popart/mean",
            "popart/second_moment",
            "popart/count",
            "agent/baseline/w",
        )
    }


def newest(logdir: str) -> tuple[int, str]:
    prefix = tf.train.latest_checkpoint(logdir)
    return int(prefix.rsplit("-", 1)[1]), prefix


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Vector actors: each actor steps 2 games of its level in one process."""
    logdir = str(tmp_path_factory.mktemp("popart") / "run")
    result = run_experiment(
        *VECTOR, "--total_environment_frames=3000", f"--logdir={logdir}"
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return logdir, result.stderr


@pytest.mark.slow
def test_two_games_train_with_per_level_statistics(trained):
    logdir, output = trained
    assert re.search(
        rf"Training {LEVELS} \(2 levels, 18 actions\), shallow agent, 2 actors x 2 "
        r"environments \(2 per process\), batch 2, unroll 20, PopArt, unclipped "
        r"rewards, ",
        output,
    ), output[-3000:]
    _, prefix = newest(logdir)
    saved = statistics(prefix)
    assert saved["popart/mean"].shape == (2,)
    assert saved["agent/baseline/w"].shape == (256, 2)
    # Both games' trajectories reached the learner, each moved its own level.
    assert np.all(saved["popart/mean"] != 0.0), saved
    assert np.all(saved["popart/second_moment"] != 1.0), saved
    # Each level's mean and scale are in TensorBoard.
    tags = set()
    for path in glob.glob(f"{logdir}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    for level in LEVELS.split(","):
        assert {f"popart/{level}/mean", f"popart/{level}/scale"} <= tags, tags
        assert {
            f"levels/{level}/mean_abs_pg_advantage",
            f"levels/{level}/gradient_share",
        } <= tags, tags
    assert saved["popart/count"].shape == (2,) and np.all(saved["popart/count"] > 0)
    # Per-level episode returns (a Pong game outlasts this short run).
    assert "atari/breakout/episode_return" in tags


@pytest.mark.slow
def test_statistics_are_restored_on_resume(trained):
    """The resumed run saves its first checkpoint at the frame count it
    resumed from, with what it restored: the statistics as they were, not
    mean 0 and second moment 1."""
    logdir, _ = trained
    step, prefix = newest(logdir)
    before = statistics(prefix)
    result = run_experiment(
        *VECTOR, f"--total_environment_frames={step + 1000}", f"--logdir={logdir}"
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"Resuming from a checkpoint at {step} " in result.stderr
    resaved = statistics(f"{logdir}/model.ckpt-{step}")
    for name, value in before.items():
        np.testing.assert_array_equal(resaved[name], value, err_msg=name)
    later_step, later = newest(logdir)
    assert later_step > step
    assert np.any(statistics(later)["popart/mean"] != before["popart/mean"])


@pytest.mark.slow
def test_test_mode_evaluates_a_popart_checkpoint(trained):
    """Test mode sizes the value head from the checkpoint (--popart need not
    be repeated) and plays whole games of both levels."""
    logdir, _ = trained
    result = run_experiment(
        "--mode=test",
        f"--level_name={LEVELS}",
        "--test_num_episodes=1",
        f"--logdir={logdir}",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with open(f"{logdir}/test_results.json") as f:
        results = json.load(f)
    assert sorted(results["levels"]) == sorted(LEVELS.split(","))
    assert all(len(r["returns"]) == 1 for r in results["levels"].values())
    # A list of levels scores as a suite does: median and mean of its games.
    assert set(results["human_normalized"]) == {"median", "mean"}


def test_a_single_level_with_popart_has_one_normalised_value():
    agent = create_agent(
        AgentConfig("shallow", num_actions=6, use_instruction=False, num_values=1)
    )
    assert agent.num_values == 1


def test_without_popart_the_graph_is_the_papers(tmp_path):
    """The default learner graph: no statistics variables, a value head of
    one output, a value per step ([T + 1, B]) in the agent's outputs."""
    import run_helpers

    config = run_helpers.small_config(str(tmp_path))
    assert not config.learner.popart and config.agent.num_values == 0
    specs = actor_output_specs(
        config.environment, config.agent, config.learner.unroll_length
    )
    with tf.Graph().as_default():
        agent = create_agent(config.agent)
        queue = pipeline.create_queue(specs)
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, [queue], specs, config.learner, ["/cpu:0"]
        )
        names = {v.op.name for v in tf.compat.v1.global_variables()}
        assert not any(name.startswith("popart") for name in names), names
        assert agent.value_head.w.shape.as_list() == [256, 1]
        assert specs.agent_outputs.baseline.shape.as_list() == [21]
        vs = learner_pipeline.learner.vtrace_returns.vs
        assert vs.shape.as_list() == [20, 2]


def test_learner_config_defaults_leave_popart_off():
    config = LearnerConfig(
        batch_size=2, unroll_length=20, num_action_repeats=4, total_environment_frames=1
    )
    assert not config.popart and REWARD_CLIPPINGS[0] == config.reward_clipping


@pytest.mark.slow
def test_resuming_a_popart_run_with_popart_off_names_the_flag(trained):
    """Without the flag a resume takes --popart from the run's record; given
    off, it is refused before anything is built, the record kept."""
    logdir, _ = trained
    plain = [flag for flag in RUN if not flag.startswith("--popart")]
    record = (Path(logdir) / "run_record.json").read_text()
    result = run_experiment(
        *plain,
        "--popart=false",
        "--total_environment_frames=10000000",
        f"--logdir={logdir}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        "--popart=false: the run in this --logdir was trained with --popart=true"
        in result.stderr
    )
    assert "drop the flag to keep the run's" in result.stderr
    assert (Path(logdir) / "run_record.json").read_text() == record


@pytest.mark.parametrize("suite,num_levels", [("atari57", 57), ("dmlab30", 30)])
def test_a_suite_gets_one_value_and_one_statistic_per_level(
    suite, num_levels, monkeypatch
):
    """The learner graph of a PopArt run on a whole suite (built, not run):
    DMLab-30 through the DeepMind Lab stand-in where the real one is absent."""
    from dmlab_helpers import STANDIN_DIR

    import experiment

    monkeypatch.syspath_prepend(STANDIN_DIR)
    flags = experiment.parse_flags(
        ["experiment.py", f"--level_name={suite}", "--agent=shallow", "--popart"]
    )
    config = experiment.config_from_flags(flags)
    assert config.agent.num_values == num_levels
    assert config.learner.level_names == config.environment.level_names
    with tf.Graph().as_default():
        agent = create_agent(config.agent)
        specs = actor_output_specs(
            config.environment, config.agent, config.learner.unroll_length
        )
        queue = pipeline.create_queue(specs)
        pipeline.build_learner_pipeline(
            agent, [queue], specs, config.learner, ["/cpu:0"]
        )
        shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
    assert shapes["popart/mean"] == [num_levels]
    assert shapes["agent/baseline/w"][-1] == num_levels
