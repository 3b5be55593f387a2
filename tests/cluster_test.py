"""Tests for addresses.py (addresses, servers, fast start-up) and launch.py.

Loopback only: every port is picked free at run time; every wait is bounded.
The launcher tests run a tiny fake program instead of experiment.py: they check
the launcher's process handling (logs, exit codes, signals), which does not
depend on what the tasks do, and a fake starts in milliseconds.
"""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from cluster import addresses, hosts, ports, servers, spec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tf_config(cluster_def, task=None, **extra):
    data = {"cluster": cluster_def, **extra}
    if task is not None:
        data["task"] = task
    return json.dumps(data)


# ---------------------------------------------------------------------------
# Addresses from flags.


def test_flags_defaults_follow_the_reference_layout():
    config = addresses.cluster_from_flags("localhost:8000", "", 3, "actor", 2)
    assert config == spec.ClusterConfig(
        "localhost:8000",
        ("localhost:8001", "localhost:8002", "localhost:8003"),
        "actor",
        2,
        "flags",
    )
    assert config.num_actors == 3
    assert config.address == "localhost:8003"
    assert config.device == "/job:actor/task:2"
    assert not config.is_learner


def test_flags_explicit_hosts():
    config = addresses.cluster_from_flags(
        "10.0.0.1:9000",
        "host-a.example.com:9001, 10.0.0.3:9001,[::1]:9002",
        3,
        "learner",
        0,
    )
    assert config.actor_hosts == (
        "host-a.example.com:9001",
        "10.0.0.3:9001",
        "[::1]:9002",
    )
    assert config.is_learner and config.address == "10.0.0.1:9000"


@pytest.mark.parametrize(
    "learner, actors, num_actors, job, task, expected",
    [
        (
            "localhost",
            "",
            2,
            "actor",
            0,
            "--learner_host: address 'localhost' has no port",
        ),
        ("localhost:0", "", 2, "actor", 0, "--learner_host: port 0"),
        ("localhost:70000", "", 2, "actor", 0, "port 70000"),
        ("localhost:80a", "", 2, "actor", 0, "port '80a'"),
        ("bad_host!:8000", "", 2, "actor", 0, "invalid host name 'bad_host!'"),
        ("-host:8000", "", 2, "actor", 0, "invalid host name '-host'"),
        ("10.0.0.256:8000", "", 2, "actor", 0, "not a valid IPv4 address"),
        ("::1:8000", "", 2, "actor", 0, "IPv6 address without brackets"),
        ("[::1:8000", "", 2, "actor", 0, "never closes"),
        ("[nothex]:8000", "", 2, "actor", 0, "is not an IPv6 address"),
        ("[::1]", "", 2, "actor", 0, "has no port"),
        ("h:1", "a:1,b", 2, "actor", 0, "--actor_hosts: address 'b' has no port"),
        ("h:1", "a:1,,b:2", 3, "actor", 0, "empty address at position 1"),
        (
            "h:1",
            "a:1,a:1",
            2,
            "actor",
            0,
            "actor task 1 ('a:1') duplicates actor task 0",
        ),
        ("h:1", "A:1,a:1", 2, "actor", 0, "duplicates"),
        ("h:1", "h:1", 1, "actor", 0, "duplicates learner task 0"),
        (
            "localhost:8000",
            "127.0.0.1:8000",
            1,
            "actor",
            0,
            "same port on this machine",
        ),
        (
            "h:1",
            "a:1,b:1",
            3,
            "actor",
            0,
            "--actor_hosts lists 2 address(es) but --num_actors=3",
        ),
        ("h:1", "", 0, "actor", 0, "--num_actors=0"),
        ("h:1", "", 2, "actor", 2, "--task=2 is out of range for the actors"),
        ("h:1", "", 2, "actor", -1, "--task=-1 is out of range"),
        ("h:1", "", 2, "learner", 1, "--task=1 is out of range for the learner"),
        ("h:1", "", 2, "ps", 0, "--job_name='ps' is not a job"),
    ],
)
def test_flags_errors(learner, actors, num_actors, job, task, expected):
    with pytest.raises(ValueError) as info:
        addresses.cluster_from_flags(learner, actors, num_actors, job, task)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message  # One clear line.


def test_error_names_flag_value_and_fix():
    with pytest.raises(ValueError, match="use a port from 1 to 65535") as info:
        addresses.cluster_from_flags("h:1", "a:1,b:70000", 2, "actor", 0)
    assert str(info.value).startswith("--actor_hosts: port 70000 in 'b:70000'")


# ---------------------------------------------------------------------------
# Addresses from TF_CONFIG, and precedence.


def from_tf_config(value: str) -> spec.ClusterConfig:
    """The cluster and this task that a TF_CONFIG value alone describes
    (no address flag given, as experiment.py resolves it)."""
    return addresses.resolve_cluster(
        hosts.DEFAULT_LEARNER_HOST,
        hosts.DEFAULT_ACTOR_HOSTS,
        0,
        "learner",
        -1,
        tf_config=value,
        explicit_flags=(),
    )


def test_tf_config_learner_actor_names():
    value = _tf_config(
        {"learner": ["l:8000"], "actor": ["a0:8001", "a1:8001"]},
        {"type": "actor", "index": 1},
        environment="cloud",  # Other top-level keys are ignored.
    )
    config = from_tf_config(value)
    assert config[:4] == ("l:8000", ("a0:8001", "a1:8001"), "actor", 1)
    assert config.source == "TF_CONFIG"


