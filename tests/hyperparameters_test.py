"""A running learner's learning rate, entropy cost, optimiser epsilon and
gradient clip changed in place (learner/hyperparameters.py) are the ones its
next update uses: read back from the optimiser's and the loss's own tensors
in the same session, no rebuild."""

from __future__ import annotations

import pytest
import tensorflow as tf
from run_helpers import random_unrolls, small_config

import agent as agent_lib
import trajectory
from actor.unroll import actor_output_specs
from learner.hyperparameters import MUTABLE
from learner.update import build_learner

UNROLL, BATCH = 5, 3


def _apply_ops(graph: tf.Graph, kind: str) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.type == kind]


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_changed_hyperparameters_are_the_next_updates(optimizer):
    config = small_config(
        batch_size=BATCH,
        unroll_length=UNROLL,
        optimizer=optimizer,
        learning_rate=0.001,
        entropy_cost=0.01,
        epsilon=0.1,
        max_grad_norm=40.0,
    )
    specs = actor_output_specs(config.environment, config.agent, UNROLL)
    unrolls = random_unrolls(specs, BATCH, config.agent.num_actions, ["atari/pong"])
    kind = "ResourceApplyRMSProp" if optimizer == "rmsprop" else "ResourceApplyAdam"
    with tf.Graph().as_default() as graph:
        agent = agent_lib.create_agent(config.agent)
        batch = trajectory.stack_unrolls(
            [tf.nest.map_structure(tf.constant, u) for u in unrolls]
        )
        learner = build_learner(agent, [batch], config.learner)
        applies = _apply_ops(graph, kind)
        assert applies
        # The optimiser's own inputs: epsilon and each variable's gradient.
        epsilon_input = applies[0].inputs[6 if optimizer == "rmsprop" else 8]
        gradients = [op.inputs[-1] for op in applies]
        clipped_norm = tf.linalg.global_norm(gradients)
        fetches = {
            "learning_rate": learner.learning_rate,
            "epsilon": epsilon_input,
            "entropy": learner.losses.entropy,
            "clipped_norm": clipped_norm,
        }
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            hyper = learner.hyperparameters
            assert hyper.read(session) == pytest.approx(
                dict(
                    learning_rate=0.001,
                    entropy_cost=0.01,
                    epsilon=0.1,
                    max_grad_norm=40.0,
                )
            )
            first = session.run({**fetches, "_": learner.train_and_count})
            assert first["learning_rate"] == pytest.approx(0.001)
            assert first["epsilon"] == pytest.approx(0.1)
            new = dict(
                learning_rate=0.0003,
                entropy_cost=0.05,
                epsilon=1e-5,
                max_grad_norm=1e-3,
            )
            hyper.assign(session, new)
            assert hyper.read(session) == pytest.approx(new)
            second = session.run({**fetches, "_": learner.train_and_count})
    frames = config.learner.frames_per_update
    decay = 1.0 - frames / config.learner.decay_frames
    # The decayed learning rate starts from the new value (one update in).
    assert second["learning_rate"] == pytest.approx(0.0003 * decay, rel=1e-5)
    assert second["epsilon"] == pytest.approx(1e-5)
    # The entropy term scales with its cost: 5x the cost, about 5x the term
    # (the policy moved one small step in between).
    assert second["entropy"] / first["entropy"] == pytest.approx(5.0, rel=0.05)
    # The gradients the optimiser applies are clipped to the new threshold.
    assert first["clipped_norm"] <= 40.0 + 1e-3
    assert second["clipped_norm"] == pytest.approx(1e-3, rel=1e-3)


def test_only_the_mutable_ones_can_be_set():
    config = small_config(batch_size=1, unroll_length=UNROLL)
    specs = actor_output_specs(config.environment, config.agent, UNROLL)
    (unroll,) = random_unrolls(specs, 1, config.agent.num_actions, ["atari/pong"])
    with tf.Graph().as_default():
        agent = agent_lib.create_agent(config.agent)
        batch = trajectory.stack_unrolls([tf.nest.map_structure(tf.constant, unroll)])
        learner = build_learner(agent, [batch], config.learner)
        names = sorted(
            v.op.name
            for v in tf.compat.v1.local_variables()
            if v.op.name.startswith("mutable_hyperparameters/")
        )
        saved = {v.op.name for v in tf.compat.v1.global_variables()}
        summaries = tf.compat.v1.summary.merge(
            [
                op
                for op in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
                if op.op.name.startswith("hyperparameters/")
            ]
        )
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            tags = {
                value.tag
                for value in tf.compat.v1.Summary.FromString(
                    session.run(summaries)
                ).value
            }
            with pytest.raises(ValueError, match="not mutable: \\['discounting'\\]"):
                learner.hyperparameters.assign(session, {"discounting": 0.9})
    # Local variables: never in a checkpoint.
    assert names == sorted(f"mutable_hyperparameters/{n}" for n in MUTABLE)
    assert not set(names) & saved
    # TensorBoard shows each under exactly its name (no "_1" suffix).
    assert {f"hyperparameters/{n}" for n in MUTABLE} <= tags
