"""Frames learnt/s: one learner task on one core against two learner tasks on
a core each, over TensorFlow's gRPC runtime, queues filled by a synthetic
feeder; the time and the bytes a remote tower costs per update.

    python3 benchmarks/throughput/learner_tasks_bench.py                   # netns (root)
    python3 benchmarks/throughput/learner_tasks_bench.py --network loopback
    python3 benchmarks/throughput/learner_tasks_bench.py --agents shallow --seconds 10
    python3 benchmarks/throughput/learner_tasks_bench.py --straggler --agents shallow
    python3 benchmarks/throughput/learner_tasks_bench.py --plot RECORD.json[,RECORD.json]

Each learner task is its own process (`tf.distribute.Server` of the job
"learner"), pinned to one core with `taskset`, and on its own host of a
virtual network (tests/virtual_network.py: a network namespace each, joined
by a bridge; root only) or, with --network loopback, on 127.0.0.1. Learner
task 0 builds the graph training builds (`pipeline.build_learner_pipeline`:
a queue and a tower per learner task, each tower's queue, staging, unroll,
V-trace, loss and gradients on its task, the variables on task 0, one RMSProp
update from the summed gradients) and runs it. Instead of actors, a feeder
op on each learner task enqueues `--batch_size` random-but-valid unrolls
(learner_bench.random_unrolls) held in that task's memory: the queues never
starve and no unroll crosses the network, so what crosses it is what
several learners add: the parameters each remote tower reads and the
gradients it sends back.

Configurations, each agent (`--batch_size` per tower, unroll 20; with
--split_batch, --batch_size split over the towers):

  1 task, 1 core    one learner, pinned to core 0 (the unit that scales)
  2 tasks, 1 core each   learner tasks 0 and 1 pinned to cores 0 and 1, a
                    tower each: twice the frames per update (ideal 2x)
  1 task, 2 cores   one learner on both cores (unpinned): what a single
                    learner makes of the same two cores

Per configuration: updates/s and ms per update over `--seconds` after
warm-up steps, frames learnt/s (updates/s x towers x batch x unroll x 4
action repeats), the cores each task used, and the bytes through the
interface of each task other than 0 per update (netns: its veth counters;
loopback: the machine's `lo` counters, everything on loopback) against the
parameters' size. Prints a Markdown table; `--json` writes the record.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))
from benchmarks.core import common  # noqa: E402
from benchmarks.throughput.learner_tasks_report import (  # noqa: E402
    CONFIGURATIONS,
    NUM_ACTION_REPEATS,
    plot,
    project,
    projection_table,
    table,
)

WARMUP_STEPS = 2
PORT = 2222  # each host's learner port on the virtual network
# --straggler: learner task 1 shares core 1 with a busy loop (about half a
# core: a slow machine, or one with another job), against the same two tasks
# unslowed, and one task alone on a core it shares with a busy loop (the
# slow tower's own pace). A synchronous update waits for its slowest tower.
STRAGGLER_CONFIGURATIONS = [
    ("1 task, 1 core", 1, [[0]]),
    ("2 tasks, 1 core each", 2, [[0], [1]]),
    ("2 tasks, task 1 on a shared core", 2, [[0], [1]]),
    ("1 task on a shared core", 1, [[1]]),
]
# Busy loops beside the learner tasks: configuration -> cores.
BUSY_CORES = {
    "2 tasks, task 1 on a shared core": [1],
    "1 task on a shared core": [1],
}


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _wait_for(path: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while not os.path.exists(path):
        if process.poll() is not None:
            raise RuntimeError(f"learner task 0 exited {process.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"no {os.path.basename(path)} in {timeout_s:.0f} s")
        time.sleep(0.005)


def _lo_bytes() -> int:
    """Bytes received through the machine's loopback interface."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    raise RuntimeError("no lo in /proc/net/dev")


def _configs(agent_name: str, batch_size: int, unroll: int, num_learners: int):
    """(agent config, learner config, specs, num_actions), as training makes
    them (outside any graph: the specs come from a scratch agent)."""
    import environments
    from actor.unroll import actor_output_specs
    from benchmarks.throughput.learner_bench import LEVEL
    from config import AgentConfig, EnvironmentConfig, LearnerConfig

    num_actions = environments.num_actions((LEVEL,))
    environment = EnvironmentConfig(LEVEL, (LEVEL,), num_actions)
    agent_config = AgentConfig(
        agent_name,
        num_actions,
        use_instruction=False,
        **environments.frame_stack_settings((LEVEL,)),
    )
    config = LearnerConfig(
        batch_size=batch_size,
        unroll_length=unroll,
        num_action_repeats=NUM_ACTION_REPEATS,
        total_environment_frames=int(1e12),
        num_learners=num_learners,
    )
    specs = actor_output_specs(environment, agent_config, unroll)
    return agent_config, config, specs, num_actions