# What Kubeflow's training-operator (v1, pkg/controller.v1/tensorflow/
# tensorflow.go: genTFConfigJSONStr, genClusterSpec) writes into each
# replica's TF_CONFIG: Go's json.Marshal of {cluster, task, environment},
# map keys sorted, each address "<job>-<type>-<i>.<namespace>.svc:<port>"
# (port 2222 by default), the replica type lower-cased.
TFJOB_ONE_LEARNER = (
    '{"cluster":{"chief":["impala-chief-0.default.svc:2222"],"worker":'
    '["impala-worker-0.default.svc:2222","impala-worker-1.default.svc:2222"]},'
    '"task":{"type":"worker","index":1},"environment":"cloud"}'
)
TFJOB_TWO_LEARNERS = (
    '{"cluster":{"master":["impala-master-0.rl.svc:2222"],"ps":'
    '["impala-ps-0.rl.svc:2222"],"worker":["impala-worker-0.rl.svc:2222",'
    '"impala-worker-1.rl.svc:2222","impala-worker-2.rl.svc:2222"]},'
    '"task":{"type":"ps","index":0},"environment":"cloud"}'
)


def test_a_tfjobs_tf_config_with_one_learner():
    config = from_tf_config(TFJOB_ONE_LEARNER)
    assert config[:4] == (
        "impala-chief-0.default.svc:2222",
        ("impala-worker-0.default.svc:2222", "impala-worker-1.default.svc:2222"),
        "actor",
        1,
    )


def test_a_tfjobs_tf_config_with_a_master_and_a_ps_replica_is_two_learner_tasks():
    """Master (or Chief) is learner task 0, PS replica i learner task i + 1
    (here this task: learner task 1), Worker i actor i."""
    config = from_tf_config(TFJOB_TWO_LEARNERS)
    assert config.learner_hosts == (
        "impala-master-0.rl.svc:2222",
        "impala-ps-0.rl.svc:2222",
    )
    assert config.num_actors == 3
    assert (config.job_name, config.task) == ("learner", 1)
    # A bad address is named as the TFJob's replica.
    bad = TFJOB_TWO_LEARNERS.replace("impala-ps-0.rl.svc:2222", "impala-ps-0:x")
    with pytest.raises(ValueError, match=r"TF_CONFIG cluster\.ps\[0\]"):
        from_tf_config(bad)


@pytest.mark.parametrize(
    "cluster, expected",
    [
        (
            {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
            "this program has no evaluator task",
        ),
        ({"chief": ["c:1"], "worker": {"0": "w:1"}}, "enableDynamicWorker"),
        ({"chief": ["c:1"], "master": ["m:1"], "worker": ["w:1"]}, "jobs"),
        ({"ps": ["p:1"], "worker": ["w:1"]}, "jobs ['ps', 'worker']"),
    ],
)
def test_tfjob_layouts_this_program_cannot_run(cluster, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        from_tf_config(_tf_config(cluster, {"type": "worker", "index": 0}))


def test_tf_config_chief_worker_names():
    value = _tf_config(
        {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222", "w2:2222"]},
        {"type": "chief", "index": 0},
    )
    config = from_tf_config(value)
    assert config[:4] == ("c:2222", ("w0:2222", "w1:2222", "w2:2222"), "learner", 0)
    value = _tf_config(
        {"chief": ["c:2222"], "worker": ["w0:2222"]}, {"type": "worker", "index": 0}
    )
    assert from_tf_config(value)[2:4] == ("actor", 0)


@pytest.mark.parametrize(
    "value, expected",
    [
        ('{"cluster": ', "TF_CONFIG is not valid JSON"),
        ("[1, 2]", 'has no "cluster" object'),
        ('{"task": {"type": "actor", "index": 0}}', 'has no "cluster" object'),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": ["a:2"], "ps": ["p:3"]},
                {"type": "actor", "index": 0},
            ),
            "jobs ['actor', 'learner', 'ps']",
        ),
        (
            _tf_config(
                {"chief": ["l:1"], "actor": ["a:2"]}, {"type": "actor", "index": 0}
            ),
            '["chief", "worker"]',
        ),
        (
            _tf_config(
                {"chief": ["l:1", "l:2"], "worker": ["a:2"]},
                {"type": "worker", "index": 0},
            ),
            "cluster.chief lists 2 addresses; a TFJob's Chief is one replica "
            "(learner task 0): give further learner tasks as PS replicas",
        ),
        (
            _tf_config(
                {"learner": [], "actor": ["a:2"]}, {"type": "actor", "index": 0}
            ),
            "cluster.learner is empty",
        ),
        (
            _tf_config(
                {"learner": ["l:1", "l:2"], "actor": ["a:2"]},
                {"type": "learner", "index": 2},
            ),
            "the cluster has 2 learner addresses, so use TF_CONFIG task.index=0..1",
        ),
        (
            _tf_config(
                {"learner": "l:1", "actor": ["a:2"]}, {"type": "actor", "index": 0}
            ),
            "must be a list",
        ),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": []}, {"type": "actor", "index": 0}
            ),
            "cluster.actor is empty",
        ),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": ["a:2"]}, {"type": "worker", "index": 0}
            ),
            "task.type='worker' is not a job",
        ),
        (
            _tf_config(
                {"chief": ["l:1"], "worker": ["a:2"]}, {"type": "actor", "index": 0}
            ),
            "task.type='actor' is not a job",
        ),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": ["a:2"]}, {"type": "actor", "index": 1}
            ),
            "TF_CONFIG task.index=1 is out of range",
        ),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": ["a:2"]}, {"type": "actor", "index": "0"}
            ),
            "task.index='0' is not an integer",
        ),
        (
            _tf_config({"learner": ["l:1"], "actor": ["a:2"]}, {"type": "actor"}),
            'must be an object with "type" and "index"',
        ),
        (
            _tf_config(
                {"learner": ["l:1"], "actor": ["a:2", "a:99999"]},
                {"type": "actor", "index": 0},
            ),
            "TF_CONFIG cluster.actor[1]: port 99999",
        ),
        (
            _tf_config(
                {"chief": ["l:1"], "worker": ["a:2", "a:2"]},
                {"type": "worker", "index": 0},
            ),
            "TF_CONFIG cluster.worker[1]",
        ),
        (_tf_config({"learner": ["l:1"], "actor": ["a:2"]}), 'no "task" entry'),
    ],
)
def test_tf_config_errors(value, expected):
    with pytest.raises(ValueError) as info:
        from_tf_config(value)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


