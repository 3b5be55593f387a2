"""build_vector_actor: one actor stepping K real Pong environments.

What the learner relies on for each of the K unrolls an actor enqueues:
its own environment's steps, in order, overlapping the previous unroll of
the same environment by one step. (The log-rho test in experiment_test
checks the pairing of actions and observations through the learner.)
"""

import numpy as np
import tensorflow as tf
from run_helpers import small_config

import py_process
from actor.envs import create_flow_environment
from actor.unroll import build_vector_actor
from agent import create_agent
from learner import pipeline

UNROLL = 20
K = 3


def build():
    config = small_config()
    agent = create_agent(config.agent)
    processes, envs = zip(
        *(
            create_flow_environment("atari/pong", seed, config.environment)
            for seed in (1, 2, 3)
        ),
        strict=True,
    )
    output, reset = build_vector_actor(agent, list(envs), "atari/pong", UNROLL)
    return config, agent, processes, output, reset


def test_unrolls_are_batch_major_and_continue_per_environment():
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(2)
        _, agent, processes, output, _ = build()
        assert output.env_outputs.observation[0].shape == (K, UNROLL + 1, 84, 84, 1)
        assert output.agent_outputs.action.shape == (K, UNROLL + 1)
        assert output.agent_state.core.hidden.shape == (K, 256)
        # One frame a step; the 3 before the first step in the state.
        assert output.agent_state.frames.shape == (K, 3, 84, 84, 1)
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            first = session.run(output)
            second = session.run(output)
    assert list(first.level_name) == [b"atari/pong"] * K
    frames1, frames2 = (
        first.env_outputs.observation[0],
        second.env_outputs.observation[0],
    )
    for k in range(K):
        # Environment k's next unroll starts where its last one stopped.
        np.testing.assert_array_equal(frames2[k, 0], frames1[k, -1])
        assert second.agent_outputs.action[k, 0] == first.agent_outputs.action[k, -1]
        # All of the last step's agent outputs, the ones the next unroll's
        # loop does not read too (their reads must precede the update).
        np.testing.assert_array_equal(
            second.agent_outputs.policy_logits[k, 0],
            first.agent_outputs.policy_logits[k, -1],
        )
        assert (
            second.agent_outputs.baseline[k, 0] == first.agent_outputs.baseline[k, -1]
        )
    # K environments, not one repeated: their screens part ways (different
    # seeds give different no-op starts and different sampled actions).
    assert not np.array_equal(frames2[0], frames2[1])
    assert not np.array_equal(frames2[1], frames2[2])
    # Each in its own process.
    assert len({p.pid for p in processes}) == K


def test_the_queue_gets_k_unrolls_per_run():
    with tf.Graph().as_default():
        config, agent, _, output, _ = build()
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape[1:], t.dtype), output
        )
        queue = pipeline.create_queue(specs, capacity=K)
        enqueue = queue.enqueue_many(tf.nest.flatten(output))
        size = queue.size()
        dequeued = tf.nest.pack_sequence_as(specs, queue.dequeue_many(K))
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            session.run(enqueue)
            assert session.run(size) == K
            unrolls = session.run(dequeued)
    assert unrolls.env_outputs.reward.shape == (K, UNROLL + 1)
    assert unrolls.agent_state.core.cell.shape == (K, 256)
