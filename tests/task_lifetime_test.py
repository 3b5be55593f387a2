"""No task outlives its run, on loopback: an actor task whose learner is gone
for good exits on its own (code 3, one line, its environment processes
stopped), as does a learner task serving a tower whose chief is gone; a
task that never had a learner keeps waiting; the bounds' bad values are one
line each. The partitions (a task cut off, not gone) need hosts of their
own: tests/netns_test.py.

How a finishing learner tells a gone task (refused) from an unreachable one
(no answer) is checked here against real sockets on loopback: a closed port,
and a listener that answers nothing.
"""

from __future__ import annotations

import os
import re
import socket
import time

import distributed_test
import pytest
from distributed_test import (
    EXPERIMENT,
    NOTICE_TIMEOUT_S,
    SMALL,
    START_TIMEOUT_S,
    start_learner,
)
from run_helpers import (
    child_pids,
    learner_gone_line,
    one_error_line,
    run_command_line,
)

from cluster import ports

LOST_SECS = 8
# The tasks it starts, each killed with its process group at the end.
tasks = distributed_test.tasks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # A zombie is gone too: only its exit status is left.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_an_actor_whose_learner_is_gone_for_good_exits_with_code_3(tasks, tmp_path):
    learner_port, actor_port = ports.pick_free_ports(2)
    learner_host = f"localhost:{learner_port}"
    address_flags = [
        f"--learner_host={learner_host}",
        f"--actor_hosts=localhost:{actor_port}",
        "--num_actors=1",
    ]
    learner = start_learner(
        tasks, address_flags, str(tmp_path / "run"), 10**9, "--save_checkpoint_secs=600"
    )
    actor = tasks.start(
        "actor",
        [
            EXPERIMENT,
            "--job_name=actor",
            "--task=0",
            *address_flags,
            *SMALL,
            f"--learner_lost_secs={LOST_SECS}",
            f"--logdir={tmp_path / 'actor'}",
        ],
    )
    tasks.wait_for_line("actor", "first unroll sent", START_TIMEOUT_S, watch=actor)
    environments = child_pids(actor.pid)
    assert environments, "the actor task runs its environment in a process"
    # The learner dies and never comes back.
    tasks.kill(learner)
    killed = time.monotonic()
    code = tasks.wait_exit("actor", actor, NOTICE_TIMEOUT_S + LOST_SECS + 30)
    waited = time.monotonic() - killed
    assert code == 3, tasks.tail("actor")
    assert waited >= LOST_SECS
    line = one_error_line(tasks.read("actor"))
    assert re.fullmatch(
        learner_gone_line("actor task 0", learner_host, LOST_SECS), line
    )
    # Nothing of it is left: its environment processes exited with it.
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in environments) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in environments if _alive(pid)]


def test_a_learner_task_whose_chief_is_gone_for_good_exits_with_code_3(tasks, tmp_path):
    """--num_learners=2: learner task 1 serves the chief's tower; the chief
    dies and never comes back, and task 1 exits by itself."""
    *learner_ports, a0, a1 = ports.pick_free_ports(4)
    chief_host = f"localhost:{learner_ports[0]}"
    # Two actor tasks listed (one for each learner), none started: the
    # chief waits for unrolls that never come.
    cluster = [
        "--learner_host=" + ",".join(f"localhost:{p}" for p in learner_ports),
        f"--actor_hosts=localhost:{a0},localhost:{a1}",
        "--num_actors=2",
        "--num_learners=2",
    ]

    def start(name: str, task: int, *extra: str):
        return tasks.start(
            name,
            [
                EXPERIMENT,
                "--job_name=learner",
                f"--task={task}",
                *cluster,
                *SMALL,
                f"--logdir={tmp_path / name}",
                "--total_environment_frames=1000000000",
                *extra,
            ],
        )

    served = start("learner_1", 1, f"--learner_lost_secs={LOST_SECS}")
    chief = start("chief", 0)
    tasks.wait_for_line(
        "learner_1", "serving the chief at", START_TIMEOUT_S + 30, watch=served
    )
    tasks.kill(chief)
    killed = time.monotonic()
    code = tasks.wait_exit("learner_1", served, NOTICE_TIMEOUT_S + LOST_SECS + 30)
    assert code == 3, tasks.tail("learner_1")
    assert time.monotonic() - killed >= LOST_SECS
    line = one_error_line(tasks.read("learner_1"))
    assert re.fullmatch(
        learner_gone_line("learner task 1", chief_host, LOST_SECS), line
    ), line


def test_an_actor_that_never_had_a_learner_keeps_waiting(tasks, tmp_path):
    learner_port, actor_port = ports.pick_free_ports(2)
    actor = tasks.start(
        "actor",
        [
            EXPERIMENT,
            "--job_name=actor",
            "--task=0",
            f"--learner_host=localhost:{learner_port}",
            f"--actor_hosts=localhost:{actor_port}",
            "--num_actors=1",
            *SMALL,
            "--learner_lost_secs=2",
            "--progress_secs=2",
            f"--logdir={tmp_path / 'actor'}",
        ],
    )
    # Well past its bound, it still waits for a learner to start.
    tasks.wait_for_line(
        "actor",
        r"waiting for the learner at .* \(1\d s so far",
        START_TIMEOUT_S + 20,
        watch=actor,
    )
    assert actor.poll() is None


@pytest.mark.parametrize(
    "flag,value",
    [("learner_lost_secs", 0), ("learner_lost_secs", -5), ("finish_wait_secs", 0)],
)
def test_a_bound_of_zero_or_less_is_one_line_naming_the_flag(
    tmp_path, capsys, flag, value
):
    code = run_command_line(*SMALL, f"--{flag}={value}", f"--logdir={tmp_path / 'r'}")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0, err
    assert err.startswith(f"experiment.py: error: --{flag}={value}: must be > 0"), err
    assert not (tmp_path / "r").exists()


def test_a_refused_connection_is_a_gone_task_and_no_answer_an_unreachable_one():
    (port,) = ports.pick_free_ports(1)  # nothing listens there
    assert ports.task_status(f"localhost:{port}") == ports.GONE
    # A host that does not answer, on loopback: a listener whose queue of
    # connections not yet accepted is full drops every new connection's
    # first packet, so the connect times out as one across a partition does.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        host = f"127.0.0.1:{server.getsockname()[1]}"
        # The first connection fills the queue (listen(0) holds one).
        assert ports.task_status(host) == ports.LISTENING
        assert ports.task_status(host, timeout_secs=0.5) == ports.UNREACHABLE
        # Accepted, the queue has room again: the task answers.
        server.accept()[0].close()
        assert ports.task_status(host) == ports.LISTENING