_TF2 = _tf_config(
    {"learner": ["l:8000"], "actor": ["a0:8001", "a1:8001"]},
    {"type": "actor", "index": 1},
)


def test_resolve_single_machine_and_flags():
    assert addresses.resolve_cluster("localhost:8000", "", 4, "learner", -1, "") is None
    config = addresses.resolve_cluster("localhost:8000", "", 2, "actor", 1, "")
    assert config.source == "flags" and config.address == "localhost:8002"
    with pytest.raises(ValueError, match="--actor_hosts set but --task=-1"):
        addresses.resolve_cluster("localhost:8000", "a:1", 1, "learner", -1, "")


def test_resolve_reads_environment(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _TF2)
    config = addresses.resolve_cluster("localhost:8000", "", 4, "learner", -1)
    assert config[:4] == ("l:8000", ("a0:8001", "a1:8001"), "actor", 1)


def test_resolve_precedence():
    # Flags at their defaults: TF_CONFIG wins (also over --num_actors=4).
    config = addresses.resolve_cluster("localhost:8000", "", 4, "learner", -1, _TF2)
    assert config[:4] == ("l:8000", ("a0:8001", "a1:8001"), "actor", 1)
    assert config.source == "TF_CONFIG"
    # Explicit flags that agree are fine.
    same = addresses.resolve_cluster("l:8000", "a0:8001,a1:8001", 2, "actor", 1, _TF2)
    assert same == config
    # Explicit flags that differ are an error naming both.
    with pytest.raises(ValueError, match="--learner_host='x:1' contradicts TF_CONFIG"):
        addresses.resolve_cluster("x:1", "", 4, "learner", -1, _TF2)
    with pytest.raises(ValueError, match="--actor_hosts=.* contradicts TF_CONFIG"):
        addresses.resolve_cluster("localhost:8000", "a0:8001", 1, "learner", -1, _TF2)
    with pytest.raises(ValueError, match="--job_name=actor --task=0 contradicts"):
        addresses.resolve_cluster("localhost:8000", "", 4, "actor", 0, _TF2)
    with pytest.raises(ValueError, match="--num_actors=4 but TF_CONFIG lists 2"):
        addresses.resolve_cluster(
            "localhost:8000", "", 4, "learner", -1, _TF2, explicit_flags={"num_actors"}
        )
    # explicit_flags also catches a flag explicitly set to its default value.
    with pytest.raises(ValueError, match="--learner_host=.* contradicts"):
        addresses.resolve_cluster(
            "localhost:8000",
            "",
            4,
            "learner",
            -1,
            _TF2,
            explicit_flags={"learner_host"},
        )


def test_resolve_tf_config_without_task_uses_flags():
    value = _tf_config({"chief": ["c:1"], "worker": ["w0:2", "w1:2"]})
    config = addresses.resolve_cluster("localhost:8000", "", 4, "actor", 1, value)
    assert config[:4] == ("c:1", ("w0:2", "w1:2"), "actor", 1)
    assert config.source.startswith("TF_CONFIG")
    with pytest.raises(ValueError, match='no "task" entry and --task=-1'):
        addresses.resolve_cluster("localhost:8000", "", 4, "learner", -1, value)
    with pytest.raises(ValueError, match="--task=2 is out of range"):
        addresses.resolve_cluster("localhost:8000", "", 4, "actor", 2, value)


# ---------------------------------------------------------------------------
# TensorFlow objects (in this process: no server is started here).


