"""Distributed training end to end: a learner and actor tasks on loopback.

Every task is a real `experiment.py` (or `launch.py`) subprocess on the real
ALE (atari/pong, the shallow agent, batch 2, unroll 20: 160 frames per
update), with free ports picked at run time. Each process starts in its own
session and the `tasks` fixture SIGKILLs every process group it started, also
when a test fails, so no task (nor its environment processes) outlives the
test. Every wait is bounded.

The scenarios are combined to keep the file short (each learner start costs
several seconds of TensorFlow start-up):

- test_launcher_...: launch.py runs a learner and 2 actors to a frame target;
  all three exit 0 by themselves.
- test_faults_...: actors started before the learner; an actor SIGKILLed
  while the learner still reaches its target on the other; that actor
  restarted (with TF_CONFIG instead of flags) rejoins a new learner run; the
  learner SIGKILLed mid-run, the actors notice, and after the learner's
  restart (from its checkpoint) they reconnect and training reaches its new
  target; every task exits 0 by itself and the actors write nothing to
  their --logdir.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from run_helpers import experiment_values, resolved_settings, small_config

import experiment
from actor.unroll import actor_output_specs
from cluster import actor_task, learner_task, ports, spec
from runtime import errors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT = os.path.join(REPO, "experiment.py")
LAUNCH = os.path.join(REPO, "launch.py")
KILLED_AT_START_SCRIPT = os.path.join(REPO, "tests", "train_with_killed_at_start.py")

SMALL = [
    "--level_name=atari/pong",
    "--agent=shallow",
    # One environment an actor task: Atari's defaults (its flag file, which
    # cluster tasks take as single-machine runs do) would give each 32.
    "--envs_per_actor=1",
    "--batch_size=2",
    "--unroll_length=20",
]
FRAMES_PER_UPDATE = 2 * 20 * 4
# Bounds for waits: generous, since CI machines have 2 cores shared by a
# learner, two actors and their environments.
START_TIMEOUT_S = 90
RUN_TIMEOUT_S = 150
NOTICE_TIMEOUT_S = 30


# -- in-process checks: graphs and flag errors ------------------------------------


def _variables(graph: tf.Graph, key: str) -> dict:
    return {
        v.op.name: (v.shape.as_list(), v.dtype.base_dtype, v.device)
        for v in graph.get_collection(key)
    }


def _queue_attrs(graph: tf.Graph):
    (queue,) = [op for op in graph.get_operations() if op.type == "FIFOQueueV2"]
    return (
        queue.device,
        queue.get_attr("shared_name"),
        queue.get_attr("capacity"),
        list(queue.get_attr("component_types")),
        [tf.TensorShape(s).as_list() for s in queue.get_attr("shapes")],
    )


@pytest.mark.parametrize("envs_per_actor,envs_per_process", [(1, 1), (2, 1), (4, 2)])
def test_actor_graph_declares_the_learners_queue_and_variables(
    envs_per_actor, envs_per_process
):
    """An actor task refers to the learner's queue and variables by declaring
    them with the same names, shapes and devices: checked on the two graphs.
    With --envs_per_actor=K it sends K unrolls at a time into the same queue
    (from K / --envs_per_process environment processes)."""
    learner_config = spec.ClusterConfig(
        "localhost:1", ("localhost:2", "localhost:3"), "learner", 0
    )
    actor_config = learner_config._replace(job_name="actor", task=1)
    learner_cpu = "/job:learner/task:0/device:CPU:0"
    config = small_config()
    config = dataclasses.replace(
        config,
        run=dataclasses.replace(
            config.run,
            envs_per_actor=envs_per_actor,
            envs_per_process=envs_per_process,
        ),
    )
    with tf.Graph().as_default() as actor_graph:
        ops, processes = actor_task.build_actor_task(actor_config, config)
    assert len(processes) == envs_per_actor // envs_per_process
    assert ops.output.env_outputs.reward.shape[0] == envs_per_actor
    # The learner builds its queue from actor_output_specs(), the same specs
    # as one of the K unrolls.
    specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape[1:], t.dtype), ops.output
    )
    assert specs == actor_output_specs(
        config.environment, config.agent, config.learner.unroll_length
    )
    with tf.Graph().as_default() as learner_graph:
        learner_task.build_learner_task(learner_config, specs, config)

    learner_globals = _variables(learner_graph, "variables")
    learner_locals = _variables(learner_graph, "local_variables")
    # Every learner variable lives on the learner's CPU (the optimizer's
    # slots and the frame counter included).
    assert learner_globals and learner_locals
    for name, (_, _, device) in {**learner_globals, **learner_locals}.items():
        assert device == learner_cpu, name
    actor_globals = _variables(actor_graph, "variables")
    agent_names = set(_variables(learner_graph, "trainable_variables"))
    # The actor declares exactly the agent's variables and the frame count
    # (which it copies with the weights: its unrolls' policy_frames) as
    # global: the same resources as the learner's (name, shape, dtype and
    # device all match).
    assert set(actor_globals) == agent_names | {"global_step"}
    for name, value in actor_globals.items():
        assert value == learner_globals[name], name
    # Its local copy and its state live on its own task, out of checkpoints.
    actor_locals = _variables(actor_graph, "local_variables")
    local_agent = {
        n.split("/", 1)[1]
        for n in actor_locals
        if n.startswith(actor_task.LOCAL_AGENT_NAME + "/")
    }
    assert local_agent == {n.split("/", 1)[1] for n in agent_names}
    for name, (_, _, device) in actor_locals.items():
        assert device == "/job:actor/task:1", name
    assert set(_variables(actor_graph, "trainable_variables")) == agent_names
    # The end-of-training variables: local on the learner, in no collection
    # on the actor (which neither initialises nor waits for them).
    for name in ("training_done", "finished_actors", "finished_learners"):
        assert learner_locals[name][2] == learner_cpu
        (handle,) = [
            op
            for op in actor_graph.get_operations()
            if op.type == "VarHandleOp" and op.name == name
        ]
        assert handle.device == learner_cpu
        assert handle.get_attr("shared_name").decode() == name
    # The same queue; the environment runs only on the actor.
    assert _queue_attrs(actor_graph) == _queue_attrs(learner_graph)
    assert _queue_attrs(actor_graph)[0].startswith("/job:learner/task:0/")
    py_funcs = [
        op
        for op in actor_graph.get_operations()
        if op.type.startswith("EagerPyFunc") or op.type.startswith("PyFunc")
    ]
    assert py_funcs
    assert {op.device for op in py_funcs} == {"/job:actor/task:1"}


@pytest.mark.parametrize(
    "values, tf_config, expected",
    [
        (
            dict(job_name="learner", task=0, learner_host="bad_host:1"),
            None,
            "--learner_host: invalid host name 'bad_host'",
        ),
        (
            dict(job_name="actor", task=0, actor_hosts="h:1,,h:2", num_actors=3),
            None,
            "--actor_hosts: empty address at position 1",
        ),
        (dict(), "{not json", "TF_CONFIG is not valid JSON"),
        (
            dict(job_name="actor", task=5, num_actors=2),
            None,
            "--task=5 is out of range for the actors",
        ),
    ],
)
def test_bad_cluster_settings_are_flag_errors(monkeypatch, values, tf_config, expected):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    argv = ["experiment.py", *(f"--{name}={value}" for name, value in values.items())]
    parsed = experiment.parse_flags(argv)
    with pytest.raises(errors.FlagError, match=re.escape(expected)):
        experiment.cluster_config_from_flags(parsed)


def test_port_in_use_is_a_flag_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cluster_config = spec.ClusterConfig(
            f"localhost:{port}",
            (f"localhost:{ports.pick_free_ports(1)[0]}",),
            "learner",
            0,
        )
        with pytest.raises(errors.FlagError, match=f"port {port} .* in use"):
            experiment.run_training(small_config(), cluster_config, None)


def test_test_mode_takes_no_task():
    parsed = experiment.parse_flags(["experiment.py", "--mode=test", "--task=0"])
    with pytest.raises(errors.FlagError, match="test mode runs in one process"):
        experiment.validate_flags(parsed)


# -- subprocesses: real tasks on loopback -----------------------------------------


class Tasks:
    """Starts subprocesses, each in its own session, and kills them all."""

    def __init__(self, directory: str):
        self.directory = directory
        self.processes: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], env_extra=None) -> subprocess.Popen:
        """Runs `python3 args...` with stdout+stderr appended to <name>.log."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("TF_CONFIG", None)
        env.update(env_extra or {})
        with open(self.log(name), "ab") as log:
            process = subprocess.Popen(
                [sys.executable, *args],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.log")

    def read(self, name: str) -> str:
        with open(self.log(name), errors="replace") as f:
            return f.read()

    def wait_for_line(
        self,
        name: str,
        pattern: str,
        timeout: float,
        count: int = 1,
        watch: subprocess.Popen | None = None,
    ) -> float:
        """Waits until <name>.log has `count` lines matching `pattern`.

        Fails at once when `watch` (the task writing the log) exits first.
        Returns the time.monotonic() at which it was seen.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(regex.findall(self.read(name))) >= count:
                return time.monotonic()
            if watch is not None and watch.poll() is not None:
                if len(regex.findall(self.read(name))) >= count:
                    return time.monotonic()
                pytest.fail(
                    f"{name} exited with code {watch.returncode} before logging "
                    f"{pattern!r} x{count}:\n{self.tail(name)}"
                )
            time.sleep(0.2)
        pytest.fail(
            f"{name} did not log {pattern!r} x{count} within {timeout} s:\n"
            f"{self.tail(name)}"
        )

    def wait_exit(self, name: str, process: subprocess.Popen, timeout: float) -> int:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {timeout} s:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.read(name).splitlines()[-lines:])

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILLs the process's whole group (it and its environments)."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait(timeout=30)

    def kill_all(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def tasks(tmp_path):
    tasks = Tasks(str(tmp_path))
    try:
        yield tasks
    finally:
        tasks.kill_all()


def saved_frames(logdir: str) -> int:
    return int(tf.train.load_checkpoint(logdir).get_tensor("global_step"))


def start_learner(
    tasks: Tasks, address_flags: list[str], logdir: str, target: int, *extra: str
) -> subprocess.Popen:
    """Learner task 0 of the small cluster `address_flags` describe, logged
    as "learner", training to `target` frames."""
    return tasks.start(
        "learner",
        [
            EXPERIMENT,
            "--job_name=learner",
            "--task=0",
            *address_flags,
            *SMALL,
            f"--logdir={logdir}",
            f"--total_environment_frames={target}",
            *extra,
        ],
    )


def assert_exit_0(tasks: Tasks, name: str, process: subprocess.Popen, timeout):
    code = tasks.wait_exit(name, process, timeout)
    assert code == 0, f"{name} exited with code {code}:\n{tasks.tail(name)}"


LAUNCH_CASES = {
    # An LSTM agent, K environments an actor task (one environment an actor
    # task is the PopArt case below). Its run is also the first start of
    # test_a_run_resumed_with_one_then_two_then_one_learner_tasks.
    "lstm": (2, []),
    # A feed-forward agent (no core state in the unrolls) with a bfloat16
    # torso, on the learner and the actor tasks alike.
    "feed_forward_bfloat16": (2, ["--use_lstm=false", "--torso_dtype=bfloat16"]),
    # PopArt on two games, one actor task each: the level of each trajectory
    # travels with it to the learner's statistics; with replay (half of each
    # batch from the learner task's buffer).
    "popart_replay": (
        1,
        [
            "--level_name=atari/pong,atari/breakout",
            "--popart",
            "--replay_proportion=0.5",
            "--replay_capacity=20",
        ],
    ),
}
LAUNCH_TARGET = 2000


@dataclasses.dataclass
class Launch:
    """launch.py's run of a learner and two actor tasks to LAUNCH_TARGET."""

    logdir: str
    code: int
    output: str  # launch.py's own

    def task_log(self, name: str) -> str:
        with open(
            os.path.join(self.logdir, "logs", f"{name}.log"), errors="replace"
        ) as f:
            return f.read()


def launch_small_run(tasks: Tasks, logdir: str, case: str) -> Launch:
    envs_per_actor, agent_flags = LAUNCH_CASES[case]
    launcher = tasks.start(
        f"launch_{case}",
        [
            LAUNCH,
            "--num_actors=2",
            f"--logdir={logdir}",
            *SMALL,
            f"--envs_per_actor={envs_per_actor}",
            *agent_flags,
            f"--total_environment_frames={LAUNCH_TARGET}",
        ],
    )
    code = tasks.wait_exit(f"launch_{case}", launcher, START_TIMEOUT_S + RUN_TIMEOUT_S)
    return Launch(logdir, code, tasks.read(f"launch_{case}"))


@pytest.fixture(scope="module")
def lstm_launch(tmp_path_factory):
    """The "lstm" case's run, which two tests read: launched once."""
    directory = tmp_path_factory.mktemp("lstm_launch")
    tasks = Tasks(str(directory))
    try:
        yield launch_small_run(tasks, str(directory / "run"), "lstm")
    finally:
        tasks.kill_all()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LAUNCH_CASES))
