"""Several synchronous learners (--num_learners): one tower per learner, each
with its own queue and batch, and one update from all of them.

The towers run on N logical CPU devices of one process
(`ConfigProto(device_count={"CPU": N})`), which is where the code takes its
devices from (arguments): the same graph a machine with N GPUs, or N learner
tasks, gets with other device names. On a fixed batch of random unrolls the
towers' update equals one learner's on the towers' batches side by side, for
the feed-forward and the LSTM agent, with and without PopArt; the control
(one tower's batch alone) differs, so the check can fail. Through the real
pipeline with real actors (Pong and Breakout, one actor each), actor j's
unrolls reach only tower j mod N, and at the end every queue is closed (no
actor stays blocked on one).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import random_unrolls, run_command_line, small_config

import agent as agent_lib
import py_process
import trajectory
from actor import runner
from actor.unroll import actor_output_specs
from config import LearnerConfig
from learner import pipeline
from learner.update import build_learner

UNROLL = 5
LEVELS = ("atari/pong", "atari/breakout")


def session(num_cpus: int) -> tf.compat.v1.Session:
    return tf.compat.v1.Session(
        config=tf.compat.v1.ConfigProto(
            device_count={"CPU": num_cpus}, allow_soft_placement=False
        )
    )


def configs(use_lstm: bool, popart: bool):
    """(AgentConfig, LearnerConfig of one learner on 4 unrolls)."""
    config = small_config()
    agent = dataclasses.replace(
        config.agent, use_lstm=use_lstm, num_values=len(LEVELS) if popart else 0
    )
    learner = LearnerConfig(
        batch_size=4,
        unroll_length=UNROLL,
        num_action_repeats=4,
        total_environment_frames=10**6,
        learning_rate=0.01,
        max_grad_norm=40.0,
        reward_clipping="none" if popart else "abs_one",
        popart=popart,
        # A large step, so that one update moves the statistics visibly.
        popart_beta=0.5,
        level_names=LEVELS,
    )
    return agent, learner


def one_update(agent_config, learner_config, unrolls, num_towers, initial=None):
    """Every global variable (agent, optimiser slots, frame count, PopArt's
    statistics) after one update of `num_towers` towers, each on its own CPU
    device with an equal share of `unrolls`; and the initial values (given
    `initial`, the variables start from those)."""
    states, start = updates(agent_config, learner_config, unrolls, num_towers, initial)
    return states[0], start


def updates(
    agent_config, learner_config, unrolls, num_towers, initial=None, steps: int = 1
):
    """As one_update, for `steps` updates on the same unrolls: the variables
    after each."""
    per_tower = len(unrolls) // num_towers
    config = dataclasses.replace(
        learner_config, batch_size=per_tower, num_learners=num_towers
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        agent = agent_lib.create_agent(agent_config)
        batches = [
            trajectory.stack_unrolls(
                [
                    tf.nest.map_structure(tf.constant, u)
                    for u in unrolls[k * per_tower : (k + 1) * per_tower]
                ]
            )
            for k in range(num_towers)
        ]
        devices = [f"/cpu:{k}" for k in range(num_towers)]
        learner = build_learner(agent, batches, config, devices)
        variables = tf.compat.v1.global_variables()
        with session(num_towers) as sess:
            sess.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            if initial is not None:
                for v in variables:
                    if v.op.name in initial:
                        v.load(initial[v.op.name], sess)
            start = {v.op.name: sess.run(v) for v in variables}
            states = []
            for _ in range(steps):
                sess.run(learner.train_and_count)
                states.append({v.op.name: sess.run(v) for v in variables})
            return states, start


@pytest.mark.parametrize("use_lstm", [False, True], ids=["feed-forward", "lstm"])
@pytest.mark.parametrize("popart", [False, True], ids=["plain", "popart"])
def test_two_towers_update_as_one_learner_on_both_batches(use_lstm, popart):
    agent_config, learner_config = configs(use_lstm, popart)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    unrolls = random_unrolls(specs, 4, agent_config.num_actions, LEVELS)
    one, start = one_update(agent_config, learner_config, unrolls, 1)
    two, _ = one_update(agent_config, learner_config, unrolls, 2, initial=start)
    assert one.keys() == two.keys()
    moved = [name for name in one if not np.array_equal(one[name], start[name])]
    # The weights, their RMSProp slots and the frame count all moved.
    assert any("rms" in name.lower() for name in moved), moved
    assert "global_step" in moved and len(moved) > 10, moved
    if popart:
        assert {"popart/mean", "popart/second_moment"} <= set(moved)
    for name in one:
        np.testing.assert_allclose(
            two[name], one[name], rtol=2e-5, atol=2e-6, err_msg=name
        )
    assert one["global_step"] == 4 * UNROLL * 4

    # The control: one tower's half of the batch alone does not update alike.
    half, _ = one_update(agent_config, learner_config, unrolls[:2], 1, initial=start)
    differs = [
        name
        for name in moved
        if name != "global_step" and not np.allclose(half[name], one[name], rtol=1e-4)
    ]
    assert differs


WORDS = ("pick", "the", "red", "green", "blue", "key", "apple", "go", "to", "door")


def with_instructions(specs, unrolls, seed: int = 0) -> list:
    """`unrolls` with a sentence of 1-4 random words at every step (the
    instructions, strings of shape [T + 1]; a level name is a scalar)."""
    rng = np.random.default_rng(seed)

    def sentence() -> bytes:
        return " ".join(rng.choice(WORDS, rng.integers(1, 5))).encode()

    def fill(spec, value):
        if spec.dtype == tf.string and spec.shape.as_list():
            return np.array(
                [sentence() for _ in range(value.size)], dtype=object
            ).reshape(value.shape)
        return value

    return [tf.nest.map_structure(fill, specs, u) for u in unrolls]


@pytest.mark.parametrize("use_lstm", [False, True], ids=["feed-forward", "lstm"])
@pytest.mark.parametrize("popart", [False, True], ids=["plain", "popart"])
def test_two_towers_update_an_instruction_encoder_as_one_learner(use_lstm, popart):
    """The DeepMind Lab agent's instruction encoder (a word embedding, whose
    gradients are sparse: the rows of the words used) on a shallow torso:
    two towers leave every variable and every optimiser slot as one learner
    on both batches does, after one update and after three. A dense sum of
    the towers' gradients would decay the RMSProp slots of the rows no
    instruction used (and count other rows in the norm that clips)."""
    agent_config, learner_config = configs(use_lstm, popart)
    agent_config = dataclasses.replace(agent_config, use_instruction=True)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    unrolls = with_instructions(
        specs, random_unrolls(specs, 4, agent_config.num_actions, LEVELS)
    )
    one, start = updates(agent_config, learner_config, unrolls, 1, steps=3)
    two, _ = updates(agent_config, learner_config, unrolls, 2, start, steps=3)
    embedding_slots = [n for n in start if "instruction" in n and "rms" in n.lower()]
    assert embedding_slots, sorted(start)
    for step in (0, 2):
        moved = [n for n in one[step] if not np.array_equal(one[step][n], start[n])]
        assert set(embedding_slots) & set(moved), moved
        for name in one[step]:
            np.testing.assert_allclose(
                two[step][name],
                one[step][name],
                rtol=2e-5,
                atol=2e-6,
                err_msg=f"{name} after {step + 1} update(s)",
            )
    # The rows of words no instruction used keep their initial mean square
    # (1.0; the momentum slot starts at 0).
    (table,) = [n for n in embedding_slots if "/embed/" in n and start[n].all()]
    untouched = np.all(one[2][table] == start[table], axis=1)
    assert untouched.any() and not untouched.all()


def _consumer_devices(op: tf.Operation) -> set[int]:
    """The CPU indices of the ops that use `op`'s output (through Identity)."""
    devices, stack = set(), [op]
    while stack:
        for output in stack.pop().outputs:
            for consumer in output.consumers():
                if consumer.type == "Identity":
                    stack.append(consumer)
                elif "CPU:" in consumer.device:
                    devices.add(int(consumer.device.rsplit(":", 1)[1]))
    return devices