def test_several_learner_tasks_from_flags_and_tf_config():
    """--learner_host lists the learner tasks (the chief first): each has its
    address; actor j feeds learner j mod N; each task's sessions see only
    the tasks they need."""
    actors = "a0:8001,a1:8002,a2:8003"
    chief = addresses.cluster_from_flags("l0:8000, l1:8000", actors, 3, "learner", 0)
    assert chief.learner_hosts == ("l0:8000", "l1:8000") and chief.num_learners == 2
    assert chief.is_chief and chief.address == "l0:8000"
    second = chief._replace(task=1)
    assert not second.is_chief and second.address == "l1:8000"
    assert servers.cluster_spec(chief).as_dict() == {
        "learner": ["l0:8000", "l1:8000"],
        "actor": ["a0:8001", "a1:8002", "a2:8003"],
    }
    assert spec.device_filters(chief) == [
        "/job:learner/task:0",
        "/job:learner/task:1",
    ]
    assert spec.device_filters(second) == [
        "/job:learner/task:0",
        "/job:learner/task:1",
    ]
    actor = lambda j: chief._replace(job_name="actor", task=j)  # noqa: E731
    assert [actor(j).feeds_learner for j in range(3)] == [0, 1, 0]
    assert spec.device_filters(actor(0)) == [
        "/job:learner/task:0",
        "/job:actor/task:0",
    ]
    assert spec.device_filters(actor(1)) == [
        "/job:learner/task:0",
        "/job:learner/task:1",
        "/job:actor/task:1",
    ]
    tf_config = _tf_config(
        {"learner": ["l0:8000", "l1:8000"], "actor": actors.split(",")},
        {"type": "learner", "index": 1},
    )
    config = from_tf_config(tf_config)
    assert config.learner_hosts == ("l0:8000", "l1:8000") and config.task == 1
    # One learner: the layout and filters of a single-learner cluster.
    single = addresses.cluster_from_flags("l0:8000", actors, 3, "learner", 0)
    assert single.num_learners == 1 and single.more_learner_hosts == ()
    assert spec.device_filters(single) == ["/job:learner/task:0"]


@pytest.mark.parametrize(
    "learner, task, expected",
    [
        (
            "l0:1,l1:1",
            2,
            "--task=2 is out of range for the learner: the cluster "
            "has 2 learner addresses, so use --task=0..1",
        ),
        ("l0:1,l0:1", 0, "learner task 1 ('l0:1') duplicates learner task 0"),
        ("l0:1,,l1:1", 0, "--learner_host: empty address at position 1"),
        ("l0:1,a0:2", 0, "duplicates learner task 1"),
    ],
)
def test_several_learner_tasks_errors(learner, task, expected):
    with pytest.raises(ValueError) as info:
        addresses.cluster_from_flags(learner, "a0:2", 1, "learner", task)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_cluster_spec_and_device_filters():
    config = addresses.cluster_from_flags(
        "l:8000", "a0:8001,a1:8002,a2:8003", 3, "actor", 1
    )
    cluster_spec = servers.cluster_spec(config)
    assert cluster_spec.as_dict() == {
        "learner": ["l:8000"],
        "actor": ["a0:8001", "a1:8002", "a2:8003"],
    }
    assert spec.device_filters(config) == [
        "/job:learner/task:0",
        "/job:actor/task:1",
    ]
    proto = servers.server_config(config)
    assert list(proto.device_filters) == ["/job:learner/task:0", "/job:actor/task:1"]

    import tensorflow as tf

    base = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_filters=["/x"])
    learner = config._replace(job_name="learner", task=0)
    proto = servers.server_config(learner, base)
    assert list(proto.device_filters) == ["/job:learner/task:0"]
    assert proto.allow_soft_placement
    assert list(base.device_filters) == ["/x"]  # The base is not modified.


def test_a_tasks_server_keeps_an_inter_op_thread_to_answer_other_tasks(monkeypatch):
    """One inter-op thread per core the process may run on, plus one: a
    task's server answers other tasks' tensor requests on that pool, and a
    request must not wait for the task's own kernels to finish (two learner
    tasks pinned to a core each otherwise ran their towers in turn:
    BENCHMARKS.md, "Several learners"). An explicit setting stays."""
    import tensorflow as tf

    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    config = addresses.cluster_from_flags("l:8000", "a0:8001", 1, "learner", 0)
    cores = len(os.sched_getaffinity(0))
    proto = servers.server_config(config)
    assert proto.inter_op_parallelism_threads == cores + servers.SERVING_THREADS
    # Pinned to one core (taskset), as in the benchmark: 2 threads.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert servers.server_config(config).inter_op_parallelism_threads == 2
    base = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=7)
    assert servers.server_config(config, base).inter_op_parallelism_threads == 7
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "3")  # TensorFlow reads it
    assert servers.server_config(config).inter_op_parallelism_threads == 0


