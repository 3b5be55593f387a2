"""The learner alone: steps/s and frames/s it can consume, no actors.

Builds the learner in-process from config objects, exactly as training does
(`pipeline.build_learner_pipeline`: dequeue_many `batch_size` unrolls,
make them time-major, stage them, V-trace loss, one RMSProp update), and feeds it
random-but-valid unrolls (uint8 frames, sparse `done`, actions in range,
finite logits/rewards) from a queue that is pre-filled before each timed
stretch, so no actor or environment competes for the CPU. A second mode,
"fixed batch", runs `learner.build_learner` on one batch held in local
variables (no queue, no stacking, no staging): the network's forward and
backward pass and the update alone.

For each agent (deep, shallow) and batch size (8, 32) at unroll 20: learner
steps/s, the environment frames/s that rate consumes (batch x unroll x 4
action repeats per step), ms per step and the cores the process used (CPU
time / wall time), with the 1-minute load average. The session uses
sessions.session_config(single_machine_training=True), as training does.

    python3 benchmarks/throughput/learner_bench.py                 # ~2-4 min on 2 cores
    python3 benchmarks/throughput/learner_bench.py --seconds 5 --agents shallow
    python3 benchmarks/throughput/learner_bench.py --modes fixed --num_learners 1,2 \
        --json benchmarks/results/learner_towers.json

With --num_learners N > 1 (fixed-batch mode) the same batch is split over N
towers on N logical CPU devices of the process (build_learner's towers, one
update from their summed gradients): what synchronising the towers costs
against one learner on the whole batch, on the same cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LEVEL = "atari/pong"
UNIQUE_UNROLLS = 8  # distinct random unrolls, enqueued round-robin
NUM_ACTION_REPEATS = 4  # experiment.py's default


def random_unrolls(specs, num_actions: int, count: int, rng):
    """`count` random-but-valid unrolls: flat list of [count, ...] arrays."""
    import numpy as np
    import tensorflow as tf

    flat = []
    import tree  # dm-tree (a Sonnet dependency): paths of the nest

    paths = ["/".join(map(str, p)) for p, _ in tree.flatten_with_path(specs)]
    for path, spec in zip(paths, tf.nest.flatten(specs), strict=True):
        shape = [count, *spec.shape.as_list()]
        dtype = spec.dtype
        if dtype == tf.uint8:
            value = rng.randint(0, 256, size=shape, dtype=np.uint8)
        elif dtype == tf.bool:  # done: an episode ends now and then
            value = rng.random_sample(shape) < 0.01
        elif dtype == tf.int64:  # policy_frames: the learner's frames then
            value = np.zeros(shape, dtype=np.int64)
        elif dtype == tf.int32:  # actions (and episode steps)
            value = rng.randint(0, num_actions, size=shape).astype(np.int32)
        elif dtype == tf.string:
            value = np.full(
                shape, LEVEL.encode() if "level_name" in path else b"", dtype=object
            )
        elif "reward" in path:
            value = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], size=shape).astype(
                np.float32
            )
        else:  # logits, baselines, core state, episode returns
            value = rng.standard_normal(shape).astype(np.float32)
        flat.append(value)
    return flat


def bench_config(
    agent_name: str,
    batch_size: int,
    unroll: int,
    mode: str,
    seconds: float,
    torso_dtype: str = "float32",
    num_learners: int = 1,
):
    import numpy as np
    import tensorflow as tf

    import environments
    import trajectory
    from actor.unroll import actor_output_specs
    from agent import create_agent
    from config import AgentConfig, EnvironmentConfig, LearnerConfig
    from learner import pipeline
    from learner.update import build_learner
    from runtime import sessions

    level_names = (LEVEL,)
    num_actions = environments.num_actions(level_names)
    environment = EnvironmentConfig(LEVEL, level_names, num_actions)
    agent_config = AgentConfig(
        agent_name,
        num_actions,
        use_instruction=False,
        torso_dtype=torso_dtype,
        **environments.frame_stack_settings(level_names),
    )
    if batch_size % num_learners or (num_learners > 1 and mode != "fixed"):
        raise SystemExit(
            f"--num_learners={num_learners}: the fixed-batch mode only, with "
            f"a batch ({batch_size}) that splits into equal towers"
        )
    # The same total batch, split over the learners' towers.
    config = LearnerConfig(
        batch_size=batch_size // num_learners,
        unroll_length=unroll,
        num_action_repeats=NUM_ACTION_REPEATS,
        total_environment_frames=int(1e9),
        num_learners=num_learners,
    )
    specs = actor_output_specs(environment, agent_config, unroll)
    rng = np.random.RandomState(0)
    flat_data = random_unrolls(specs, num_actions, UNIQUE_UNROLLS, rng)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        agent = create_agent(agent_config)  # as in training
        flat_specs = tf.nest.flatten(specs)
        if mode == "queue":
            # Room for the whole pre-fill: the learner's queue itself has
            # capacity 1 (actors block), this one is filled up front instead.
            steps_per_fill = max(2, int(np.ceil(192 / batch_size)))
            capacity = batch_size * (steps_per_fill + 1)
            queue = tf.queue.FIFOQueue(
                capacity, [s.dtype for s in flat_specs], [s.shape for s in flat_specs]
            )
            placeholders = [
                tf.compat.v1.placeholder(s.dtype, [None, *s.shape]) for s in flat_specs
            ]
            enqueue_many = queue.enqueue_many(placeholders)
            learner_pipeline = pipeline.build_learner_pipeline(
                agent, [queue], specs, config, ["/cpu:0"]
            )
            train_op = learner_pipeline.learner.train_and_count
            stage_op = learner_pipeline.stage_op
            fetches = (train_op, stage_op)
        else:
            steps_per_fill = None
            # One time-major batch, stacked once into local variables; each
            # step reads it (no queue, no stacking, no staging).
            constants = [
                tf.nest.pack_sequence_as(specs, [tf.constant(d[i]) for d in flat_data])
                for i in range(UNIQUE_UNROLLS)
            ]
            stacked = trajectory.stack_unrolls(
                [constants[i % UNIQUE_UNROLLS] for i in range(batch_size)]
            )

            def hold(t):
                if t.dtype == tf.string:
                    return t
                variable = tf.compat.v1.Variable(
                    t,
                    trainable=False,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                    use_resource=True,
                )
                return variable.read_value()

            batch = tf.nest.map_structure(hold, stacked)
            # Tower i: unrolls i*B/N .. (i+1)*B/N - 1, on logical CPU i.
            share = config.batch_size
            batches = (
                [batch]
                if num_learners == 1
                else [
                    trajectory.ActorOutput(
                        level_name=batch.level_name[i * share : (i + 1) * share],
                        agent_state=tf.nest.map_structure(
                            lambda t, i=i: t[i * share : (i + 1) * share],
                            batch.agent_state,
                        ),
                        env_outputs=tf.nest.map_structure(
                            lambda t, i=i: t[:, i * share : (i + 1) * share],
                            batch.env_outputs,
                        ),
                        agent_outputs=tf.nest.map_structure(
                            lambda t, i=i: t[:, i * share : (i + 1) * share],
                            batch.agent_outputs,
                        ),
                        policy_frames=batch.policy_frames[i * share : (i + 1) * share],
                    )
                    for i in range(num_learners)
                ]
            )
            devices = [f"/cpu:{i}" for i in range(num_learners)]
            learner = build_learner(
                agent, batches, config, devices if num_learners > 1 else None
            )
            fetches = learner.train_and_count
        parameter_bytes = sum(
            v.shape.num_elements() * v.dtype.size for v in agent.trainable_variables
        )
        session_config = sessions.session_config(single_machine_training=True)
        session_config.device_count["CPU"] = num_learners
        with tf.compat.v1.Session(config=session_config) as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer(),
                ]
            )

            def fill(steps):
                count = steps * batch_size
                index = np.arange(count) % UNIQUE_UNROLLS
                session.run(
                    enqueue_many,
                    dict(zip(placeholders, [d[index] for d in flat_data], strict=True)),
                )

            if mode == "queue":
                fill(steps_per_fill + 1)
                session.run(stage_op)
            warmup = 2
            for _ in range(warmup):
                session.run(fetches)
            timed_s, steps, cpu_s = 0.0, 0, 0.0
            load_start = common.loadavg()
            remaining = steps_per_fill - warmup if mode == "queue" else None
            while timed_s < seconds or steps < 3:
                if mode == "queue" and remaining == 0:
                    fill(steps_per_fill)  # untimed
                    remaining = steps_per_fill
                t0, c0 = time.perf_counter(), sum(os.times()[:2])
                session.run(fetches)
                timed_s += time.perf_counter() - t0
                cpu_s += sum(os.times()[:2]) - c0
                steps += 1
                if remaining is not None:
                    remaining -= 1
    steps_per_s = steps / timed_s
    return {
        "agent": agent_name,
        "batch_size": batch_size,
        "num_learners": num_learners,
        # Each learner but the first sends its gradients to the variables'
        # device and reads the parameters back: 2 x (N - 1) x these bytes
        # cross between devices per update (none here: one process).
        "parameter_bytes": parameter_bytes,
        "unroll_length": unroll,
        "mode": mode,
        "steps": steps,
        "seconds": timed_s,
        "learner_steps_per_s": steps_per_s,
        "frames_per_s": steps_per_s * batch_size * unroll * NUM_ACTION_REPEATS,
        "ms_per_step": 1000 * timed_s / steps,
        "cores": cpu_s / timed_s,
        "cpu_ms_per_step": 1000 * cpu_s / steps,
        "frames_per_cpu_s": steps * batch_size * unroll * NUM_ACTION_REPEATS / cpu_s,
        "load_start": load_start,
        "load_end": common.loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", default="shallow,deep")
    parser.add_argument("--batch_sizes", default="8,32")
    parser.add_argument("--modes", default="queue,fixed")
    parser.add_argument("--unroll_length", type=int, default=20)
    parser.add_argument(
        "--torso_dtypes",
        default="float32",
        help="comma-separated --torso_dtype values (float32, bfloat16)",
    )
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="timed seconds per configuration"
    )
    parser.add_argument(
        "--num_learners",
        default="1",
        help="comma-separated tower counts: each splits the same batch over N "
        "towers on N logical CPU devices (fixed-batch mode only)",
    )
    parser.add_argument(
        "--json",
        default=None,
        help="where to write the record; by default benchmarks/results/"
        "learner.json, but only when every configuration ran (a subset would "
        "replace the full record)",
    )
    args = parser.parse_args()
    full_run = all(
        getattr(args, name) == parser.get_default(name)
        for name in (
            "agents",
            "batch_sizes",
            "modes",
            "unroll_length",
            "torso_dtypes",
            "num_learners",
        )
    )

    import tensorflow as tf  # noqa: F401  (after TF_CPP_MIN_LOG_LEVEL)

    from runtime import tf_logging

    tf_logging.quiet_tensorflow_logging()
    print(common.machine_line(), flush=True)
    started = time.time()
    results = []
    for agent_name in args.agents.split(","):
        for torso_dtype in args.torso_dtypes.split(","):
            for batch_size in map(int, args.batch_sizes.split(",")):
                for mode, num_learners in (
                    (m, int(n))
                    for m in args.modes.split(",")
                    for n in args.num_learners.split(",")
                    if m == "fixed" or n == "1"
                ):
                    r = bench_config(
                        agent_name,
                        batch_size,
                        args.unroll_length,
                        mode,
                        args.seconds,
                        torso_dtype,
                        num_learners,
                    )
                    r["torso_dtype"] = torso_dtype
                    results.append(r)
                    print(
                        f"{agent_name:>7} {torso_dtype} B={batch_size:<3} {mode:>5} "
                        f"N={num_learners}: "
                        f"{r['learner_steps_per_s']:.2f} steps/s, "
                        f"{r['frames_per_s']:.0f} frames/s, {r['ms_per_step']:.0f} ms/step, "
                        f"{r['cores']:.2f} cores, {r['cpu_ms_per_step']:.0f} CPU ms/step, "
                        f"load {r['load_start']:.1f}-{r['load_end']:.1f}",
                        flush=True,
                    )
    print()
    print(
        "| agent | torso dtype | batch | unroll | input | learner steps/s | frames/s consumed | ms/step | cores used "
        "| CPU ms/step | frames per CPU-second | load (start-end) |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        mode = (
            "pre-filled queue (dequeue_many, time-major, stage)"
            if r["mode"] == "queue"
            else "fixed batch in variables"
        )
        if r.get("num_learners", 1) > 1:
            mode += f", {r['num_learners']} towers"
        print(
            f"| {r['agent']} | {r['torso_dtype']} | {r['batch_size']} | {r['unroll_length']} | {mode} | {r['learner_steps_per_s']:.2f} "
            f"| {r['frames_per_s']:.0f} | {r['ms_per_step']:.0f} | {r['cores']:.2f} | {r['cpu_ms_per_step']:.0f} "
            f"| {r['frames_per_cpu_s']:.0f} | {r['load_start']:.1f}-{r['load_end']:.1f} |"
        )
    duration = time.time() - started
    print(f"\n{duration:.0f} s")
    path = args.json
    if path is None:
        if not full_run:
            print("A subset ran: no record written (pass --json PATH to keep it).")
            return
        path = os.path.join(common.REPO, "benchmarks", "results", "learner.json")
    common.write_json(path, {"duration_s": duration, "results": results})


if __name__ == "__main__":
    main()