def test_a_tower_away_from_the_variables_reads_each_of_them_once_per_update():
    """Tower 1 (on another device: a GPU, or learner task 1 across the
    network) reads every parameter once per update, and its unroll uses that
    read: otherwise the LSTM's weights are read, and on another task sent, at
    each of the unroll's T + 1 steps. Tower 0 makes the variables (Sonnet
    creates them at the first call) where they live, reading them per use:
    the control."""
    agent_config, learner_config = configs(use_lstm=True, popart=False)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    unrolls = random_unrolls(specs, 4, agent_config.num_actions, LEVELS)
    config = dataclasses.replace(learner_config, batch_size=2, num_learners=2)
    with tf.Graph().as_default() as graph:
        agent = agent_lib.create_agent(agent_config)
        batches = [
            trajectory.stack_unrolls(
                [tf.nest.map_structure(tf.constant, u) for u in unrolls[k::2]]
            )
            for k in range(2)
        ]
        build_learner(agent, batches, config, ["/cpu:0", "/cpu:1"])
        # For each tower, how many reads of each variable its ops use.
        reads = {0: {}, 1: {}}
        for op in graph.get_operations():
            if op.type == "ReadVariableOp":
                handle = op.inputs[0].op.name
                for tower in _consumer_devices(op) & {0, 1}:
                    reads[tower][handle] = reads[tower].get(handle, 0) + 1
        variables = [v.handle.op.name for v in agent.trainable_variables]
    assert {name: reads[1].get(name, 0) for name in variables} == {
        name: 1 for name in variables
    }
    lstm_weights = [name for name in variables if "lstm" in name and "/w" in name]
    assert lstm_weights and all(reads[0][name] > 1 for name in lstm_weights)