def _listening_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_start_server_port_in_use():
    sock, port = _listening_socket()
    free = ports.pick_free_ports(2)
    try:
        config = addresses.cluster_from_flags(
            f"127.0.0.1:{free[0]}",
            f"127.0.0.1:{free[1]},127.0.0.1:{port}",
            2,
            "actor",
            1,
        )
        with pytest.raises(ports.PortInUseError) as info:
            servers.start_server(config)
        assert str(info.value).startswith(
            f"port {port} for --actor_hosts task 1 is in use:"
        )
        tf_config = _tf_config(
            {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{free[0]}"]},
            {"type": "chief", "index": 0},
        )
        with pytest.raises(
            ports.PortInUseError,
            match=re.escape(f"port {port} for TF_CONFIG cluster.chief[0] is in use"),
        ):
            servers.start_server(from_tf_config(tf_config))
    finally:
        sock.close()


def test_start_server_port_taken_after_check(monkeypatch):
    # The port can be taken between the check and TensorFlow's bind: the
    # server's own failure is reported the same way.
    sock, port = _listening_socket()
    monkeypatch.setattr(servers, "port_in_use", lambda port: None)
    try:
        config = addresses.cluster_from_flags(f"127.0.0.1:{port}", "", 1, "learner", 0)
        with pytest.raises(
            ports.PortInUseError, match=f"port {port} for --learner_host"
        ):
            servers.start_server(config)
    finally:
        sock.close()


def test_pick_free_ports_and_local_hosts():
    free_ports = ports.pick_free_ports(5)
    assert len(set(free_ports)) == 5
    for port in free_ports:
        assert ports.port_in_use(port) is None
    learner, actors = ports.local_cluster_hosts(2, port_base=9100)
    assert (learner, actors) == ("localhost:9100", ("localhost:9101", "localhost:9102"))
    learner, actors = ports.local_cluster_hosts(3)
    assert len({learner, *actors}) == 4
    with pytest.raises(ValueError, match="--port_base=65535"):
        ports.local_cluster_hosts(2, port_base=65535)


def test_wait_for_port_gives_up_at_its_timeout_and_returns_once_listening():
    # Giving up is the TimeoutError itself (without a timeout it would wait
    # for ever); how long it took is not asserted.
    (port,) = ports.pick_free_ports(1)
    with pytest.raises(
        TimeoutError, match=f"learner at 127.0.0.1:{port} not reachable"
    ):
        ports.wait_for_port(f"127.0.0.1:{port}", timeout_secs=0.5, poll_secs=0.1)
    sock, port = _listening_socket()
    try:
        ports.wait_for_port(f"127.0.0.1:{port}", timeout_secs=5)
    finally:
        sock.close()


def test_session_creator_bounded_wait_without_learner():
    import tensorflow as tf

    (port,) = ports.pick_free_ports(1)
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("v", initializer=1.0, use_resource=True)
        creator = servers.FastWorkerSessionCreator(
            "grpc://unused:1", f"127.0.0.1:{port}", poll_secs=0.1, max_wait_secs=1.0
        )
        assert isinstance(creator, tf.compat.v1.train.SessionCreator)
        # Bounded: a TimeoutError naming the learner, where TensorFlow's own
        # session creator would wait for ever.
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
            creator.create_session()


# TensorFlow's session manager waits 30 s between checks of a worker's
# readiness; an actor that connects in less than this did not wait for it.
FAST_CONNECT_BOUND_S = 25

# ---------------------------------------------------------------------------
# A real cluster: a learner and two actors on loopback, one process each.

_TASK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    from absl import logging
    logging.set_verbosity(logging.INFO)
    import tensorflow as tf
    from cluster import addresses, hosts, ports, spec
    from cluster import servers

    def event(name):
        print(f'EVENT {name} {time.time():.3f}', flush=True)

    job, task, learner_host, actor_hosts, gate = sys.argv[1:6]
    task = int(task)
    # Imports overlap; the test opens the gate to order the start-ups.
    event('imported')
    while gate and not os.path.exists(gate):
        time.sleep(0.02)
    config = addresses.cluster_from_flags(
        learner_host, actor_hosts, len(actor_hosts.split(',')), job, task)
    server = servers.start_server(config)
    session_config = servers.server_config(config)
    timeout = tf.compat.v1.RunOptions(timeout_in_ms=60000)
    with tf.Graph().as_default():
        with tf.device(spec.learner_task_device()):
            shared = tf.compat.v1.get_variable(
                'shared', initializer=tf.constant(42, tf.int64), use_resource=True)
            queue = tf.queue.FIFOQueue(
                10, [tf.int64, tf.int64], shapes=[[], []], shared_name='queue')
        if config.is_learner:
            dequeue = queue.dequeue_many(config.num_actors)
            creator = tf.compat.v1.train.ChiefSessionCreator(
                master=server.target, config=session_config)
            with tf.compat.v1.train.MonitoredSession(session_creator=creator) as sess:
                event('initialised')
                tasks, values = sess.run(dequeue, options=timeout)
                print('DEQUEUED', sorted(zip(tasks.tolist(), values.tolist())),
                      flush=True)
                sys.stdin.read()  # Serve until the test has seen the actors exit.
        else:
            with tf.device(config.device):
                local = tf.compat.v1.get_local_variable(
                    'local', initializer=tf.constant(100 * (task + 1), tf.int64),
                    use_resource=True)
            enqueue = queue.enqueue([tf.constant(task, tf.int64), shared + local])
            creator = servers.worker_session_creator(
                config, server, poll_secs=0.2, log_every_secs=1.0, max_wait_secs=60)
            event('create_session')
            with tf.compat.v1.train.MonitoredSession(session_creator=creator) as sess:
                event('connected')
                sess.run(enqueue, options=timeout)
                event('enqueued')
""")


class _Proc:
    """A task subprocess with output in files (no pipe can fill up)."""

    def __init__(self, tmp_path, name, args, stdin=None):
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TF_CONFIG", None)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, str(tmp_path / "task.py"), *args],
                stdin=stdin,
                stdout=out,
                stderr=err,
                env=env,
                cwd=REPO_ROOT,
            )

    def text(self):
        return self.out_path.read_text() + self.err_path.read_text()

    def event(self, name, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out_path.read_text().splitlines():
                if line.startswith(f"EVENT {name} "):
                    return float(line.split()[2])
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no EVENT {name} within {timeout} s:\n{self.text()}")


@pytest.mark.slow
def test_actors_connect_fast_before_and_after_learner(tmp_path):
    (tmp_path / "task.py").write_text(_TASK_SCRIPT)
    free_ports = ports.pick_free_ports(3)
    learner_host = f"127.0.0.1:{free_ports[0]}"
    actor_hosts = f"127.0.0.1:{free_ports[1]},127.0.0.1:{free_ports[2]}"
    learner_gate, actor1_gate = tmp_path / "learner.go", tmp_path / "actor1.go"
    procs = []
    try:
        # All three import TensorFlow at once; gates order what follows.
        actor0 = _Proc(
            tmp_path, "actor0", ["actor", "0", learner_host, actor_hosts, ""]
        )
        learner = _Proc(
            tmp_path,
            "learner",
            ["learner", "0", learner_host, actor_hosts, str(learner_gate)],
            stdin=subprocess.PIPE,
        )
        actor1 = _Proc(
            tmp_path,
            "actor1",
            ["actor", "1", learner_host, actor_hosts, str(actor1_gate)],
        )
        procs = [actor0, learner, actor1]
        # Actor 0 starts first and waits for a learner that is not there yet.
        actor0.event("create_session", timeout=90)
        learner.event("imported", timeout=90)
        # Actor 0 has polled for the learner (and said so) before it starts.
        deadline = time.monotonic() + 90
        while f"waiting for learner at {learner_host}" not in actor0.text():
            assert time.monotonic() < deadline, actor0.text()
            time.sleep(0.05)
        learner_gate.touch()
        initialised = learner.event("initialised", timeout=60)
        # Actor 1 starts after the learner has initialised the variables.
        actor1.event("imported", timeout=90)
        actor1_gate.touch()

        connected0 = actor0.event("connected", timeout=30)
        # By its own polling, not TensorFlow's session manager, which checks
        # a worker's readiness again only every 30 s: a bound with that
        # margin, not a speed (a quiet machine takes under a second).
        assert connected0 - initialised < FAST_CONNECT_BOUND_S, actor0.text()
        assert f"waiting for learner at {learner_host}" in actor0.text()
        create1 = actor1.event("create_session", timeout=60)
        connected1 = actor1.event("connected", timeout=30)
        assert connected1 - create1 < FAST_CONNECT_BOUND_S, actor1.text()
        for actor in (actor0, actor1):
            assert actor.process.wait(timeout=30) == 0, actor.text()

        # The queue on /job:learner/task:0 got both actors' items, each read
        # from the learner's variable (42) plus the actor's local one.
        deadline = time.monotonic() + 30
        while "DEQUEUED" not in learner.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "DEQUEUED [(0, 142), (1, 242)]" in learner.text(), learner.text()
        learner.process.stdin.close()
        assert learner.process.wait(timeout=30) == 0, learner.text()
    finally:
        for proc in procs:
            if proc.process.poll() is None:
                proc.process.kill()
                proc.process.wait(timeout=10)


# ---------------------------------------------------------------------------
# launch.py with a fake program.

_FAKE_PROGRAM = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    print('ARGV', ' '.join(sys.argv[1:]), flush=True)
    args = dict(a[2:].split('=', 1) for a in sys.argv[1:]
                if a.startswith('--') and '=' in a)
    name = f"{args['job_name']}_{args['task']}"
    logdir = args['logdir']
    stubborn = name in args.get('fake_stubborn', '').split(',')
    if stubborn:  # Needs SIGKILL (so does its child, which inherits SIG_IGN).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A grandchild, like an environment process: the launcher must stop it too.
    child = subprocess.Popen(['sleep', '600'])
    os.makedirs(os.path.join(logdir, 'pids'), exist_ok=True)
    with open(os.path.join(logdir, 'pids', name + '.tmp'), 'w') as f:
        f.write(f'{os.getpid()} {child.pid}')
    os.rename(os.path.join(logdir, 'pids', name + '.tmp'),
              os.path.join(logdir, 'pids', name))
    done = os.path.join(logdir, 'learner_done')
    if name == 'learner_0' and 'fake_exit_code' in args:
        deadline = time.time() + 30
        while (len(os.listdir(os.path.join(logdir, 'pids'))) <= int(args['num_actors'])
               and time.time() < deadline):
            time.sleep(0.05)
        open(done, 'w').close()
        print('learner exiting', flush=True)
        sys.exit(int(args['fake_exit_code']))
    while True:
        if name != 'learner_0' and os.path.exists(done) and not stubborn:
            print(args['job_name'] + ' exiting by itself', flush=True)
            sys.exit(0)  # Leaves its grandchild behind, on purpose.
        time.sleep(0.05)
""")