def _build(agent_config, config, specs, num_actions: int):
    """The learner graph of a cluster with config.num_learners learner tasks
    and a feeder op per task; returns (train, stage_op, feed_ops, init_feed,
    parameter_bytes)."""
    import numpy as np
    import tensorflow as tf

    from agent import create_agent
    from benchmarks.throughput.learner_bench import random_unrolls
    from cluster.spec import learner_task_device
    from learner import pipeline
    from runtime import sessions

    batch_size, num_learners = config.batch_size, config.num_learners
    flat_specs = tf.nest.flatten(specs)
    data = random_unrolls(specs, num_actions, batch_size, np.random.RandomState(0))
    init_feed, feed_ops, queues = {}, [], []
    for k in range(num_learners):
        # The feeder's unrolls live on learner task k (outside the scope that
        # puts the agent's variables on task 0), so none crosses the network.
        with tf.device(f"{learner_task_device(k)}/cpu:0"):
            # Room for two batches, so the feeder keeps ahead.
            queue = pipeline.create_queue(specs, 2 * batch_size, learner=k)
            held = []
            for spec, value in zip(flat_specs, data, strict=True):
                if spec.dtype == tf.string:
                    held.append(tf.constant(value))
                    continue
                placeholder = tf.compat.v1.placeholder(spec.dtype, value.shape)
                init_feed[placeholder] = value
                held.append(
                    tf.compat.v1.Variable(
                        placeholder,
                        trainable=False,
                        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                        use_resource=True,
                    ).read_value()
                )
            feed_ops.append(queue.enqueue_many(held))
            queues.append(queue)
    # As the chief of a cluster builds it (cluster/learner_task.py).
    with (
        tf.device(learner_task_device()),
        sessions.variables_on(f"{learner_task_device()}/cpu:0"),
    ):
        agent = create_agent(agent_config)
        devices = [learner_task_device(k) for k in range(num_learners)]
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, queues, specs, config, devices
        )
    parameter_bytes = sum(
        v.shape.num_elements() * v.dtype.size for v in agent.trainable_variables
    )
    return (
        learner_pipeline.learner.train_and_count,
        learner_pipeline.stage_op,
        feed_ops,
        init_feed,
        parameter_bytes,
    )


def run_chief(args) -> None:
    """Learner task 0: builds and runs the graph, writes the result to
    args.result."""
    import threading

    import tensorflow as tf

    from cluster import servers
    from runtime import tf_logging

    tf_logging.quiet_tensorflow_logging()
    hosts = args.hosts.split(",")
    num_learners = len(hosts)
    cluster = tf.train.ClusterSpec({"learner": hosts})
    # As a cluster task configures its server (cluster/servers.py).
    proto = servers.with_serving_threads(
        tf.compat.v1.ConfigProto(device_filters=["/job:learner"])
    )
    server = tf.distribute.Server(
        cluster, job_name="learner", task_index=0, config=proto
    )
    configs = _configs(args.agent, args.batch_size, args.unroll_length, num_learners)
    with tf.Graph().as_default():
        train, stage, feed_ops, init_feed, parameter_bytes = _build(*configs)
        init = [
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
        ]
        with tf.compat.v1.Session(server.target, config=proto) as session:
            session.run(init, init_feed)
            stop = threading.Event()

            def feed(op):
                while not stop.is_set():
                    try:
                        session.run(op)
                    except tf.errors.CancelledError:
                        return

            feeders = [
                threading.Thread(target=feed, args=(op,), daemon=True)
                for op in feed_ops
            ]
            for t in feeders:
                t.start()
            session.run(stage)
            for _ in range(WARMUP_STEPS):
                session.run([train, stage])
            # The driver reads the byte counters, then says go.
            _touch(args.result + ".ready")
            while not os.path.exists(args.result + ".go"):
                time.sleep(0.005)
            steps, t0, c0 = 0, time.perf_counter(), sum(os.times()[:2])
            while time.perf_counter() - t0 < args.seconds or steps < 3:
                session.run([train, stage])
                steps += 1
            wall = time.perf_counter() - t0
            cpu = sum(os.times()[:2]) - c0
            _touch(args.result + ".done")
            if args.trace:
                # One more update, traced: each op's device, start and end.
                from tensorflow.python.client import timeline

                metadata = tf.compat.v1.RunMetadata()
                session.run(
                    [train, stage],
                    options=tf.compat.v1.RunOptions(
                        trace_level=tf.compat.v1.RunOptions.FULL_TRACE
                    ),
                    run_metadata=metadata,
                )
                with open(args.trace, "w") as f:
                    f.write(
                        timeline.Timeline(
                            metadata.step_stats
                        ).generate_chrome_trace_format()
                    )
            stop.set()
            with open(args.result, "w") as f:
                json.dump(
                    {
                        "steps": steps,
                        "seconds": wall,
                        "chief_cpu_seconds": cpu,
                        "parameter_bytes": parameter_bytes,
                    },
                    f,
                )
    # The feeders may block on full queues, and a server cannot stop.
    os._exit(0)


