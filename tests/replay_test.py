"""Experience replay on the learner (learner/replay.py, pipeline.py) and the
policy lag (update.py's PolicyLag, the unrolls' policy_frames).

The buffer on its own (first in first out, uniform sampling with a fixed
seed, counted), the learner's pipeline with a real agent and queue (the exact
proportion in every batch, a replayed unroll's stored data, the lag against
a known schedule of updates), experiment.py's checks of the flags and the
memory, and training on one machine and as a cluster's learner task.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import (
    SMALL,
    random_unrolls,
    run_command_line,
    run_experiment,
    small_config,
)

import agent as agent_lib
from actor.unroll import actor_output_specs
from config import LearnerConfig, replayed_unrolls
from learner import pipeline, replay

UNROLL = 5
REPO = Path(__file__).resolve().parents[1]


def _buffer_graph(capacity: int, seed: int | None = None):
    """A buffer of unrolls that are one int64 id and one string each; a
    placeholder batch of ids to insert."""
    specs = (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.string))
    buffer = replay.ReplayBuffer(specs, capacity, seed=seed)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    insert = buffer.insert((ids, tf.strings.as_string(ids)))
    return buffer, ids, insert


def test_the_buffer_holds_the_newest_unrolls_first_in_first_out():
    with tf.Graph().as_default():
        buffer, ids, insert = _buffer_graph(capacity=4)
        contents = buffer.contents()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            assert session.run(buffer.size()) == 0
            held = []
            for batch in ([0, 1, 2], [3], [4, 5], [6, 7, 8, 9, 10]):
                session.run(insert, {ids: batch})
                held = (held + batch)[-4:]
                numbers, texts = session.run(contents)
                # The newest `capacity`, oldest first; each string stays
                # with its number.
                assert numbers.tolist() == held
                assert texts.tolist() == [str(i).encode() for i in held]
            assert session.run(buffer.size()) == 4


def test_sampling_is_uniform_over_the_unrolls_held():
    with tf.Graph().as_default():
        buffer, ids, insert = _buffer_graph(capacity=10, seed=7)
        sample = buffer.sample(1000)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            # 15 inserted: 5..14 held, 0..4 evicted.
            session.run(insert, {ids: list(range(15))})
            counts = np.zeros(15, int)
            for _ in range(20):
                numbers, texts = session.run(sample)
                assert [str(n).encode() for n in numbers] == texts.tolist()
                np.add.at(counts, numbers, 1)
    assert counts[:5].tolist() == [0] * 5
    # 20,000 draws over 10 unrolls: 2,000 each, binomial sd 42; the fixed
    # seed makes the counts the same on every run.
    assert counts.sum() == 20000
    assert all(1800 < n < 2200 for n in counts[5:]), counts


_PEAK_SCRIPT = """
import sys
import tensorflow as tf
from learner import replay

def peak_bytes():
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

tf.compat.v1.disable_eager_execution()
# 1 MiB unrolls of uint8, as Atari observations are.
specs = (tf.TensorSpec([1024, 1024], tf.uint8), tf.TensorSpec([], tf.int64))
buffer = replay.ReplayBuffer(specs, int(sys.argv[1]), seed=1)
batch = tf.ones([4, 1024, 1024], tf.uint8), tf.range(4, dtype=tf.int64)
step = buffer.insert_then_sample(batch, 4)
with tf.compat.v1.Session() as session:
    before = peak_bytes()
    session.run(tf.compat.v1.local_variables_initializer())
    for _ in range(3):
        session.run(step)
    print(peak_bytes() - before)