def _launch(tmp_path, *args):
    program = tmp_path / "fake_program.py"
    program.write_text(_FAKE_PROGRAM)
    logdir = tmp_path / "logdir"
    cmd = [
        sys.executable,
        os.path.join(REPO_ROOT, "launch.py"),
        f"--program={program}",
        f"--logdir={logdir}",
        *args,
    ]
    out = open(tmp_path / "launch.out", "wb")
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    process = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
    )
    out.close()
    return process, logdir


def _pids(logdir):
    pids = []
    for name in os.listdir(logdir / "pids"):
        if not name.endswith(".tmp"):
            pids.extend(int(p) for p in (logdir / "pids" / name).read_text().split())
    return pids


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # Zombie = dead.
    except (OSError, IndexError):
        return False


def _wait_dead(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_launch_logs_forwarding_and_exit_code(tmp_path):
    process, logdir = _launch(
        tmp_path,
        "--num_actors=2",
        "--actor_exit_secs=1",
        "--kill_grace_secs=1",
        "--fake_exit_code=3",
        "--fake_stubborn=actor_1",
        "--other_flag",
        "value",
    )
    try:
        assert process.wait(timeout=60) == 3, (tmp_path / "launch.out").read_text()
    finally:
        if process.poll() is None:
            process.kill()
    pids = _pids(logdir)
    try:
        assert len(pids) == 6  # 3 tasks and their grandchildren.
        assert _wait_dead(pids, timeout=5) == []
    finally:
        _kill_all(pids)
    launch_out = (tmp_path / "launch.out").read_text()
    assert str(logdir / "logs") in launch_out
    assert "learner_0 exited with code 3" in launch_out
    logs = {p.name: p.read_text() for p in (logdir / "logs").iterdir()}
    assert sorted(logs) == ["actor_0.log", "actor_1.log", "learner_0.log"]
    for name, text in logs.items():
        job, task = name[:-4].split("_")
        argv = next(line for line in text.splitlines() if line.startswith("ARGV "))
        # Per-task and cluster flags first, then the rest verbatim, in order.
        assert argv.startswith(
            f"ARGV --job_name={job} --task={task} --learner_host=localhost:"
        )
        assert f"--num_actors=2 --num_learners=1 --logdir={logdir}" in argv
        assert argv.endswith(
            "--fake_exit_code=3 --fake_stubborn=actor_1 --other_flag value"
        )
        assert "--actor_exit_secs" not in argv and "--program" not in argv
    assert "actor exiting by itself" in logs["actor_0.log"]
    assert "learner exiting" in logs["learner_0.log"]


@pytest.mark.slow
def test_launch_starts_every_learner_task_with_its_address(tmp_path):
    """--num_learners=2: learner tasks 0 and 1 on port_base and port_base+1,
    the actors after them; every task gets both learner addresses and
    --num_learners; the other tasks exit by themselves once the chief has,
    and launch.py exits with the chief's code."""
    port_base = ports.pick_free_ports(1)[0]
    while any(ports.port_in_use(port_base + i) for i in range(4)):
        port_base = ports.pick_free_ports(1)[0]
    process, logdir = _launch(
        tmp_path,
        "--num_learners=2",
        "--num_actors=2",
        f"--port_base={port_base}",
        "--actor_exit_secs=20",
        "--kill_grace_secs=1",
        "--fake_exit_code=0",
    )
    try:
        assert process.wait(timeout=60) == 0, (tmp_path / "launch.out").read_text()
    finally:
        if process.poll() is None:
            process.kill()
    _kill_all(_pids(logdir))
    launch_out = (tmp_path / "launch.out").read_text()
    for name in ("learner_1", "actor_0", "actor_1"):
        assert f"{name} exited with code 0" in launch_out, launch_out
    assert "still running" not in launch_out, launch_out
    logs = {p.name: p.read_text() for p in (logdir / "logs").iterdir()}
    assert sorted(logs) == [
        "actor_0.log",
        "actor_1.log",
        "learner_0.log",
        "learner_1.log",
    ]
    learners = f"localhost:{port_base},localhost:{port_base + 1}"
    actors = f"localhost:{port_base + 2},localhost:{port_base + 3}"
    for name, text in logs.items():
        job, task = name[:-4].split("_")
        argv = next(line for line in text.splitlines() if line.startswith("ARGV "))
        assert argv.startswith(
            f"ARGV --job_name={job} --task={task} --learner_host={learners} "
            f"--actor_hosts={actors} --num_actors=2 --num_learners=2 "
        ), argv
    assert "learner exiting by itself" in logs["learner_1.log"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--num_learners=0"], "--num_learners=0: launch at least one learner"),
        (
            ["--num_learners=2", "--learner_host=localhost:1"],
            "--learner_host lists 1 address(es) but --num_learners=2",
        ),
    ],
)
def test_launch_refuses_bad_learner_counts(tmp_path, args, expected):
    process, logdir = _launch(tmp_path, "--num_actors=2", *args)
    assert process.wait(timeout=60) == 2
    out = (tmp_path / "launch.out").read_text()
    assert f"launch.py: error: {expected}" in out, out
    assert not os.path.exists(logdir / "logs")