def run_server(args) -> None:
    """A learner task other than 0: its server runs what task 0's graph puts
    there (its queue, feeder and tower) until the driver ends it."""
    import tensorflow as tf

    from cluster import servers

    cluster = tf.train.ClusterSpec({"learner": args.hosts.split(",")})
    proto = servers.with_serving_threads(tf.compat.v1.ConfigProto())
    server = tf.distribute.Server(
        cluster, job_name="learner", task_index=args.task, config=proto
    )
    server.join()


def measure(
    name: str,
    agent_name: str,
    pinning: list,
    network,
    batch_size: int,
    unroll: int,
    seconds: float,
) -> dict:
    """One configuration: the learner tasks started (pinned, on their hosts),
    task 0's timed window, the counters around it."""
    num_learners = len(pinning)
    if network is not None:
        hosts = [f"{network.addresses[k]}:{PORT}" for k in range(num_learners)]
    else:
        from cluster.ports import pick_free_ports

        hosts = [f"127.0.0.1:{port}" for port in pick_free_ports(num_learners)]
    workdir = tempfile.mkdtemp(prefix="learner_tasks_bench_")
    result = os.path.join(workdir, "result.json")
    common_args = [
        f"--hosts={','.join(hosts)}",
        f"--agent={agent_name}",
        f"--batch_size={batch_size}",
        f"--unroll_length={unroll}",
        f"--seconds={seconds}",
        f"--result={result}",
    ]
    processes = []
    busy = [
        subprocess.Popen(
            ["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"]
        )
        for core in BUSY_CORES.get(name, [])
    ]
    try:
        for k in reversed(range(num_learners)):
            argv = [sys.executable, os.path.abspath(__file__), f"--task={k}"]
            argv += common_args
            if pinning[k] is not None:
                argv = ["taskset", "-c", ",".join(map(str, pinning[k])), *argv]
            log = open(os.path.join(workdir, f"task{k}.log"), "w")
            if network is not None:
                process = network.popen(k, argv, stdout=log, stderr=subprocess.STDOUT)
            else:
                process = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            processes.insert(0, process)
        chief = processes[0]
        load_start = common.loadavg()
        _wait_for(result + ".ready", chief, 600)

        def snapshot():
            if network is not None:
                moved = [sum(network.counters(k)) for k in range(1, num_learners)]
            else:
                moved = [_lo_bytes()] if num_learners > 1 else []
            cpu = [common.cpu_seconds(f"/proc/{p.pid}/stat") for p in processes[1:]]
            return moved, cpu

        bytes_0, cpu_0 = snapshot()
        _touch(result + ".go")
        _wait_for(result + ".done", chief, 60 + 20 * seconds)
        bytes_1, cpu_1 = snapshot()
        if chief.wait(timeout=120) != 0:
            raise RuntimeError(f"learner task 0 exited {chief.returncode}")
        with open(result) as f:
            r = json.load(f)
    finally:
        for process in processes + busy:
            if process.poll() is None:
                process.kill()
                process.wait()
    steps, wall = r["steps"], r["seconds"]
    frames = steps * num_learners * batch_size * unroll * NUM_ACTION_REPEATS
    return {
        "configuration": name,
        "agent": agent_name,
        "num_learners": num_learners,
        "pinning": pinning,
        "busy_cores": BUSY_CORES.get(name, []),
        "network": "netns" if network is not None else "loopback",
        "batch_size_per_tower": batch_size,
        "unroll_length": unroll,
        "steps": steps,
        "seconds": wall,
        "ms_per_update": 1000 * wall / steps,
        "frames_per_s": frames / wall,
        "cores_per_task": [
            r["chief_cpu_seconds"] / wall,
            *[(c1 - c0) / wall for c0, c1 in zip(cpu_0, cpu_1, strict=True)],
        ],
        # Through each task but 0's interface (netns), or everything on
        # loopback (counted once: lo's received bytes).
        "bytes_per_update": [
            (b1 - b0) / steps for b0, b1 in zip(bytes_0, bytes_1, strict=True)
        ],
        "parameter_bytes": r["parameter_bytes"],
        "load_start": load_start,
        "load_end": common.loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", default="shallow,deep")
    parser.add_argument("--batch_size", type=int, default=32, help="per tower")
    parser.add_argument(
        "--split_batch",
        action="store_true",
        help="split --batch_size over the towers instead: every configuration "
        "learns the same frames per update (the cost of synchronising alone)",
    )
    parser.add_argument("--unroll_length", type=int, default=20)
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="timed seconds per configuration (at least 3 updates)",
    )
    parser.add_argument("--network", choices=["netns", "loopback"], default="netns")
    parser.add_argument(
        "--straggler",
        action="store_true",
        help="what a slow learner task costs: task 1 on a core shared with a "
        "busy loop, against both unslowed and against a slowed task alone",
    )
    parser.add_argument(
        "--plot",
        default=None,
        help="comma-separated records (--json files) to plot into "
        "benchmarks/plots/learner_tasks.png instead of measuring",
    )
    parser.add_argument(
        "--link_gbit",
        type=float,
        default=10.0,
        help="the chief's network link in the projection (Gb/s)",
    )
    common.add_json_argument(parser)
    # A learner task's own process (started by the driver).
    parser.add_argument("--task", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hosts", help=argparse.SUPPRESS)
    parser.add_argument("--agent", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument(
        "--trace",
        default=None,
        help="with one configuration's task 0 only: a Chrome trace of one update",
    )
    args = parser.parse_args()
    if args.plot:
        plot(args.plot.split(","))
        return
    if args.task is not None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        sys.path.insert(0, REPO)
        run_chief(args) if args.task == 0 else run_server(args)
        return

    import virtual_network

    network = None
    if args.network == "netns":
        if (why := virtual_network.available()) is not None:
            raise SystemExit(f"--network=netns {why}; or pass --network=loopback")
        network = virtual_network.VirtualNetwork(2).__enter__()
    print(common.machine_line(), flush=True)
    started = time.time()
    results = []
    try:
        configurations = STRAGGLER_CONFIGURATIONS if args.straggler else CONFIGURATIONS
        for agent_name in args.agents.split(","):
            for name, _, pinning in configurations:
                num_tasks = len(pinning)
                if args.split_batch and args.batch_size % num_tasks:
                    raise SystemExit(
                        f"--split_batch: {args.batch_size} unrolls do not split over {num_tasks} towers"
                    )
                r = measure(
                    name,
                    agent_name,
                    pinning,
                    network,
                    args.batch_size // num_tasks
                    if args.split_batch
                    else args.batch_size,
                    args.unroll_length,
                    args.seconds,
                )
                results.append(r)
                print(
                    f"{agent_name:>7} {name:<22} {r['ms_per_update']:7.0f} ms/update "
                    f"{r['frames_per_s']:8.0f} frames/s  cores "
                    f"{'/'.join(f'{c:.2f}' for c in r['cores_per_task'])}  bytes/update "
                    f"{'/'.join(f'{b / 1e6:.1f} MB' for b in r['bytes_per_update'])}"
                    f"  load {r['load_start']:.1f}-{r['load_end']:.1f}",
                    flush=True,
                )
    finally:
        if network is not None:
            network.close()
    print()
    print(table(results))
    # The projection scales a tower of the same batch.
    projection = (
        []
        if args.split_batch or args.straggler
        else project(results, link_gbit=args.link_gbit)
    )
    if projection:
        print()
        print(f"Projected (a core a learner task, a {args.link_gbit:g} Gb/s link):")
        print(projection_table(projection))
    duration = time.time() - started
    print(f"\n{duration:.0f} s")
    common.write_json(
        args.json,
        {
            "duration_s": duration,
            "network": args.network,
            "split_batch": args.split_batch,
            "straggler": args.straggler,
            "results": results,
            "projection": projection,
        },
    )


if __name__ == "__main__":
    main()