def test_a_towers_batch_is_made_time_major_on_its_own_device():
    """Learner k's unrolls are dequeued, made time-major and staged on its
    device: none of the batch goes to another learner task and back."""
    agent_config, learner_config = configs(use_lstm=False, popart=False)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    config = dataclasses.replace(learner_config, batch_size=2, num_learners=2)
    with tf.Graph().as_default() as graph, tf.device("/cpu:0"):
        queues = []
        for k in range(2):
            with tf.device(f"/cpu:{k}"):
                queues.append(pipeline.create_queue(specs, learner=k))
        pipeline.build_learner_pipeline(
            agent_lib.create_agent(agent_config),
            queues,
            specs,
            config,
            ["/cpu:0", "/cpu:1"],
        )
        dequeue = next(
            op
            for op in graph.get_operations()
            if op.type == "QueueDequeueManyV2"
            and op.inputs[0].op == queues[1].queue_ref.op
        )
        # The dequeued tensors' first consumers: transposes to time-major.
        consumers = [c for t in dequeue.outputs for c in t.consumers()]
    assert consumers and all(c.device.endswith("CPU:1") for c in consumers), [
        (c.type, c.device) for c in consumers
    ]


def test_checkpoints_do_not_depend_on_the_number_of_learners():
    """The same variables, names and shapes, whatever N: a run resumes with
    another --num_learners."""
    agent_config, learner_config = configs(use_lstm=True, popart=False)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    unrolls = random_unrolls(specs, 4, agent_config.num_actions, LEVELS)
    one, _ = one_update(agent_config, learner_config, unrolls, 1)
    two, _ = one_update(agent_config, learner_config, unrolls, 2)
    assert {k: v.shape for k, v in one.items()} == {k: v.shape for k, v in two.items()}


