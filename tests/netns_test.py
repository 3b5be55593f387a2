"""A learner and actors on separate network stacks (Linux network namespaces).

Each task runs on its own "host" of a tests/virtual_network.py network: its
own namespace and address, joined to the others by a bridge. So the
addresses are real and different, and a host can drop off the network
(`ip link set eth0 down` in its namespace) the way a pulled cable or a
failed switch port takes it away: its connections neither close nor reset,
they just stop answering. Loopback cannot show that.

Every wait is bounded; the measured detection and recovery times are
printed (run with -s to see them) and checked against what README.md says.
Needs root and `ip` (CI has both); elsewhere the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import virtual_network
from run_helpers import (
    REPO_ROOT,
    SCRIPT,
    child_pids,
    learner_gone_line,
    one_error_line,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        virtual_network.available() is not None,
        reason=f"virtual network: {virtual_network.available()}",
    ),
]

SMALL = [
    "--level_name=atari/pong",
    "--agent=shallow",
    # One environment an actor task: Atari's defaults (its flag file, which
    # cluster tasks take as single-machine runs do) would give each 32.
    "--envs_per_actor=1",
    "--batch_size=2",
    "--unroll_length=20",
]
LEARNER_PORT, ACTOR_PORT = 8000, 8001
START_TIMEOUT_S = 120
# README.md, "Several hosts": an actor notices a learner whose host vanished
# within about 15 s (an enqueue waits 5 s, the check that follows 10 s).
LEARNER_VANISHED_NOTICE_S = 15
# How long a test waits for an actor to notice: a guard against a hang, not
# the figure above (which a loaded machine stretches). Without the enqueue
# timeout and gRPC keepalive, a call to a vanished host waits out the
# kernel's TCP retransmissions (~15 minutes): noticing within the guard
# shows they work; how soon is reported (report()), not asserted.
NOTICE_GUARD_S = 4 * LEARNER_VANISHED_NOTICE_S


class Cluster:
    """A learner on host 0 and actors on hosts 1..N, each with a log file."""

    def __init__(self, network, directory: str, num_actors: int, tf_config=False):
        self.network = network
        self.directory = directory
        self.num_actors = num_actors
        self.tf_config = tf_config
        self.learner_host = f"{network.addresses[0]}:{LEARNER_PORT}"
        self.actor_hosts = [
            f"{network.addresses[i + 1]}:{ACTOR_PORT}" for i in range(num_actors)
        ]
        self.logdir = os.path.join(directory, "logdir")
        self.processes: dict[str, subprocess.Popen] = {}

    def _argv(self, job: str, task: int, extra: list[str]) -> tuple[list[str], dict]:
        argv = [sys.executable, SCRIPT, *SMALL, f"--logdir={self.logdir}", *extra]
        env = dict(os.environ)
        if self.tf_config:
            env["TF_CONFIG"] = json.dumps(
                {
                    "cluster": {
                        "learner": [self.learner_host],
                        "actor": self.actor_hosts,
                    },
                    "task": {"type": job, "index": task},
                }
            )
            argv += [f"--job_name={job}", f"--task={task}"]
        else:
            env.pop("TF_CONFIG", None)
            argv += [
                f"--job_name={job}",
                f"--task={task}",
                f"--num_actors={self.num_actors}",
                f"--learner_host={self.learner_host}",
                f"--actor_hosts={','.join(self.actor_hosts)}",
            ]
        return argv, env

    def start(self, name: str, job: str, task: int, *extra: str) -> subprocess.Popen:
        host = 0 if job == "learner" else task + 1
        argv, env = self._argv(job, task, list(extra))
        log = open(self.log_path(name), "a")  # noqa: SIM115 - the child holds it
        process = self.network.popen(
            host, argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        self.processes[name] = process
        return process

    def start_training(self) -> list[str]:
        """Starts the learner and every actor on a far target, checkpointing
        every 2 s, and waits until all send unrolls and the learner trains.
        Returns the extra flags, to restart a task with."""
        far = [
            "--total_environment_frames=100000000",
            "--save_checkpoint_secs=2",
            # A learner restarted within this is found again (the faults
            # test's step 3); a partition no test here makes lasts longer.
            "--learner_lost_secs=300",
        ]
        self.start("learner", "learner", 0, *far)
        for task in range(self.num_actors):
            self.start(f"actor{task}", "actor", task, *far)
        for task in range(self.num_actors):
            self.wait_for(f"actor{task}", r"first unroll sent", START_TIMEOUT_S)
        self.wait_for_frames_past(0, START_TIMEOUT_S)
        return far

    def log_path(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.log")

    def read(self, name: str) -> str:
        with open(self.log_path(name), errors="replace") as f:
            return f.read()

    def tail(self, name: str, lines: int = 40) -> str:
        return "\n".join(self.read(name).splitlines()[-lines:])

    def wait_for(self, name: str, pattern: str, timeout: float, count: int = 1):
        """Waits until `name`'s log has `count` matches of `pattern`; returns
        the time (time.monotonic) they were seen and the last match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        process = self.processes[name]
        while True:
            matches = list(regex.finditer(self.read(name)))
            if len(matches) >= count:
                return time.monotonic(), matches[-1]
            if process.poll() is not None:
                pytest.fail(
                    f"{name} exited ({process.returncode}) before {pattern!r} "
                    f"x{count}:\n{self.tail(name)}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{name}: no {pattern!r} x{count} in {timeout} s:\n{self.tail(name)}"
                )
            time.sleep(0.2)

    def frames(self, name: str = "learner") -> int:
        """The newest frame count the learner logged as saved."""
        found = re.findall(r"Saving checkpoints for (\d+) ", self.read(name))
        return int(found[-1]) if found else 0

    def wait_for_frames_past(
        self, frames: int, timeout: float, name: str = "learner"
    ) -> float:
        """Waits until learner `name` saved a checkpoint past `frames`."""
        deadline = time.monotonic() + timeout
        while self.frames(name) <= frames:
            if self.processes[name].poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"{name} did not train past {frames} frames:\n{self.tail(name)}"
                )
            time.sleep(0.2)
        return time.monotonic()

    def exit_code(self, name: str, timeout: float) -> int:
        try:
            return self.processes[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {timeout} s:\n{self.tail(name)}")


@pytest.fixture
def network():
    with virtual_network.VirtualNetwork(4) as net:
        yield net
    # Nothing is left: no namespace, veth or bridge of ours.
    assert virtual_network.ours(virtual_network.namespaces()) == []
    assert virtual_network.ours(virtual_network.links()) == []


def report(what: str, seconds: float) -> None:
    print(f"[netns] {what}: {seconds:.1f} s", flush=True)


# -- training to the target across hosts -------------------------------------------


def test_a_learner_and_two_actor_hosts_train_to_the_target_from_tf_config(
    network, tmp_path
):
    """The cluster from TF_CONFIG; the other tests here give it as address
    flags."""
    cluster = Cluster(network, str(tmp_path), num_actors=2, tf_config=True)
    target = "--total_environment_frames=2000"
    cluster.start("learner", "learner", 0, target)
    # The actors start once the chief has written the run's record to the
    # logdir they share, so that they always meet it (they restore what
    # they are not given from it).
    record = os.path.join(cluster.logdir, "run_record.json")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(record):
        assert cluster.processes["learner"].poll() is None, cluster.tail("learner")
        assert time.monotonic() < deadline, cluster.tail("learner")
        time.sleep(0.2)
    for task in range(2):
        cluster.start(f"actor{task}", "actor", task, target)
    for name in ("learner", "actor0", "actor1"):
        code = cluster.exit_code(name, timeout=START_TIMEOUT_S + 60)
        assert code == 0, f"{name} exited {code}:\n{cluster.tail(name)}"
    learner = cluster.read("learner")
    assert "Training done" in learner
    assert "2 of 2 actor task(s) confirmed the end of training" in learner
    # The tasks really were on their own addresses.
    assert f"Learner task at {cluster.learner_host}" in learner
    for task in range(2):
        actor = cluster.read(f"actor{task}")
        assert f"Actor task {task} at {cluster.actor_hosts[task]}" in actor
        assert "learner finished training" in actor
    # The chief recorded the cluster's actors, and the actor tasks took
    # their number from TF_CONFIG, not from that record.
    with open(record) as f:
        assert json.load(f)["settings"]["num_actors"] == {
            "value": 2,
            "source": "TF_CONFIG",
        }


def test_two_learner_hosts_and_two_actor_hosts_train_to_the_target(network, tmp_path):
    """--num_learners=2 from TF_CONFIG's learner list: learner tasks on hosts
    0 (the chief) and 1, actors on hosts 2 and 3; the chief's towers run on
    both learner hosts, each replaying half its batch from a buffer on its
    own host, and every task exits 0 by itself."""
    cluster = {
        "learner": [f"{network.addresses[i]}:{LEARNER_PORT}" for i in (0, 1)],
        "actor": [f"{network.addresses[i]}:{ACTOR_PORT}" for i in (2, 3)],
    }
    logdir = str(tmp_path / "logdir")
    processes = {}
    for host, (job, task) in enumerate(
        [("learner", 0), ("learner", 1), ("actor", 0), ("actor", 1)]
    ):
        name = f"{job}{task}"
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": job, "index": task}}
        )
        with open(tmp_path / f"{name}.log", "a") as log:
            processes[name] = network.popen(
                host,
                [
                    sys.executable,
                    SCRIPT,
                    *SMALL,
                    "--num_learners=2",
                    "--replay_proportion=0.5",
                    "--replay_capacity=4",
                    "--total_environment_frames=2000",
                    f"--logdir={logdir if name == 'learner0' else tmp_path / name}",
                ],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
    for name, process in processes.items():
        try:
            code = process.wait(timeout=START_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            code = None
        log = (tmp_path / f"{name}.log").read_text(errors="replace")
        assert code == 0, f"{name} exited {code}:\n{log[-3000:]}"
    chief = (tmp_path / "learner0.log").read_text(errors="replace")
    assert "Training done" in chief
    assert "1 of 1 learner task(s) confirmed the end of training" in chief
    assert re.search(r"replay 1 of 2 unrolls from 4 \(", chief), chief[-3000:]
    lags = re.search(r"mean policy lag ([\d.]+) updates \(replayed ([\d.]+)\)", chief)
    assert lags, chief[-3000:]
    served = (tmp_path / "learner1.log").read_text(errors="replace")
    assert f"Learner task 1 at {cluster['learner'][1]}: serving tower 1" in served
    for task in range(2):
        actor = (tmp_path / f"actor{task}.log").read_text(errors="replace")
        assert f"Actor task {task} at {cluster['actor'][task]}" in actor
        assert "learner finished training" in actor


# -- hosts drop off and come back; then the learner is killed and restarted ----------


def test_an_actor_host_then_the_learner_host_drop_off_and_the_learner_restarts(
    network, tmp_path
):
    """One cluster (its start is the costly part), three faults in turn:
    1. actor 1's host drops off: that actor notices, the learner trains on
       actor 0's unrolls, and once the host is back actor 1 rejoins without
       a restart;
    2. the learner's host drops off: both actors notice and keep trying,
       and reconnect once it is back; the learner trains again;
    3. the learner dies for good and a new one takes over its address: it
       resumes from its checkpoint and both actors reconnect to it."""
    cluster = Cluster(network, str(tmp_path), num_actors=2)
    far = cluster.start_training()

    def connections(task: int) -> int:
        return len(
            re.findall(
                rf"Actor {task}: connected to the learner", cluster.read(f"actor{task}")
            )
        )

    # 1. Actor 1's host.
    actor1_pid = cluster.processes["actor1"].pid
    network.set_link(2, up=False)  # host 2 is actor 1's
    down_at = time.monotonic()
    frames_at_down = cluster.frames()
    noticed_at, _ = cluster.wait_for("actor1", r"lost the learner", NOTICE_GUARD_S)
    report("actor host down -> that actor notices", noticed_at - down_at)
    # The learner trains on actor 0's unrolls meanwhile (2 checkpoints on).
    cluster.wait_for_frames_past(frames_at_down, 30)
    went_on_at = cluster.wait_for_frames_past(cluster.frames(), 30)
    report("actor host down -> learner still training", went_on_at - down_at)

    network.set_link(2, up=True)
    up_at = time.monotonic()
    connected_at, _ = cluster.wait_for(
        "actor1", r"Actor 1: connected to the learner", 90, count=2
    )
    report("actor host back -> actor reconnected", connected_at - up_at)
    sends_before = len(re.findall(r"unrolls sent", cluster.read("actor1")))
    cluster.wait_for("actor1", r"unrolls sent", 60, count=sends_before + 1)
    # The same process all along: it rejoined without a restart.
    assert cluster.processes["actor1"].poll() is None
    assert cluster.processes["actor1"].pid == actor1_pid
    assert cluster.processes["learner"].poll() is None

    # 2. The learner's host.
    lost_before = [
        len(re.findall(r"lost the learner", cluster.read(f"actor{task}")))
        for task in range(2)
    ]
    connected_before = [connections(task) for task in range(2)]
    network.set_link(0, up=False)
    down_at = time.monotonic()
    for task in range(2):
        noticed_at, _ = cluster.wait_for(
            f"actor{task}",
            r"lost the learner",
            NOTICE_GUARD_S,
            count=lost_before[task] + 1,
        )
        report(f"learner host down -> actor {task} notices", noticed_at - down_at)
    # They keep trying while it is away: still running a while later (a
    # slower machine cannot make this fail, only an actor that gives up).
    time.sleep(5)
    for task in range(2):
        assert cluster.processes[f"actor{task}"].poll() is None

    frames_before = cluster.frames()
    network.set_link(0, up=True)
    up_at = time.monotonic()
    for task in range(2):
        connected_at, _ = cluster.wait_for(
            f"actor{task}",
            rf"Actor {task}: connected to the learner",
            90,
            count=connected_before[task] + 1,
        )
        report(f"learner host back -> actor {task} reconnected", connected_at - up_at)
    trained_at = cluster.wait_for_frames_past(frames_before, 60)
    report("learner host back -> learner training again", trained_at - up_at)

    # 3. The learner dies for good and a new one takes over its address.
    connected_before = [connections(task) for task in range(2)]
    os.killpg(cluster.processes["learner"].pid, signal.SIGKILL)
    cluster.processes["learner"].wait(timeout=30)
    killed_at = time.monotonic()
    cluster.start("learner_restarted", "learner", 0, *far)
    cluster.wait_for("learner_restarted", r"Resuming from a checkpoint at \d+", 120)
    for task in range(2):
        connected_at, _ = cluster.wait_for(
            f"actor{task}",
            rf"Actor {task}: connected to the learner",
            120,
            count=connected_before[task] + 1,
        )
        report(
            f"learner restarted -> actor {task} reconnected", connected_at - killed_at
        )
    resumed = int(
        re.search(
            r"Resuming from a checkpoint at (\d+)", cluster.read("learner_restarted")
        ).group(1)
    )
    # The new learner trains on the reconnected actors' unrolls.
    cluster.wait_for_frames_past(resumed, 60, name="learner_restarted")


# -- an actor with no learner to talk to -----------------------------------------------


def test_an_actor_without_a_learner_waits_and_stops_on_sigterm(network, tmp_path):
    # Host 0 is up, but no learner listens there.
    cluster = Cluster(network, str(tmp_path), num_actors=1)
    actor = cluster.start("actor0", "actor", 0, "--total_environment_frames=2000")
    cluster.wait_for("actor0", r"waiting for the learner at", START_TIMEOUT_S)
    assert actor.poll() is None
    actor.send_signal(signal.SIGTERM)
    sent_at = time.monotonic()
    code = cluster.exit_code("actor0", timeout=20)
    report("actor without a learner: SIGTERM -> exit", time.monotonic() - sent_at)
    assert code == 128 + signal.SIGTERM, cluster.tail("actor0")


# -- the end of training across a partition ------------------------------------------


def _end_of_training_with_actor_1_cut_off(
    cluster, network, learner_flags: list[str], actor_flags: list[str]
) -> None:
    """Trains on hosts 0 (learner) to 2 (actors 0 and 1), cuts actor 1's
    host off once the learner has saved past 800 frames, and returns once
    the learner has reached its target (2,400 frames more, from actor 0's
    unrolls alone) with actor 1 still cut off."""
    common = ["--save_checkpoint_secs=2"]
    cluster.start("learner", "learner", 0, *common, *learner_flags)
    for task in range(2):
        cluster.start(f"actor{task}", "actor", task, *common, *actor_flags)
    for task in range(2):
        cluster.wait_for(f"actor{task}", r"first unroll sent", START_TIMEOUT_S)
    cluster.wait_for_frames_past(800, START_TIMEOUT_S)
    network.set_link(2, up=False)  # host 2 is actor 1's
    cut_at = time.monotonic()
    cluster.wait_for("learner", r"Reached \d+ environment frames", START_TIMEOUT_S)
    report("actor host cut -> learner at its target", time.monotonic() - cut_at)


def test_a_partition_across_the_end_of_training_heals_and_every_task_exits_0(
    network, tmp_path
):
    """The learner reaches its target while actor 1's host is cut off; the
    link comes back within --finish_wait_secs (its default, 120 s): the
    learner has kept serving the end of training, actor 1 finds it and
    confirms, and every task exits 0 by itself."""
    cluster = Cluster(network, str(tmp_path), num_actors=2)
    target = "--total_environment_frames=3200"
    _end_of_training_with_actor_1_cut_off(cluster, network, [target], [target])
    # The learner waits for the host it cannot reach (it is not gone).
    time.sleep(3)
    assert cluster.processes["learner"].poll() is None, cluster.tail("learner")
    network.set_link(2, up=True)
    up_at = time.monotonic()
    for name in ("actor1", "actor0", "learner"):
        code = cluster.exit_code(name, timeout=150)
        assert code == 0, f"{name} exited {code}:\n{cluster.tail(name)}"
    report("actor host back -> every task exited", time.monotonic() - up_at)
    learner = cluster.read("learner")
    assert "2 of 2 actor task(s) confirmed the end of training." in learner, learner[
        -3000:
    ]
    assert "learner finished training" in cluster.read("actor1")


def test_a_partition_longer_than_the_bounds_ends_every_task_with_its_line(
    network, tmp_path
):
    """Actor 1's host stays cut off past the learner's --finish_wait_secs:
    the learner exits 0 naming the task that never confirmed; the actor,
    without a learner for --learner_lost_secs, stops its environment
    processes and exits with code 3 and one line; no process is left."""
    cluster = Cluster(network, str(tmp_path), num_actors=2)
    target = "--total_environment_frames=3200"
    _end_of_training_with_actor_1_cut_off(
        cluster,
        network,
        [target, "--finish_wait_secs=5"],
        [target, "--learner_lost_secs=20"],
    )
    actor1 = cluster.processes["actor1"]
    environments = child_pids(actor1.pid)
    assert environments, cluster.tail("actor1")
    for name in ("learner", "actor0"):
        code = cluster.exit_code(name, timeout=90)
        assert code == 0, f"{name} exited {code}:\n{cluster.tail(name)}"
    learner = cluster.read("learner")
    assert re.search(
        r"1 of 2 actor task\(s\) confirmed the end of training; never confirmed: "
        r"1 \(unreachable for \d+ s; --finish_wait_secs=5\)",
        learner,
    ), learner[-3000:]
    # Back on the network after the learner has gone: nothing listens there
    # now, and the actor exits once its bound is over.
    network.set_link(2, up=True)
    code = cluster.exit_code("actor1", timeout=120)
    assert code == 3, cluster.tail("actor1")
    line = one_error_line(cluster.read("actor1"))
    assert re.fullmatch(
        learner_gone_line("actor task 1", cluster.learner_host, 20), line
    ), line
    deadline = time.monotonic() + 10
    while [p for p in environments if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in environments if _alive(p)]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
