"""Milliseconds per call of vtrace.from_importance_weights, next to numpy.

Usage (from the repository root):

    python3 benchmarks/components/vtrace_bench.py [--repeats 7] [--min_seconds 0.3]

For each shape [T, B] the graph is built once in a tf.compat.v1 Session (graph
build is not timed). The inputs live in variables, so there is no feed cost
and Grappler cannot constant-fold the computation away; each timed call is
one `session.run` that fetches vs and pg_advantages as numpy arrays. The
baseline is a numpy V-trace, vectorised over B with a Python loop over T,
timed in the same process on the same inputs. An empty `session.run` is timed
too, to show the fixed per-call cost of a session. Figures are the median of
`--repeats` repetitions, each averaging enough calls to last `--min_seconds`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import vtrace  # noqa: E402
from benchmarks.core import common  # noqa: E402

SHAPES = [(100, 32), (20, 256)]


def numpy_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0):
    """V-trace by the backward recursion, vectorised over the batch."""
    rhos = np.exp(log_rhos)
    clipped_rhos = np.minimum(rho_bar, rhos)
    cs = np.minimum(1.0, rhos)
    values_t_plus_1 = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
    vs_minus_v = np.empty_like(values)
    acc = np.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    vs_t_plus_1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg_advantages


def make_inputs(num_steps: int, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (num_steps, batch)
    return dict(
        log_rhos=rng.uniform(-2, 2, shape).astype(np.float32),
        discounts=np.where(rng.random(shape) < 0.01, 0.0, 0.99).astype(np.float32),
        rewards=rng.normal(size=shape).astype(np.float32),
        values=rng.normal(size=shape).astype(np.float32),
        bootstrap_value=rng.normal(size=(batch,)).astype(np.float32),
    )


def time_per_call(fn, repeats: int, min_seconds: float) -> float:
    """Median over repetitions of the mean ms per call of fn()."""
    for _ in range(5):  # warm-up: kernels, allocators, caches
        fn()
    calls = 1
    while True:  # find a call count that lasts min_seconds
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= min_seconds:
            break
        calls *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


def bench_shape(num_steps: int, batch: int, repeats: int, min_seconds: float):
    inputs = make_inputs(num_steps, batch)
    with tf.Graph().as_default():
        tensors = {
            k: tf.compat.v1.get_local_variable(k, initializer=v, use_resource=True)
            for k, v in inputs.items()
        }
        out = vtrace.from_importance_weights(**tensors)
        empty = tf.no_op()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            got = sess.run(out)
            want = numpy_vtrace(**inputs)
            # Sanity check: the two implementations agree.
            np.testing.assert_allclose(got.vs, want[0], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(got.pg_advantages, want[1], rtol=1e-4, atol=1e-4)
            tf_ms = time_per_call(lambda: sess.run(out), repeats, min_seconds)
            empty_ms = time_per_call(lambda: sess.run(empty), repeats, min_seconds)
    np_ms = time_per_call(lambda: numpy_vtrace(**inputs), repeats, min_seconds)
    return tf_ms, np_ms, empty_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min_seconds", type=float, default=0.3)
    common.add_json_argument(parser)
    args = parser.parse_args()
    rows = []

    print(
        f"tensorflow {tf.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}, nproc {os.cpu_count()}"
    )
    print(f"median of {args.repeats} repetitions, each >= {args.min_seconds} s\n")
    print(
        "| T | B | vtrace.from_importance_weights, graph session (ms/call) "
        "| numpy reference (ms/call) | TF time / numpy time | empty session.run (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for num_steps, batch in SHAPES:
        tf_ms, np_ms, empty_ms = bench_shape(
            num_steps, batch, args.repeats, args.min_seconds
        )
        print(
            f"| {num_steps} | {batch} | {tf_ms:.3f} | {np_ms:.3f} "
            f"| {tf_ms / np_ms:.1f}x | {empty_ms:.3f} |",
            flush=True,
        )
        rows.append(
            dict(T=num_steps, B=batch, tf_ms=tf_ms, numpy_ms=np_ms, empty_ms=empty_ms)
        )
    common.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
