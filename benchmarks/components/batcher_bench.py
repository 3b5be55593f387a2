"""Calls per second through dynamic_batching.batch_fn vs unbatched calls.

Usage (from the repository root):

    python3 benchmarks/components/batcher_bench.py [--seconds 2.5] [--threads 1,8,32,64]
        [--models mlp,shallow,deep] [--results benchmarks/results/batcher.md]

N Python threads each call a network on one example ([1, ...]) in a loop,
each call one `session.run`, for --seconds per figure (split into halves run
in the order unbatched, batched, batched, unbatched, so load drift on a
shared machine hits both alike). Two ways, same graph, same weights, same
session, same run:

  unbatched: every thread runs the network on its own example;
  batched:   the network is wrapped in dynamic_batching.batch_fn (defaults:
             minimum 1, maximum 1024, timeout 100 ms), so concurrent calls
             share one forward pass.

Networks (inputs generated in-graph, so there is no feed cost):
  mlp:     [1, 64] float -> fc 256 -> fc 256 -> fc 16
  shallow: [1, 84, 84, 4] uint8 -> conv 8x8/4 16ch -> conv 4x4/2 32ch
           -> fc 256 -> 18 logits + baseline   (the agent's shallow torso)
  deep:    [1, 84, 84, 4] uint8 -> 3 x [conv 3x3, maxpool 3x3/2, 2 residual
           blocks] with 16/32/32 channels -> fc 256 -> logits + baseline
           (the IMPALA deep torso)

The "mean batch" column is the caller-weighted mean size of the batches
that calls were part of.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import tensorflow as tf  # noqa: E402

import dynamic_batching  # noqa: E402
from benchmarks.core import common  # noqa: E402

NUM_ACTIONS = 18


class _Params:
    """Creates variables on first use; later calls reuse them by name."""

    def __init__(self):
        self._vars = {}
        self._seed = 0

    def get(self, name, shape):
        if name not in self._vars:
            self._seed += 1
            fan_in = 1
            for d in shape[:-1]:
                fan_in *= d
            init = tf.random.stateless_normal(shape, seed=[self._seed, 0]) / (
                fan_in**0.5
            )
            self._vars[name] = tf.Variable(init, name=name)
        return self._vars[name]

    def dense(self, name, x, units, relu=True):
        w = self.get(name + "_w", [x.shape[-1], units])
        b = self.get(name + "_b", [units])
        y = tf.matmul(x, w) + b
        return tf.nn.relu(y) if relu else y

    def conv(self, name, x, k, channels, stride):
        w = self.get(name, [k, k, x.shape[-1], channels])
        return tf.nn.conv2d(x, w, strides=stride, padding="SAME")


def mlp(p, x):
    h = p.dense("mlp1", x, 256)
    h = p.dense("mlp2", h, 256)
    return p.dense("mlp3", h, 16, relu=False)


def _heads(p, h):
    h = p.dense("fc", tf.reshape(h, [-1, h.shape[1] * h.shape[2] * h.shape[3]]), 256)
    logits = p.dense("logits", h, NUM_ACTIONS, relu=False)
    baseline = tf.squeeze(p.dense("baseline", h, 1, relu=False), 1)
    return logits, baseline


def shallow(p, frame):
    x = tf.cast(frame, tf.float32) / 255.0
    x = tf.nn.relu(p.conv("c1", x, 8, 16, 4))
    x = tf.nn.relu(p.conv("c2", x, 4, 32, 2))
    return _heads(p, x)


def deep(p, frame):
    x = tf.cast(frame, tf.float32) / 255.0
    for i, channels in enumerate((16, 32, 32)):
        x = p.conv(f"s{i}", x, 3, channels, 1)
        x = tf.nn.max_pool2d(x, 3, 2, "SAME")
        for j in range(2):
            r = tf.nn.relu(x)
            r = p.conv(f"s{i}r{j}a", r, 3, channels, 1)
            r = tf.nn.relu(r)
            r = p.conv(f"s{i}r{j}b", r, 3, channels, 1)
            x = x + r
    return _heads(p, tf.nn.relu(x))


def make_input(model, batch=1):
    if model == "mlp":
        return tf.random.uniform([batch, 64])
    return tf.cast(
        tf.random.uniform([batch, 84, 84, 4], maxval=256, dtype=tf.int32), tf.uint8
    )


def ms_per_example(sess, fetch, batch, seconds=0.5):
    """One thread, back-to-back runs of a batch: milliseconds per example."""
    for _ in range(3):
        sess.run(fetch)
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sess.run(fetch)
        calls += 1
    return (time.perf_counter() - start) / calls / batch * 1e3


MODELS = {"mlp": mlp, "shallow": shallow, "deep": deep}


def measure(sess, fetch, num_threads, seconds, warmup=0.3, sized=False):
    """(calls/s, mean batch) with num_threads threads each running `fetch`.

    With sized=True, fetch is (output, batch size) and the mean batch size
    is computed from the second element.
    """
    stop = threading.Event()
    counting = threading.Event()
    counts = [0] * num_threads
    batch_sums = [0] * num_threads
    errors = []

    def loop(i):
        run = sess.make_callable(fetch)
        try:
            while not stop.is_set():
                result = run()
                if counting.is_set():
                    counts[i] += 1
                    batch_sums[i] += int(result[1][0]) if sized else 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=loop, args=(i,), daemon=True)
        for i in range(num_threads)
    ]
    for t in threads:
        t.start()
    time.sleep(warmup)
    counting.set()
    start = time.perf_counter()
    time.sleep(seconds)
    counting.clear()
    elapsed = time.perf_counter() - start
    stop.set()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    calls = sum(counts)
    return calls / elapsed, (sum(batch_sums) / calls if calls else 0.0)


def bench_model(model, thread_counts, seconds, ceiling_batch):
    rows = []
    with tf.Graph().as_default():
        params = _Params()
        net = MODELS[model]
        x = make_input(model)
        unbatched = net(params, x)
        big = net(params, make_input(model, ceiling_batch))

        @dynamic_batching.batch_fn
        def batched_net(inputs):
            batch = tf.shape(inputs)[0]
            return net(params, inputs), tf.fill([batch], batch)

        batched = batched_net(x)
        # Unbatched fetch: the network output only; batched: (output, size).
        unbatched_fetch = unbatched
        batched_fetch = tuple(batched)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            # What batching can gain at most on this machine: one thread,
            # forward pass alone, batch 1 vs a large batch.
            ceiling = (
                ms_per_example(sess, unbatched, 1),
                ms_per_example(sess, big, ceiling_batch),
            )
            print(
                f"{model:8s} forward pass, one thread: {ceiling[0]:.3f} ms/example "
                f"at batch 1, {ceiling[1]:.3f} at batch {ceiling_batch}",
                flush=True,
            )
            coord = tf.train.Coordinator()
            runners = tf.compat.v1.train.start_queue_runners(sess, coord=coord)
            for n in thread_counts:
                # A-B-B-A halves: load drift on a shared machine hits both alike.
                half = seconds / 2
                p1, _ = measure(sess, unbatched_fetch, n, half)
                f1, b1 = measure(sess, batched_fetch, n, half, sized=True)
                f2, b2 = measure(sess, batched_fetch, n, half, sized=True)
                p2, _ = measure(sess, unbatched_fetch, n, half)
                plain, fast = (p1 + p2) / 2, (f1 + f2) / 2
                mean_batch = (b1 * f1 + b2 * f2) / (f1 + f2)
                rows.append((model, n, plain, fast, mean_batch))
                print(
                    f"{model:8s} threads={n:3d}  unbatched {plain:8.1f} calls/s  "
                    f"batched {fast:8.1f} calls/s  ({fast / plain:5.2f}x, mean batch "
                    f"{mean_batch:5.1f})",
                    flush=True,
                )
            coord.request_stop()
            coord.join(runners, stop_grace_period_secs=10)
    return rows, ceiling


def markdown(rows, ceilings, ceiling_batch, argv, seconds):
    lines = [
        "# Dynamic batching benchmark",
        "",
        "Command (from the repository root):",
        "",
        "    python3 benchmarks/components/batcher_bench.py " + " ".join(argv),
        "",
        f'Machine: `nproc` = {os.cpu_count()}, CPU model "{common.cpu_model()}" '
        f"(/proc/cpuinfo); Python {platform.python_version()}, tensorflow-cpu "
        f"{tf.__version__}. Date: {datetime.date.today().isoformat()}.",
        "",
        f"Each figure: calls/s over {seconds} s (two halves, in the order "
        "unbatched, batched, batched, unbatched, each after a 0.3 s warm-up), "
        "N Python "
        "threads each calling the network on one example per `session.run`; "
        "default session config; same graph, weights and session for both "
        "columns. Batched = `dynamic_batching.batch_fn` with its defaults "
        "(minimum 1, maximum 1024, timeout 100 ms). Mean batch = "
        "caller-weighted mean size of the batches calls were part of.",
        "",
        "| network | threads | unbatched (calls/s) | batched (calls/s) | batched / unbatched | mean batch |",
        "|---|---|---|---|---|---|",
    ]
    for model, n, plain, fast, mean_batch in rows:
        lines.append(
            f"| {model} | {n} | {plain:.0f} | {fast:.0f} | {fast / plain:.2f}x | {mean_batch:.1f} |"
        )
    lines += [
        "",
        "Forward pass alone, one thread, back-to-back `session.run` of one batch "
        "(inputs generated in-graph): what batching can gain at most over "
        "one-at-a-time calls on this machine.",
        "",
        f"| network | ms/example at batch 1 | ms/example at batch {ceiling_batch} | ratio |",
        "|---|---|---|---|",
    ]
    for model, (one, big) in ceilings.items():
        lines.append(f"| {model} | {one:.3f} | {big:.3f} | {one / big:.1f}x |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--threads", default="1,8,32,64")
    parser.add_argument("--models", default="mlp,shallow,deep")
    parser.add_argument(
        "--ceiling_batch", type=int, default=32, help="large batch for the ceiling"
    )
    parser.add_argument(
        "--results", default="", help="also write a markdown table here"
    )
    common.add_json_argument(parser)
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            parser.error(
                f"--models: unknown network {m!r}; choose from {sorted(MODELS)}"
            )
    print("batcher library:", dynamic_batching.build_library()[0], flush=True)
    start = time.time()
    rows, ceilings = [], {}
    for m in models:
        model_rows, ceilings[m] = bench_model(
            m, thread_counts, args.seconds, args.ceiling_batch
        )
        rows += model_rows
    print(f"total {time.time() - start:.0f} s")
    table = markdown(rows, ceilings, args.ceiling_batch, sys.argv[1:], args.seconds)
    print(table)
    if args.results:
        with open(args.results, "w") as f:
            f.write(table)
    common.write_json(
        args.json, {"argv": sys.argv[1:], "rows": rows, "ceilings": ceilings}
    )


if __name__ == "__main__":
    main()