def test_each_actor_feeds_only_its_learners_tower_and_every_queue_closes():
    """2 actors (Pong, then Breakout) and 2 learners through the real
    pipeline: tower 0's batches hold only actor 0's unrolls (Pong), tower
    1's only actor 1's (Breakout); after the session the queues are closed."""
    config = small_config()
    run = dataclasses.replace(config.run, num_actors=2)
    environment = dataclasses.replace(
        config.environment, level_name="atari/pong,atari/breakout", level_names=LEVELS
    )
    agent_config = dataclasses.replace(config.agent, num_actions=18)
    learner_config = dataclasses.replace(
        config.learner, unroll_length=UNROLL, num_learners=2, batch_size=2
    )
    environment = dataclasses.replace(environment, num_actions=18)
    specs = actor_output_specs(environment, agent_config, UNROLL)
    with tf.Graph().as_default():
        agent = agent_lib.create_agent(agent_config)
        queues = [pipeline.create_queue(specs, learner=i) for i in range(2)]
        assert [q.queue_ref.op.get_attr("shared_name") for q in queues] == [
            b"buffer",
            b"buffer_1",
        ]
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, queues, specs, learner_config, ["/cpu:0", "/cpu:1"]
        )
        inference_fn, _ = runner.make_inference_fn(agent, "/cpu:0", True, 1)
        actor_list = runner.build_actors(
            agent, environment, run, UNROLL, queues, inference_fn
        )
        assert [a.level_name for a in actor_list] == list(LEVELS)
        hooks = [
            runner.ActorRunnerHook(
                [runner.ActorRunner(a) for a in actor_list],
                tf.group([q.close(cancel_pending_enqueues=True) for q in queues]),
            ),
            py_process.PyProcessHook(),
        ]
        fetches = (
            learner_pipeline.batch.level_name,
            learner_pipeline.learner.train_and_count,
            learner_pipeline.stage_op,
        )
        runners = hooks[0]._runners
        with tf.compat.v1.train.MonitoredSession(
            hooks=hooks,
            session_creator=tf.compat.v1.train.ChiefSessionCreator(
                config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})
            ),
        ) as sess:
            sess.run(learner_pipeline.stage_op)
            seen = []
            for _ in range(3):
                levels, frames, _ = sess.run(fetches)
                seen.append([level.decode() for level in levels])
    assert frames == 3 * 2 * 2 * UNROLL * 4
    for levels in seen:
        assert levels == ["atari/pong"] * 2 + ["atari/breakout"] * 2, seen
    # Each actor was blocked on its own learner's queue (capacity 1) when the
    # session ended: its thread ends only if the hook closed that queue too.
    assert [r.thread.is_alive() for r in runners] == [False, False]


# -- bad input: one line naming the flags, exit code 2, nothing written ------

# A cluster of 3 learner tasks and 2 actor tasks: learner task 2 gets no actor.
CLUSTER_ACTORS_MESSAGE = (
    r"^--num_learners=3: the cluster lists 3 learner tasks but 2 actor task\(s\), "
    r"and actor j feeds learner j mod 3, so learner tasks 2\.\.2 would get no "
    r"unroll and the update would wait forever; list at least 3 actor tasks or "
    r"fewer learner tasks\.$"
)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--num_learners=0"], r"^--num_learners=0: must be >= 1"),
        (
            ["--num_learners=3", "--num_actors=2"],
            r"^--num_learners=3: more learners than the 2 actors that feed them "
            r".*use --num_learners=2 or fewer",
        ),
        (
            ["--num_learners=2"],
            r"^--num_learners=2: single-machine training puts each learner on a "
            r"GPU of its own and TensorFlow sees 0 GPU\(s\) here",
        ),
        (
            ["--num_learners=2", "--job_name=learner", "--task=0"],
            r"^--num_learners=2: the cluster lists 1 learner task\(s\); start "
            r"every task with --num_learners=1\.",
        ),
        (
            [
                "--num_learners=2",
                "--job_name=learner",
                "--task=2",
                "--learner_host=localhost:1,localhost:2",
            ],
            r"^--task=2 is out of range for the learner: the cluster has 2 learner addresses, so use --task=0\.\.1",
        ),
        *[
            (
                [
                    "--num_learners=3",
                    f"--job_name={job}",
                    "--task=1",
                    "--learner_host=localhost:1,localhost:2,localhost:3",
                    "--actor_hosts=localhost:4,localhost:5",
                    "--num_actors=2",
                ],
                CLUSTER_ACTORS_MESSAGE,
            )
            for job in ("learner", "actor")
        ],
    ],
    ids=[
        "zero",
        "more-than-actors",
        "no-gpus",
        "cluster-mismatch",
        "task-outside",
        "cluster-actors-learner-task",
        "cluster-actors-actor-task",
    ],
)
def test_bad_num_learners_is_one_line_and_exit_2_with_nothing_written(
    tmp_path, capsys, args, message
):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    logdir = tmp_path / "run"
    code = run_command_line(
        "--level_name=atari/pong", f"--logdir={logdir}", "--num_actors=4", *args
    )
    assert code == 2
    (line,) = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("experiment.py: error:")
    ]
    assert re.match(message, line[len("experiment.py: error: ") :]), line
    assert not logdir.exists()