def test_launcher_trains_a_learner_and_two_actors_to_the_target(
    tasks, tmp_path, request, case
):
    if case == "lstm":
        run = request.getfixturevalue("lstm_launch")
    else:
        run = launch_small_run(tasks, str(tmp_path / "run"), case)
    envs_per_actor, agent_flags = LAUNCH_CASES[case]
    assert run.code == 0, run.output + "\n" + run.task_log("learner_0")[-3000:]
    for name in ("learner_0", "actor_0", "actor_1"):
        # Each exited by itself: launch.py never had to stop them.
        assert f"{name} exited with code 0" in run.output, run.output
    assert "stopping" not in run.output, run.output
    learner_log = run.task_log("learner_0")
    assert "Training done" in learner_log
    assert "2 of 2 actor task(s) confirmed the end of training" in learner_log
    sent = []
    for i in range(2):
        actor_log = run.task_log(f"actor_{i}")
        assert "learner finished" in actor_log
        sent += re.findall(r"one per environment: (\d+)\)", actor_log)
    # An actor task steps K environments and sends K unrolls a round. On a
    # loaded machine one actor can start so late that the other fills the
    # 2,000 frames alone, so not every actor need have sent one.
    assert sent and set(sent) == {str(envs_per_actor)}, sent
    assert saved_frames(run.logdir) >= LAUNCH_TARGET
    # The chief's record: the settings experiment.py resolves on one machine
    # for the same flags, launch.py's cluster or not.
    with open(os.path.join(run.logdir, "run_record.json")) as f:
        recorded = experiment_values(json.load(f)["settings"])
    single = experiment_values(
        resolved_settings(
            "--num_actors=2",
            *SMALL,
            f"--envs_per_actor={envs_per_actor}",
            *agent_flags,
            f"--total_environment_frames={LAUNCH_TARGET}",
            f"--logdir={tmp_path / 'single'}",
        )
    )
    assert recorded == single
    if "--popart" in agent_flags:
        reader = tf.train.load_checkpoint(run.logdir)
        assert reader.get_tensor("popart/mean").shape == (2,)
        assert reader.get_tensor("agent/baseline/w").shape == (256, 2)
        # At least one game's trajectories reached the learner (on a loaded
        # machine one actor task may start after the other finished).
        assert np.any(reader.get_tensor("popart/second_moment") != 1.0)
    if "--replay_proportion=0.5" in agent_flags:
        # The learner task replays from its buffer: the first line says it,
        # and its replayed unrolls are older than its fresh ones.
        assert "replay 1 of 2 unrolls from 20" in learner_log
        lags = re.search(
            r"mean policy lag ([\d.]+) updates \(replayed ([\d.]+)\)", learner_log
        )
        assert lags and float(lags.group(2)) >= float(lags.group(1)), learner_log[
            -2000:
        ]
    else:
        assert "mean policy lag" in learner_log and "(replayed" not in learner_log