"""


def test_a_buffer_takes_its_own_size_of_memory_and_no_more():
    # Zeros of a constant shape as the initial value were folded into a
    # constant that the graph's executor kept beside the variable: 3.1 times
    # the buffer here before the fix (a 9.2 GB buffer crashed a run).
    capacity = 1024  # 1 GiB of uint8 unrolls
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(capacity)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    buffer_bytes = capacity * (2**20 + 8)
    grown = int(proc.stdout.split()[-1])
    # The buffer once, plus the step's own tensors (4 MiB of unrolls in,
    # 4 out) and what TensorFlow's first session run allocates.
    assert buffer_bytes <= grown < 1.25 * buffer_bytes, grown / buffer_bytes


def _learner_config(batch_size: int, proportion: float, capacity: int):
    config = small_config()
    return config.agent, LearnerConfig(
        batch_size=batch_size,
        unroll_length=UNROLL,
        num_action_repeats=4,
        total_environment_frames=10**6,
        learning_rate=0.001,
        replay_proportion=proportion,
        replay_capacity=capacity,
        level_names=("atari/pong",),
    )


@pytest.mark.parametrize(
    "batch_size,proportion", [(4, 0.5), (3, 0.3), (5, 0.75)], ids=["2+2", "2+1", "1+4"]
)
def test_each_batch_replays_exactly_its_share_with_the_stored_unrolls(
    batch_size, proportion
):
    """Through the learner's pipeline with a real agent and queue: every
    staged batch is B - R fresh unrolls in queue order then R replayed ones,
    each replayed one exactly as its actor sent it (behaviour logits, agent
    state, observations, policy_frames); episodes are logged from the fresh
    ones only; and the lag of each is the updates since its policy_frames."""
    agent_config, config = _learner_config(batch_size, proportion, capacity=6)
    replayed = replayed_unrolls(proportion, batch_size)
    fresh = batch_size - replayed
    assert (config.num_fresh, config.num_replayed) == (fresh, replayed)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    updates = 8
    unrolls = random_unrolls(
        specs, fresh * (updates + 1), agent_config.num_actions, ["atari/pong"]
    )
    per_update = config.frames_per_update
    assert per_update == fresh * UNROLL * 4
    # Unroll i was acted with the parameters of update i // fresh - 2 (two
    # behind its batch, as the queue and the staging area make it), at
    # least 0: its lag at update u is u - that.
    acted_at = [max(i // fresh - 2, 0) for i in range(len(unrolls))]
    for i, unroll in enumerate(unrolls):
        unroll.agent_state.core.cell[...] = i  # its identity, wherever it goes
        unrolls[i] = unroll._replace(policy_frames=np.int64(acted_at[i] * per_update))
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(3)
        queue = pipeline.create_queue(specs, capacity=len(unrolls))
        placeholders = tf.nest.map_structure(
            lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), specs
        )
        enqueue = queue.enqueue(tf.nest.flatten(placeholders))
        learner_pipeline = pipeline.build_learner_pipeline(
            agent_lib.create_agent(agent_config), [queue], specs, config, ["/cpu:0"]
        )
        learner = learner_pipeline.learner
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for unroll in unrolls:
                feed = dict(
                    zip(
                        tf.nest.flatten(placeholders),
                        tf.nest.flatten(unroll),
                        strict=True,
                    )
                )
                session.run(enqueue, feed)
            session.run(learner_pipeline.stage_op)
            seen = set()
            for u in range(updates):
                batch, levels, done, lag, _, _ = session.run(
                    (
                        learner_pipeline.batch,
                        learner.level_name,
                        learner.done,
                        learner.policy_lag,
                        learner.train_and_count,
                        learner_pipeline.stage_op,
                    )
                )
                identities = batch.agent_state.core.cell[:, 0].astype(int).tolist()
                # Fresh: the queue's next B - R, in order.
                assert identities[:fresh] == list(range(u * fresh, (u + 1) * fresh))
                seen.update(identities[:fresh])
                # Replayed: R unrolls that entered the buffer by now, each as
                # it was sent.
                assert len(identities) == batch_size
                for column, i in enumerate(identities[fresh:], start=fresh):
                    assert i in seen
                    np.testing.assert_array_equal(
                        batch.agent_outputs.policy_logits[:, column],
                        unrolls[i].agent_outputs.policy_logits,
                    )
                    np.testing.assert_array_equal(
                        batch.agent_state.core.hidden[column],
                        unrolls[i].agent_state.core.hidden,
                    )
                    # The frames before its first step, from which the
                    # learner rebuilds its stacks.
                    np.testing.assert_array_equal(
                        batch.agent_state.frames[column],
                        unrolls[i].agent_state.frames,
                    )
                    np.testing.assert_array_equal(
                        batch.env_outputs.observation[0][:, column],
                        unrolls[i].env_outputs.observation[0],
                    )
                    assert batch.policy_frames[column] == unrolls[i].policy_frames
                # Episodes and levels of the fresh ones only.
                assert len(levels) == fresh and done.shape[1] == fresh
                np.testing.assert_array_equal(
                    lag.fresh, [u - acted_at[i] for i in identities[:fresh]]
                )
                np.testing.assert_array_equal(
                    lag.replayed, [u - acted_at[i] for i in identities[fresh:]]
                )
            assert session.run(learner_pipeline.replay_sizes) == [
                min(fresh * (updates + 1), 6)
            ]


def test_a_towers_buffer_lives_on_its_own_device():
    """Two towers (learner tasks in a cluster): each one's buffer is on its
    device's CPU, not with the agent's variables."""
    agent_config, config = _learner_config(2, 0.5, capacity=4)
    config = dataclasses.replace(config, num_learners=2)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    with tf.Graph().as_default():
        queues = []
        for k in range(2):
            with tf.device(f"/job:learner/task:{k}"):
                queues.append(pipeline.create_queue(specs, learner=k))
        from runtime import sessions

        with sessions.variables_on("/job:learner/task:0/cpu:0"):
            pipeline.build_learner_pipeline(
                agent_lib.create_agent(agent_config),
                queues,
                specs,
                config,
                ["/job:learner/task:0", "/job:learner/task:1"],
            )
        local = tf.compat.v1.local_variables()
        tasks = {
            v.device.split("/task:")[1].split("/")[0]
            for v in local
            if "replay" in v.name
        }
        agent_tasks = {
            v.device.split("/task:")[1].split("/")[0]
            for v in tf.compat.v1.global_variables()
        }
    assert tasks == {"0", "1"}
    assert agent_tasks == {"0"}


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--replay_proportion=1"], "--replay_proportion=1.0: must be in [0, 1)"),
        (["--replay_proportion=-0.5"], "--replay_proportion=-0.5: must be in [0, 1)"),
        (
            ["--replay_proportion=0.5", "--batch_size=1"],
            "--replay_proportion=0.5 with --batch_size=1: round(proportion x "
            "batch size) = 1 replayed unrolls",
        ),
        (
            ["--replay_proportion=0.2", "--batch_size=2"],
            "--replay_proportion=0.2 with --batch_size=2: round(proportion x "
            "batch size) = 0 replayed unrolls",
        ),
        (
            ["--replay_proportion=0.5", "--replay_capacity=1"],
            "--replay_capacity=1: must be at least --batch_size=2 unrolls",
        ),
    ],
)
def test_bad_replay_flags_are_one_line_and_exit_2(tmp_path, capsys, args, expected):
    logdir = tmp_path / "run"
    code = run_command_line(*SMALL, f"--logdir={logdir}", *args)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and expected in err, err
    assert not logdir.exists()


def test_a_buffer_larger_than_the_memory_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    logdir = tmp_path / "run"
    capacity = 10**9  # a gigabyte a byte of each unroll: no machine has it
    code = run_command_line(
        *SMALL,
        f"--logdir={logdir}",
        "--replay_proportion=0.5",
        f"--replay_capacity={capacity}",
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, err
    config = small_config()
    per_unroll = replay.unroll_bytes(
        actor_output_specs(config.environment, config.agent, 20)
    )
    assert (
        f"--replay_capacity={capacity}: the buffer of {capacity} unrolls x "
        f"{per_unroll:,} bytes = {per_unroll * capacity:,} bytes, more than 80% of"
    ) in err
    fits = int(re.search(r"use --replay_capacity=(\d+) or less", err).group(1))
    assert 0 < fits * per_unroll <= 0.8 * replay.available_memory_bytes() * 1.1
    assert not logdir.exists()


def test_unroll_bytes_counts_every_tensor_of_an_unroll():
    specs = (
        tf.TensorSpec([3, 84, 84, 4], tf.uint8),
        tf.TensorSpec([3, 6], tf.float32),
        tf.TensorSpec([], tf.string),
        tf.TensorSpec([], tf.int64),
    )
    assert replay.unroll_bytes(specs) == 3 * 84 * 84 * 4 + 3 * 6 * 4 + 64 + 8
    assert replay.memory_problem(100, 10, 2, 10_000) is None
    line = replay.memory_problem(100, 60, 2, 10_000)
    assert line.startswith("--replay_capacity=60: 2 buffers of 60 unrolls x 100 bytes")
    assert "use --replay_capacity=40 or less" in line


@pytest.mark.slow
def test_one_machine_trains_with_replay_and_says_its_lags(tmp_path):
    logdir = tmp_path / "run"
    result = run_experiment(
        *SMALL,
        f"--logdir={logdir}",
        "--replay_proportion=0.5",
        "--replay_capacity=50",
        "--total_environment_frames=8000",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (first,) = re.findall(r"\] Training (?!done).*", result.stderr)
    assert re.search(r"replay 1 of 2 unrolls from 50 \(0\.\d GB a learner\)", first)
    done = re.search(
        r"Training done: (\d+) environment frames.*mean policy lag ([\d.]+) "
        r"updates \(replayed ([\d.]+)\)",
        result.stderr,
    )
    assert done, result.stderr[-3000:]
    # Replayed unrolls wait in the buffer: older than fresh ones.
    assert float(done.group(3)) > float(done.group(2))
    # Each update counts only its fresh unroll's frames.
    assert int(done.group(1)) >= 8000
    record = (logdir / "run_record.json").read_text()
    assert '"replay_proportion"' in record and '"off_policy_correction"' in record
    assert os.path.exists(logdir / "run_flags.cfg")