@pytest.mark.parametrize("job,index", [("learner", 0), ("learner", 2), ("actor", 1)])
def test_tf_config_with_fewer_actor_tasks_than_learner_tasks_is_refused_on_every_task(
    tmp_path, capsys, monkeypatch, job, index
):
    """The cluster's own actor count, not --num_actors (4 by default)."""
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {
                    "learner": ["localhost:1", "localhost:2", "localhost:3"],
                    "actor": ["localhost:4", "localhost:5"],
                },
                "task": {"type": job, "index": index},
            }
        ),
    )
    logdir = tmp_path / "run"
    code = run_command_line(
        "--level_name=atari/pong", f"--logdir={logdir}", "--num_learners=3"
    )
    assert code == 2
    (line,) = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("experiment.py: error:")
    ]
    assert re.match(CLUSTER_ACTORS_MESSAGE, line[len("experiment.py: error: ") :])
    assert not logdir.exists()


def test_the_progress_line_shows_each_learners_queue():
    from learner import progress

    assert progress.queue_text(np.int32(1)) == "queue 1"
    assert progress.queue_text(np.array([1, 0], np.int32)) == "queues 1,0"
    line = progress.progress_line(800, 10**6, 80.0, 1.0, [], np.array([0, 1]))
    assert line.endswith("| queues 0,1"), line