def _saves(text: str, completed: bool = True) -> list[int]:
    """Frame counts of the checkpoints a learner's log shows as saved.

    completed: the 'after saving checkpoint N' lines (N is whole on disk);
    else the 'Saving checkpoints for N' lines, logged before N is written. A
    learner SIGKILLed between the two may or may not have N whole on disk.
    """
    pattern = (
        r"Calling checkpoint listeners after saving checkpoint (\d+)"
        if completed
        else r"Saving checkpoints for (\d+) into"
    )
    return [int(n) for n in re.findall(pattern, text)]


@pytest.mark.slow
def test_faults_actor_killed_and_restarted_learner_killed_and_restarted(
    tasks, tmp_path
):
    """One sequence, to start as few processes as possible:

    1. actors 0 and 1 start before the learner and wait for it; so does
       actor 2, whose --unroll_length and --use_lstm differ from the
       learner's: it stops with exit code 2 and a line naming each, and the
       learner carries on (actor 2 stays down for the rest of the test);
    2. actor 1 is SIGKILLed after its first unroll: the learner keeps
       training on actor 0 (three more updates saved after the kill);
    3. actor 1 is restarted, from TF_CONFIG this time, and rejoins;
    4. the learner is SIGKILLed: both actors notice within seconds;
    5. the learner is restarted: it resumes from its last checkpoint, both
       actors reconnect, it reaches its target and every task exits 0 by
       itself; the actors wrote nothing to their --logdir.
    """
    logdir = str(tmp_path / "run")
    # Actors get their own --logdir to show that they write nothing there.
    actor_logdir = str(tmp_path / "actor_logdir")
    learner_port, *actor_ports = ports.pick_free_ports(4)
    learner_host = f"localhost:{learner_port}"
    actor_hosts = [f"localhost:{p}" for p in actor_ports]
    address_flags = [
        f"--learner_host={learner_host}",
        f"--actor_hosts={','.join(actor_hosts)}",
        "--num_actors=3",
    ]

    def learner(name: str, target: int, *extra: str) -> subprocess.Popen:
        return tasks.start(
            name,
            [
                EXPERIMENT,
                "--job_name=learner",
                "--task=0",
                *address_flags,
                *SMALL,
                f"--logdir={logdir}",
                f"--total_environment_frames={target}",
                *extra,
            ],
        )

    def actor(
        name: str, task: int, *extra: str, tf_config: bool = False
    ) -> subprocess.Popen:
        if not tf_config:
            flags = ["--job_name=actor", f"--task={task}", *address_flags]
            env = None
        else:
            flags = ["--num_actors=3"]
            env = {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"learner": [learner_host], "actor": actor_hosts},
                        "task": {"type": "actor", "index": task},
                    }
                )
            }
        return tasks.start(
            name,
            [EXPERIMENT, *flags, *SMALL, f"--logdir={actor_logdir}", *extra],
            env,
        )

    # 1. Actors first.
    actor0 = actor("actor0", 0)
    actor1 = actor("actor1", 1)
    # Another unroll length and a feed-forward agent: the learner never
    # initialises this model, so the check runs while the actor waits.
    bad_actor = actor("actor2", 2, "--unroll_length=10", "--use_lstm=false")
    for name, process in (("actor0", actor0), ("actor1", actor1)):
        tasks.wait_for_line(
            name, "connecting to the learner", START_TIMEOUT_S, watch=process
        )
    # A target it never reaches: this learner is only ever killed. Frequent
    # checkpoints show its progress.
    first = learner("learner", 10**9, "--save_checkpoint_secs=2")

    # 2. Actor 1 SIGKILLed after one unroll; training goes on with actor 0.
    tasks.wait_for_line("actor1", "first unroll sent", START_TIMEOUT_S, watch=actor1)
    tasks.kill(actor1)
    offset = len(tasks.read("learner"))
    # The first save after the kill has at least the frames at the kill;
    # three updates after it took at least 6 unrolls, at most 1 of them
    # (sent before the kill) from actor 1.
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        saves = _saves(tasks.read("learner")[offset:])
        if len(saves) >= 2 and saves[-1] >= saves[0] + 3 * FRAMES_PER_UPDATE:
            break
        assert first.poll() is None, tasks.tail("learner")
        assert time.monotonic() < deadline, tasks.tail("learner")
        time.sleep(0.5)
    # The misconfigured actor met the learner's queue and stopped by itself.
    assert tasks.wait_exit("actor2", bad_actor, START_TIMEOUT_S) == 2
    refused = [
        line
        for line in tasks.read("actor2").splitlines()
        if line.startswith("experiment.py: error:")
    ]
    assert len(refused) == 2, tasks.tail("actor2")
    assert refused[0].startswith(
        f"experiment.py: error: --unroll_length=10: the chief at {learner_host} "
        "runs 20; start every task of the cluster with the same settings"
    )
    assert refused[1].startswith(
        f"experiment.py: error: --use_lstm=false: the chief at {learner_host} runs true"
    )

    # 3. Actor 1 restarted, with TF_CONFIG, rejoins the running learner.
    actor1 = actor("actor1_restarted", 1, tf_config=True)
    tasks.wait_for_line(
        "actor1_restarted", "first unroll sent", START_TIMEOUT_S, watch=actor1
    )

    # 4. The learner SIGKILLed; both actors notice.
    tasks.kill(first)
    killed = time.monotonic()
    learner_log = tasks.read("learner")  # All of it: the process is gone.
    last_saved, last_begun = max(_saves(learner_log)), max(_saves(learner_log, False))
    for name, process in (("actor0", actor0), ("actor1_restarted", actor1)):
        noticed = tasks.wait_for_line(
            name, "lost the learner", NOTICE_TIMEOUT_S, watch=process
        )
        assert noticed - killed < NOTICE_TIMEOUT_S

    # 5. The learner restarted from its checkpoint; everything ends by itself.
    target = last_begun + 4 * FRAMES_PER_UPDATE
    restarted = learner("learner_restarted", target)
    tasks.wait_for_line(
        "learner_restarted",
        r"Resuming from a checkpoint at \d+",
        START_TIMEOUT_S,
        watch=restarted,
    )
    restored = int(
        re.search(
            r"Resuming from a checkpoint at (\d+)", tasks.read("learner_restarted")
        ).group(1)
    )
    # The newest checkpoint that was whole when the learner died: at least
    # the last one its log reports finished, at most the last one begun.
    assert restored >= last_saved
    assert restored in _saves(learner_log, completed=False)
    assert_exit_0(tasks, "learner_restarted", restarted, RUN_TIMEOUT_S)
    for name, process in (("actor0", actor0), ("actor1_restarted", actor1)):
        assert_exit_0(tasks, name, process, NOTICE_TIMEOUT_S)
        log = tasks.read(name)
        assert "learner finished" in log
        # Connected to the first learner, then to its restart.
        assert len(re.findall("connected to the learner", log)) == 2, log[-3000:]
    assert saved_frames(logdir) >= target > restored
    assert "2 of 3 actor task(s) confirmed" in tasks.read("learner_restarted")
    # Nothing written by the actors; the learner's files are whole: the final
    # checkpoint loads (above) and its newest event file reads to the end.
    assert not os.path.exists(actor_logdir)
    newest_events = max(
        glob.glob(os.path.join(logdir, "events.out.tfevents.*")), key=os.path.getmtime
    )
    assert sum(1 for _ in tf.compat.v1.train.summary_iterator(newest_events)) > 0