@pytest.mark.slow
def test_launch_ctrl_c_leaves_no_child(tmp_path):
    process, logdir = _launch(
        tmp_path, "--num_actors=2", "--kill_grace_secs=1", "--fake_stubborn=actor_0"
    )
    pids = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (logdir / "pids").is_dir() and len(_pids(logdir)) == 6:
                break
            assert process.poll() is None, (tmp_path / "launch.out").read_text()
            time.sleep(0.05)
        pids = _pids(logdir)
        assert len(pids) == 6
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 128 + signal.SIGINT
        assert _wait_dead(pids, timeout=5) == []
    finally:
        if process.poll() is None:
            process.kill()
        _kill_all(pids)
    out = (tmp_path / "launch.out").read_text()
    assert "got SIGINT; stopping all tasks" in out
    assert "actor_0 still running; sending SIGKILL" in out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--task=1"], "--task=1: launch.py sets --job_name and --task"),
        (["--job_name", "actor"], "--job_name: launch.py sets"),
        (["--learner_host=bad_host:1"], "--learner_host: invalid host name 'bad_host'"),
        (["--num_actors=0"], "--num_actors=0"),
        (["--num_actors=x"], "--num_actors=x: invalid literal"),
        (["--program=/nonexistent.py"], "--program='/nonexistent.py' does not exist"),
    ],
)
def test_launch_usage_errors(tmp_path, args, expected):
    process, logdir = _launch(tmp_path, *args)
    try:
        assert process.wait(timeout=30) == 2
    finally:
        if process.poll() is None:
            process.kill()
    out = (tmp_path / "launch.out").read_text()
    assert expected in out
    assert out.count("\n") == 1  # One line.
    assert not (logdir / "logs").exists()  # Nothing started.