def start_lone_chief(tmp_path, learner_1_port: int) -> tuple[subprocess.Popen, object]:
    """The chief of 2 learner tasks and 2 actor tasks, started alone, with
    learner task 1 at `learner_1_port`; (its process, its log's path)."""
    from run_helpers import command

    from cluster import ports

    free_ports = ports.pick_free_ports(3)
    learners = f"127.0.0.1:{free_ports[0]},127.0.0.1:{learner_1_port}"
    actors = f"127.0.0.1:{free_ports[1]},127.0.0.1:{free_ports[2]}"
    log_path = tmp_path / "chief.log"
    with open(log_path, "wb") as log:
        chief = subprocess.Popen(
            command(
                "--job_name=learner",
                "--task=0",
                "--num_learners=2",
                f"--learner_host={learners}",
                f"--actor_hosts={actors}",
                "--num_actors=2",
                "--level_name=atari/pong",
                "--agent=shallow",
                f"--logdir={tmp_path / 'run'}",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        )
    return chief, log_path


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_chief_waiting_for_its_learner_tasks_says_so_and_stops_at_a_signal(
    tmp_path, signum, code
):
    """The chief of 2 learner tasks, started alone: it names the task it
    waits for, and a signal ends it at once with 128 + the signal (nothing
    to checkpoint yet), instead of it waiting in TensorFlow's session
    creation, deaf to signals, for a task that never comes."""
    from cluster import ports

    (port,) = ports.pick_free_ports(1)
    chief, log_path = start_lone_chief(tmp_path, port)
    waiting = f"waiting for learner task(s) 1 at 127.0.0.1:{port} ("
    try:
        # The event, with a deadline only against a hang: the line.
        deadline = time.monotonic() + 300
        while waiting not in log_path.read_text(errors="replace"):
            assert chief.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        chief.send_signal(signum)
        assert chief.wait(timeout=120) == code, log_path.read_text()[-3000:]
    finally:
        if chief.poll() is None:
            chief.kill()
    text = log_path.read_text(errors="replace")
    assert "stopped by a signal while waiting for the other learner tasks" in text
    assert "Traceback" not in text


@pytest.mark.slow
def test_a_chief_stuck_creating_its_session_stops_at_sigterm(tmp_path):
    """Learner task 1 passes the chief's TCP probe but never answers (a
    socket that listens and speaks no gRPC, as a task that died after its
    port opened): the chief waits in TensorFlow's session creation, where
    no flag is read; SIGTERM still ends it at once, with 143."""
    import socket

    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    chief, log_path = start_lone_chief(tmp_path, silent.getsockname()[1])
    creating = "Learner task 0: creating its session with the cluster's tasks"
    try:
        deadline = time.monotonic() + 300
        while creating not in log_path.read_text(errors="replace"):
            assert chief.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # inside TensorFlow's wait by now
        assert chief.poll() is None, log_path.read_text()[-3000:]
        chief.send_signal(signal.SIGTERM)
        assert chief.wait(timeout=60) == 143, log_path.read_text()[-3000:]
    finally:
        silent.close()
        if chief.poll() is None:
            chief.kill()
            chief.wait()
    text = log_path.read_text(errors="replace")
    assert (
        "Received SIGTERM while creating its session with the cluster's tasks: "
        "exiting at once (exit code 143)"
    ) in text
    assert "Traceback" not in text


# -- a stalled learner, said out loud -------------------------------------------


def _two_learner_cluster():
    from cluster import addresses

    return addresses.cluster_from_flags(
        "l0:8000,l1:8000", "a0:8001,a1:8001,a2:8001,a3:8001", 4, "learner", 0
    )


def test_a_learner_whose_queue_stays_empty_while_the_others_are_full_is_named():
    from cluster.learner_task import StallWatch

    now = [0.0]
    watch = StallWatch(60, 8, _two_learner_cluster(), clock=lambda: now[0])
    assert watch.actors_of(1) == [1, 3]
    for t, sizes, said in [
        (0, [8, 0], 0),  # learner 1 empty, learner 0 full: the clock starts
        (59, [9, 0], 0),  # not yet the bound
        (60, [8, 0], 1),  # the bound: said once...
        (61, [8, 0], 0),
        (119, [8, 0], 0),
        (120, [8, 0], 1),  # ...and again each bound while it lasts
        (121, [8, 2], 0),  # an actor of learner 1 came back: over
        (200, [8, 0], 0),  # empty again: a new clock
        (260, [8, 0], 1),
    ]:
        now[0] = t
        lines = watch.update(sizes)
        assert len(lines) == said, (t, lines)
    (line,) = lines
    assert line.startswith("Learner task 1 (l1:8000) has had no unroll for 60 s")
    assert "actor task 1 (a1:8001), actor task 3 (a3:8001)" in line
    assert "restart them" in line and "\n" not in line


def test_no_stall_is_said_while_every_queue_waits_or_none_is_full():
    from cluster.learner_task import StallWatch

    now = [0.0]
    watch = StallWatch(60, 8, _two_learner_cluster(), clock=lambda: now[0])
    for t in (0, 100, 1000):
        now[0] = t
        # Start-up or every actor gone: all queues empty, nothing singled out;
        # the others not holding a batch: a slow learner, not a stalled one.
        assert watch.update([0, 0]) == []
        assert watch.update([7, 0]) == []


def test_the_chief_logs_a_stalled_learner_from_its_session(caplog):
    """The hook reads the real queues' sizes beside the session and logs the
    watch's warning: waited for as a log record, with a guard."""
    import logging as python_logging

    from cluster.learner_task import StalledLearnerHook, StallWatch

    caplog.set_level(python_logging.WARNING, logger="absl")
    with tf.Graph().as_default():
        queues = [tf.queue.FIFOQueue(16, [tf.int32], shapes=[[]]) for _ in range(2)]
        fill = queues[0].enqueue_many([tf.range(8)])
        watch = StallWatch(0.2, 8, _two_learner_cluster())
        hook = StalledLearnerHook([q.size() for q in queues], watch)
        hook.interval_secs = 0.05
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            session.run(fill)
            deadline = time.monotonic() + 60
            while not any("Learner task 1" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "no warning"
                time.sleep(0.05)
    message = next(
        r.getMessage() for r in caplog.records if "Learner task 1" in r.getMessage()
    )
    assert "actor task 1 (a1:8001), actor task 3 (a3:8001)" in message


# -- after a restart: no rollback, no stale batch --------------------------------


def test_a_recreated_session_goes_on_from_its_servers_variables_not_a_checkpoint(
    tmp_path,
):
    """A session recreated on a server whose variables hold values (the
    chief's own server, after a learner task serving a tower died) keeps
    them: a checkpoint written 5 updates earlier is not restored. On a new
    server (a restarted process) the newest checkpoint is: the one that
    session saved as it began, at 5 updates, not the initial values."""
    from runtime import checkpoints, sessions

    logdir = str(tmp_path)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.Variable(1.0, name="weights")
        update = tf.group(step.assign_add(1), weights.assign_add(1.0))
        read = (step, weights)
        saver = checkpoints.checkpoint_saver()
        server = tf.compat.v1.train.Server.create_local_server()
        with tf.compat.v1.Session(server.target) as first:
            first.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            saver.save(first, os.path.join(logdir, "model.ckpt"), 0)
            for _ in range(5):
                first.run(update)

        def read_in_new_session(target):
            with sessions.create_training_session(
                [], logdir, 600, master=target, config=tf.compat.v1.ConfigProto()
            ) as session:
                return session.run(read)

        assert read_in_new_session(server.target) == (5, 6.0)
        fresh_server = tf.compat.v1.train.Server.create_local_server()
        assert read_in_new_session(fresh_server.target) == (5, 6.0)


def test_a_new_session_trains_every_tower_on_unrolls_staged_after_it():
    """The staging areas live on their server and outlive a session (a
    restarted chief finds a learner task's area full, a restarted learner
    task the chief's). A first session stages Pong unrolls on both towers
    and ends; the training session created next on the same server stages
    Breakout unrolls, and its first step trains both towers on those."""
    agent_config, learner_config = configs(use_lstm=False, popart=False)
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    config = dataclasses.replace(learner_config, batch_size=1, num_learners=2)
    server = tf.compat.v1.train.Server.create_local_server(
        config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    )
    with tf.Graph().as_default():
        queues = [pipeline.create_queue(specs, learner=k) for k in range(2)]
        learner_pipeline = pipeline.build_learner_pipeline(
            agent_lib.create_agent(agent_config),
            queues,
            specs,
            config,
            ["/cpu:0", "/cpu:1"],
        )

        def enqueue(level: str, seed: int):
            unrolls = random_unrolls(specs, 2, agent_config.num_actions, [level], seed)
            return [
                q.enqueue(tf.nest.flatten(tf.nest.map_structure(tf.constant, u)))
                for q, u in zip(queues, unrolls, strict=True)
            ]

        stale, fresh = enqueue("atari/pong", 0), enqueue("atari/breakout", 1)
        with tf.compat.v1.Session(server.target) as first:
            first.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            first.run(stale)
            first.run(learner_pipeline.stage_op)
        hook = pipeline.FreshStagingHook(learner_pipeline.clear_staging_op)
        with tf.compat.v1.train.MonitoredSession(
            session_creator=tf.compat.v1.train.ChiefSessionCreator(
                master=server.target
            ),
            hooks=[hook],
        ) as session:
            session.run(fresh)
            session.run(learner_pipeline.stage_op)
            levels, _ = session.run(
                (
                    learner_pipeline.batch.level_name,
                    learner_pipeline.learner.train_and_count,
                )
            )
    assert levels.tolist() == [b"atari/breakout"] * 2


# -- one machine with N GPUs: where each part runs -------------------------------


def _ops_made_by(graph: tf.Graph, fn):
    """fn, wrapped to record the names of the ops each call adds to `graph`."""
    calls = []

    def recording(*args, **kwargs):
        before = len(graph.get_operations())
        result = fn(*args, **kwargs)
        calls.append([op.name for op in graph.get_operations()[before:]])
        return result

    return recording, calls


def test_towers_run_on_their_devices_and_the_variables_live_with_the_first(
    monkeypatch,
):
    """A machine with N GPUs gets towers on /gpu:0 .. /gpu:N-1
    (sessions.learner_devices); here /cpu:1 and /cpu:2 stand for them and
    /cpu:0 for the host's CPU. Traced through one real update of the
    learner's pipeline (where each node ran, not only what the graph asked):
    each tower's unroll (forward) and its gradients (backward) run on its own
    device, the loss's gradients and V-trace on the host's CPU, where the
    sequential recursion is faster; every variable (the frame counter
    included) and every RMSProp slot lives on the first tower's device, and
    the update is applied there: that tower reads the parameters with no
    copy and each other tower copies them once per update (the read-once
    test above). No GPU machine measured this choice against variables on
    the host's CPU (BENCHMARKS.md, "Several learners")."""
    agent_config, learner_config = configs(use_lstm=True, popart=False)
    # One level: no per-level gradient summaries (their gradients would add
    # scopes of their own to what is recorded here).
    specs = actor_output_specs(small_config().environment, agent_config, UNROLL)
    config = dataclasses.replace(
        learner_config, batch_size=1, num_learners=2, level_names=LEVELS[:1]
    )
    towers = ["CPU:1", "CPU:2"]
    with tf.Graph().as_default() as graph:
        agent = agent_lib.create_agent(agent_config)
        agent.unroll, forward = _ops_made_by(graph, agent.unroll)
        gradients, backward = _ops_made_by(graph, tf.compat.v1.gradients)
        monkeypatch.setattr(tf.compat.v1, "gradients", gradients)
        queues = [pipeline.create_queue(specs, learner=k) for k in range(2)]
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, queues, specs, config, ["/cpu:1", "/cpu:2"]
        )
        monkeypatch.undo()
        vtrace_ops = [op.name for op in graph.get_operations() if "vtrace" in op.name]
        variables = tf.compat.v1.global_variables()
        unrolls = random_unrolls(specs, 2, agent_config.num_actions, LEVELS[:1])
        enqueue = [
            q.enqueue(tf.nest.flatten(tf.nest.map_structure(tf.constant, u)))
            for q, u in zip(queues, unrolls, strict=True)
        ]
        trace = tf.compat.v1.RunMetadata()
        with session(3) as sess:
            sess.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            for op in enqueue:
                sess.run(op)
            sess.run(learner_pipeline.stage_op)
            sess.run(
                learner_pipeline.learner.train_and_count,
                options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.FULL_TRACE
                ),
                run_metadata=trace,
            )
    ran_on, applied_on = {}, set()
    for device in trace.step_stats.dev_stats:
        for node in device.node_stats:
            ran_on[node.node_name] = device.device.rsplit("device:", 1)[1]
            if "ApplyRMSProp" in node.timeline_label:
                applied_on.add(ran_on[node.node_name])
    assert len(forward) == 2 and len(backward) == 2 and vtrace_ops
    for tower, (made, grads) in enumerate(zip(forward, backward, strict=True)):
        # Grappler folds constants and shapes away: the rest ran by name.
        ran_forward = {ran_on[name] for name in made if name in ran_on}
        assert ran_forward == {towers[tower]}, tower
        # A gradient op runs with the op it differentiates: the unroll's on
        # the tower's device, the loss's on the host's CPU.
        colocated = collections.defaultdict(set)
        for name in grads:
            if name in ran_on:
                (group,) = graph.get_operation_by_name(name).colocation_groups()
                through_unroll = group.decode().removeprefix("loc:@") in made
                colocated[through_unroll].add(ran_on[name])
        assert colocated == {True: {towers[tower]}, False: {"CPU:0"}}, tower
    assert {ran_on[name] for name in vtrace_ops if name in ran_on} == {"CPU:0"}
    slots = [v for v in variables if "RMSProp" in v.op.name]
    assert slots and len(variables) > len(slots)
    placed = {tf.DeviceSpec.from_string(v.device).device_index for v in variables}
    assert placed == {1}, sorted((v.op.name, v.device) for v in variables)
    assert applied_on == {towers[0]}