@pytest.mark.slow
def test_sigterm_to_an_actor_task_and_sigint_to_its_learner(tasks, tmp_path):
    """The fault table's signal rows, in a running cluster, and its row of an
    actor task's environment killed while it starts: actor 0's environment
    process is SIGKILLed as it starts (killed_at_start.py, through the same
    supervisor as the single-machine actors): it is restarted and counted
    and actor 0 trains. SIGTERM to actor 1 ends it with 143 while the
    learner trains on actor 0's unrolls; then SIGINT to the learner ends it
    with 130 after a checkpoint holding every update it made (none lost),
    and actor 0 waits for it to come back."""
    logdir, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    learner_port, *actor_ports = ports.pick_free_ports(3)
    address_flags = [
        f"--learner_host=localhost:{learner_port}",
        f"--actor_hosts={','.join(f'localhost:{p}' for p in actor_ports)}",
        "--num_actors=2",
    ]
    actors = [
        tasks.start(
            f"actor{i}",
            [
                KILLED_AT_START_SCRIPT if i == 0 else EXPERIMENT,
                "--job_name=actor",
                f"--task={i}",
                *address_flags,
                *SMALL,
                f"--logdir={tmp_path / 'actor_logdir'}",
            ],
            env_extra={"KILLED_AT_START_MARKER": marker} if i == 0 else None,
        )
        for i in range(2)
    ]
    learner = start_learner(tasks, address_flags, logdir, 10**9, "--progress_secs=1")

    def frames() -> int:
        return max(_progress(tasks.read("learner")), default=0)

    def wait_for_frames(at_least: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S + RUN_TIMEOUT_S
        while frames() < at_least:
            assert learner.poll() is None, tasks.tail("learner")
            assert time.monotonic() < deadline, tasks.tail("learner")
            time.sleep(0.2)

    wait_for_frames(2 * FRAMES_PER_UPDATE)
    actors[1].send_signal(signal.SIGTERM)
    code = tasks.wait_exit("actor1", actors[1], NOTICE_TIMEOUT_S)
    assert code == 128 + signal.SIGTERM, tasks.tail("actor1")
    # The learner trains on with actor 0 alone: its environment, killed as
    # it started, was restarted.
    wait_for_frames(frames() + 2 * FRAMES_PER_UPDATE)
    with open(marker) as f:
        killed = int(f.read())
    actor_log = tasks.read("actor0")
    assert re.search(
        rf"Actor 0 \(atari/pong\): environment failed: PyProcess "
        rf"KilledAtStartAtari \(pid {killed}\) died: killed by signal SIGKILL",
        actor_log,
    ), actor_log[-3000:]
    assert "training continues (1 environment restart(s) in this run)" in actor_log
    learner.send_signal(signal.SIGINT)
    code = tasks.wait_exit("learner", learner, START_TIMEOUT_S)
    assert code == 128 + signal.SIGINT, tasks.tail("learner")
    assert saved_frames(logdir) >= frames()
    tasks.wait_for_line("actor0", "lost the learner", NOTICE_TIMEOUT_S)
    assert actors[0].poll() is None, tasks.tail("actor0")
    assert not os.path.exists(tmp_path / "actor_logdir")  # actors write nothing


@pytest.mark.slow
def test_a_run_resumed_with_one_then_two_then_one_learner_tasks(
    tasks, tmp_path, lstm_launch
):
    """launch.py on loopback, three times on one --logdir: 1 learner task
    (the "lstm" launch above, copied), then --num_learners=2 (the chief
    builds a tower on each learner task, actor j feeds learner j mod 2, one
    update from both towers counts both batches' frames), then 1 again. Each
    start restores the previous one's checkpoint (the variables do not depend
    on the number of learners), and every task of every start exits 0 by
    itself."""
    assert lstm_launch.code == 0, lstm_launch.output
    logdir = str(tmp_path / "run")
    # The checkpoint state names its files relative to the logdir.
    shutil.copytree(lstm_launch.logdir, logdir)
    logs = os.path.join(logdir, "logs")

    def launch(stage: str, num_learners: int, target: int) -> str:
        for name in os.listdir(logs):
            os.rename(os.path.join(logs, name), os.path.join(logs, f"{stage}.{name}"))
        launcher = tasks.start(
            stage,
            [
                LAUNCH,
                f"--num_learners={num_learners}",
                "--num_actors=2",
                f"--logdir={logdir}",
                *SMALL,
                f"--total_environment_frames={target}",
            ],
        )
        code = tasks.wait_exit(stage, launcher, START_TIMEOUT_S + RUN_TIMEOUT_S)
        with open(os.path.join(logs, "learner_0.log"), errors="replace") as f:
            chief = f.read()
        assert code == 0, tasks.read(stage) + "\n" + chief[-3000:]
        names = [f"learner_{k}" for k in range(num_learners)] + ["actor_0", "actor_1"]
        for name in names:
            # Each exited by itself: launch.py never had to stop them.
            assert f"{name} exited with code 0" in tasks.read(stage), name
        assert "Training done" in chief
        return chief

    first = saved_frames(logdir)
    assert first >= LAUNCH_TARGET
    first_weights = tf.train.load_checkpoint(logdir).get_tensor("agent/baseline/w")
    chief = launch("two", 2, first + 2 * 2 * FRAMES_PER_UPDATE)
    assert f"model.ckpt-{first}" in chief  # restored
    second = saved_frames(logdir)
    # Each update counts both towers' batches.
    assert second > first and (second - first) % (2 * FRAMES_PER_UPDATE) == 0
    assert not np.array_equal(
        first_weights,
        tf.train.load_checkpoint(logdir).get_tensor("agent/baseline/w"),
    )
    with open(os.path.join(logs, "learner_1.log"), errors="replace") as f:
        served = f.read()
    assert "serving tower 1" in served and "the chief has exited; exiting" in served
    assert "Saving checkpoints" not in served  # only the chief writes
    chief = launch("back", 1, second + FRAMES_PER_UPDATE)
    assert f"model.ckpt-{second}" in chief
    assert saved_frames(logdir) >= second + FRAMES_PER_UPDATE


def _progress(text: str) -> list[int]:
    """Frame counts of a learner's progress lines."""
    return [int(n.replace(",", "")) for n in re.findall(r"frames ([\d,]+) / ", text)]


@pytest.mark.slow
def test_a_learner_task_serving_a_tower_killed_and_restarted(tasks, tmp_path):
    """--num_learners=2, learner task 1 SIGKILLed mid-run: the chief notices
    (its step fails instead of hanging), waits for the task to be back and
    trains on from its own variables, with the default checkpoint interval
    (nothing saved since the start): no rollback. Actor 1, which feeds
    learner 1, reconnects by itself. Then the chief SIGKILLed: restarted, it
    resumes from its checkpoint, and the others wait for it. The run reaches
    its target and every task exits 0 by itself. Nothing checkpointed is
    lost."""
    logdir = str(tmp_path / "run")
    *learner_ports, a0, a1 = ports.pick_free_ports(4)
    cluster = [
        "--learner_host=" + ",".join(f"localhost:{p}" for p in learner_ports),
        f"--actor_hosts=localhost:{a0},localhost:{a1}",
        "--num_actors=2",
        "--num_learners=2",
    ]
    frames_per_update = 2 * FRAMES_PER_UPDATE
    target = 40 * frames_per_update

    def start(name: str, job: str, task: int, *extra: str) -> subprocess.Popen:
        return tasks.start(
            name,
            [
                EXPERIMENT,
                f"--job_name={job}",
                f"--task={task}",
                *cluster,
                *SMALL,
                f"--logdir={logdir if job == 'learner' and task == 0 else tmp_path / 'elsewhere'}",
                f"--total_environment_frames={target}",
                *extra,
            ],
        )

    served = start("learner_1", "learner", 1)
    actors = {f"actor_{i}": start(f"actor_{i}", "actor", i) for i in range(2)}
    # The default --save_checkpoint_secs (600): one checkpoint, at the start.
    # A progress line every second tells the frames trained so far.
    chief = start("chief", "learner", 0, "--progress_secs=1")
    # Two updates trained (the progress line says so), then learner task 1
    # killed.
    deadline = time.monotonic() + START_TIMEOUT_S + RUN_TIMEOUT_S
    while not [n for n in _progress(tasks.read("chief")) if n >= 2 * frames_per_update]:
        assert chief.poll() is None, tasks.tail("chief")
        assert time.monotonic() < deadline, tasks.tail("chief")
        time.sleep(0.2)
    killed_log = tasks.read("chief")
    tasks.kill(served)
    before = max(_progress(killed_log))
    assert before < target, "the run ended before the kill; raise the target"
    assert max(_saves(killed_log)) < before, "a checkpoint after the start"
    noticed = tasks.wait_for_line(
        "actor_1", "lost the learner", NOTICE_TIMEOUT_S, watch=actors["actor_1"]
    )
    assert noticed
    served = start("learner_1_restarted", "learner", 1)
    # The chief's session, recreated once the task is back, keeps the
    # variables on its server: the frame counter goes on from where it was
    # (at most the update in flight at the kill is lost, and it was never
    # applied), not from the checkpoint at the start. Then it trains on.
    recreated = r"variables on their server are intact at (\d+) environment frames"
    while not (
        re.search(recreated, tasks.read("chief"))
        and [n for n in _progress(tasks.read("chief")) if n > before]
    ):
        assert chief.poll() is None, tasks.tail("chief")
        assert time.monotonic() < deadline, tasks.tail("chief")
        time.sleep(0.2)
    chief_log = tasks.read("chief")
    kept = int(re.search(recreated, chief_log).group(1))
    assert kept >= before - frames_per_update, (kept, before)
    assert "Restoring parameters from" not in chief_log[len(killed_log) :]
    # Then the chief SIGKILLed and started again: it resumes from its
    # checkpoint, learner task 1 and the actors wait for it and carry on.
    tasks.kill(chief)
    last_saved = max(_saves(tasks.read("chief")))
    chief = start("chief_restarted", "learner", 0, "--progress_secs=1")
    tasks.wait_for_line(
        "chief_restarted", r"Resuming from a checkpoint at \d+", START_TIMEOUT_S
    )
    restored = int(
        re.search(
            r"Resuming from a checkpoint at (\d+)", tasks.read("chief_restarted")
        ).group(1)
    )
    assert restored >= last_saved
    for name, process in (("chief_restarted", chief), *actors.items()):
        assert_exit_0(tasks, name, process, START_TIMEOUT_S + RUN_TIMEOUT_S)
    assert_exit_0(tasks, "learner_1_restarted", served, NOTICE_TIMEOUT_S)
    assert "Training done" in tasks.read("chief_restarted")
    assert saved_frames(logdir) >= target
    log = tasks.read("actor_1")
    # The first chief, again after learner 1's restart, then the restarted chief.
    assert len(re.findall("connected to the learner", log)) == 3, log[-3000:]
    assert "the chief has exited; exiting" in tasks.read("learner_1_restarted")