def test_launch_port_in_use(tmp_path):
    sock, port = _listening_socket()
    try:
        process, _ = _launch(tmp_path, "--num_actors=1", f"--port_base={port}")
        assert process.wait(timeout=30) == 2
    finally:
        sock.close()
    out = (tmp_path / "launch.out").read_text()
    assert f"port {port} for learner task 0 (localhost:{port}) is in use" in out


def test_split_argv():
    import launch

    own, forwarded = launch.split_argv(
        [
            "launch.py",
            "--num_actors",
            "3",
            "--level_name=x",
            "--logdir=/l",
            "-port_base=5",
            "--nofoo",
            "--batch_size",
            "4",
            "--",
            "--num_actors=9",
        ]
    )
    assert own == ["launch.py", "--num_actors", "3", "--logdir=/l", "-port_base=5"]
    assert forwarded == [
        "--level_name=x",
        "--nofoo",
        "--batch_size",
        "4",
        "--",
        "--num_actors=9",
    ]


def test_a_task_whose_learner_list_differs_from_the_chiefs_is_refused():
    """An actor (or a learner task serving a tower) compares the number of
    learner tasks the chief runs (read from the chief when it connects) with
    its own --learner_host list: with another number its unrolls would go to
    a queue no tower reads, so it stops with a flag error instead."""
    from cluster.state import learner_tasks_problem

    one = spec.ClusterConfig("localhost:1", ("localhost:3",), "actor", 0)
    two = one._replace(more_learner_hosts=("localhost:2",))
    assert learner_tasks_problem(1, one) is None
    assert learner_tasks_problem(2, two) is None
    assert learner_tasks_problem(2, one) == (
        "--learner_host lists 1 learner task(s) but the chief at localhost:1 "
        "runs 2; start every task with the chief's --learner_host list and "
        "--num_learners=2."
    )
    assert "runs 1" in learner_tasks_problem(1, two)


# -- the settings every task must share -------------------------------------------


def test_a_task_whose_settings_differ_from_the_chiefs_gets_a_line_each():
    from run_helpers import small_config

    from actor.unroll import actor_output_specs
    from cluster.state import agreeing_settings, settings_problems

    def settings(**changes):
        config = small_config()
        config = dataclasses.replace(
            config,
            agent=dataclasses.replace(config.agent, **changes.pop("agent", {})),
            learner=dataclasses.replace(config.learner, **changes),
        )
        specs = actor_output_specs(
            config.environment, config.agent, config.learner.unroll_length
        )
        return agreeing_settings(config, specs.env_outputs.observation)

    chief = settings()
    assert settings_problems(chief, chief.encode(), "h:1") == []
    # A chief of a version before the check has none: nothing to compare.
    assert settings_problems(chief, b"", "h:1") == []
    mine = settings(unroll_length=10, agent={"torso": "deep"})
    problems = settings_problems(mine, chief.encode(), "learner:8000")
    assert problems == [
        "--agent=deep: the chief at learner:8000 runs shallow; start every task "
        "of the cluster with the same settings (the chief's logdir has them as "
        "run_flags.cfg).",
        "--unroll_length=10: the chief at learner:8000 runs 20; start every task "
        "of the cluster with the same settings (the chief's logdir has them as "
        "run_flags.cfg).",
    ]
    # The off-policy correction and replay agree too.
    mine = settings(off_policy_correction="one_step_is", replay_proportion=0.5)
    problems = settings_problems(mine, chief.encode(), "h:1")
    assert [p.split(":")[0] for p in problems] == [
        "--off_policy_correction=one_step_is",
        "--replay_proportion=0.5",
    ]
    # What no flag of its own sets is named by what it comes from.
    other = json.loads(chief)
    other["observations"] = [[84, 84, 4], []]  # stacked in the environment
    (line,) = settings_problems(chief, json.dumps(other), "h:1")
    assert line.startswith("the observation shapes (the family's flags) [[")
    assert "runs [[84, 84, 4], []]" in line
    # A task that stacks other frames than the chief's is refused.
    mine = settings(agent={"frame_stack": 2})
    (line,) = settings_problems(mine, chief.encode(), "h:1")
    assert line.startswith("--frame_stack=2: the chief at h:1 runs 4;"), line
