"""Benchmark for py_process.py: call round trips and child start times.

    python3 benchmarks/components/py_process_bench.py [--seconds 2]

Prints, in one run:
  * round trips/s of session.run on a PyProcess op for a no-op method and for a
    method returning an 84x84x4 uint8 frame (Atari's observation), next to an
    in-process tf.compat.v1.numpy_function (py_func) doing the same (the
    baseline), and the raw pipe round trip without TensorFlow;
  * the start time of one child: PyProcess (fresh interpreter, our bootstrap),
    multiprocessing 'forkserver' and 'spawn' running the same work, and what a
    fresh interpreter pays to import TensorFlow (the extra cost of any start
    method that re-imports a __main__ such as experiment.py in each child);
  * the resident memory of one PyProcess child.

Loopback only; about a minute on 2 cores.
"""

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO_ROOT, os.path.join(REPO_ROOT, "tests")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.core import common  # noqa: E402 - no TensorFlow at import

# TensorFlow is imported inside main(): multiprocessing's spawn and forkserver
# children re-import this script, and they should measure the start method, not
# TensorFlow's import.


def _mp_child(conn):
    """What a child does before it can serve: import its class and construct it."""
    import py_process_helpers

    py_process_helpers.Frames()
    conn.send("ready")
    conn.recv()


def mp_start_once(context):
    """Seconds from Process.start() to the child's 'ready' message."""
    parent_conn, child_conn = context.Pipe()
    start = time.perf_counter()
    process = context.Process(target=_mp_child, args=(child_conn,), daemon=True)
    process.start()
    parent_conn.recv()
    elapsed = time.perf_counter() - start
    parent_conn.send("exit")
    process.join(10)
    return elapsed


def pyprocess_start_once(tf, py_process, helpers):
    with tf.Graph().as_default():
        process = py_process.PyProcess(helpers.Frames)
        start = time.perf_counter()
        process.start()
        elapsed = time.perf_counter() - start
        process.close()
    return elapsed


def time_starts(tf, py_process, helpers, rounds):
    """Start times per method, interleaved round by round so that a change in the
    machine's load affects every method alike."""
    forkserver = multiprocessing.get_context("forkserver")
    spawn = multiprocessing.get_context("spawn")
    times = {"pyprocess": [], "forkserver": [], "spawn": []}
    forkserver_first = mp_start_once(forkserver)  # also boots the fork server
    for _ in range(rounds):
        times["pyprocess"].append(pyprocess_start_once(tf, py_process, helpers))
        times["forkserver"].append(mp_start_once(forkserver))
        times["spawn"].append(mp_start_once(spawn))
    return times, forkserver_first


def time_parallel_start(tf, py_process, helpers, count):
    with tf.Graph().as_default():
        processes = [py_process.PyProcess(helpers.Frames) for _ in range(count)]
        start = time.perf_counter()
        py_process.start_all(processes)
        elapsed = time.perf_counter() - start
        py_process.close_all(processes)
    return elapsed


def time_tensorflow_import():
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import tensorflow"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def rss_mib(pid):
    kb = common.proc_status(pid, "VmRSS")
    return float("nan") if kb is None else kb / 1024


def interleaved_rates(fns, seconds, chunks=8):
    """Median calls/s of each fn, measured in `chunks` alternating slices.

    Other work on the machine changes during a run; alternating the candidates in
    short slices exposes them all to the same conditions.
    """
    for fn in fns:
        for _ in range(20):
            fn()  # warm-up
    rates = [[] for _ in fns]
    for _ in range(chunks):
        for index, fn in enumerate(fns):
            count, start = 0, time.perf_counter()
            while True:
                for _ in range(10):
                    fn()
                count += 10
                elapsed = time.perf_counter() - start
                if elapsed >= seconds / chunks:
                    break
            rates[index].append(count / elapsed)
    return [statistics.median(r) for r in rates]


def parallel_rate(session, ops, seconds):
    """Total session.run/s with one thread per op (each on its own process)."""
    counts = [0] * len(ops)
    stop = threading.Event()

    def worker(index):
        while not stop.is_set():
            session.run(ops[index])
            counts[index] += 1

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(ops))
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    return sum(counts) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=4.0,
        help="measuring time per round-trip figure",
    )
    parser.add_argument(
        "--starts", type=int, default=5, help="child starts measured per start method"
    )
    common.add_json_argument(parser)
    args = parser.parse_args()

    import numpy as np
    import py_process_helpers as helpers
    import tensorflow as tf

    import py_process

    rows = []
    with tf.Graph().as_default():
        process = py_process.PyProcess(helpers.Frames)
        remote_noop = process.proxy.noop()
        remote_frame = process.proxy.frame()
        local_env = helpers.Frames()  # the same class, in this process

        def local_frame_fn():
            return local_env.frame()

        local_noop = tf.compat.v1.numpy_function(
            lambda: np.int32(0), [], tf.int32, stateful=True
        )
        local_frame = tf.compat.v1.numpy_function(
            local_frame_fn, [], tf.uint8, stateful=True
        )
        others = [py_process.PyProcess(helpers.Frames) for _ in range(2)]
        parallel_frames = [p.proxy.frame() for p in others]
        py_process.start_all([process, *others])
        child_rss = rss_mib(process.pid)
        with tf.compat.v1.Session() as session:
            for name, remote, local, method in [
                ("no-op", remote_noop, local_noop, "noop"),
                ("84x84x4 uint8 frame", remote_frame, local_frame, "frame"),
            ]:
                rates = interleaved_rates(
                    [
                        lambda op=local: session.run(op),
                        lambda op=remote: session.run(op),
                        lambda m=method: process._call(m, (), {}),
                    ],
                    args.seconds,
                )
                rows.append((name, *rates))
            two_threads = parallel_rate(session, parallel_frames, args.seconds)
        py_process.close_all([process, *others])

    starts, forkserver_first = time_starts(tf, py_process, helpers, args.starts)
    parallel_8 = time_parallel_start(tf, py_process, helpers, 8)
    tf_import = time_tensorflow_import()

    print(
        f"nproc={os.cpu_count()}  python={sys.version.split()[0]}  "
        f"tensorflow={tf.__version__}\n"
    )
    print(
        "Round trips per second (session.run of one op; median of 8 interleaved "
        f"slices, {args.seconds:.0f} s per figure)"
    )
    print(
        f"{'method':<22}{'in-process py_func':>20}{'PyProcess':>12}"
        f"{'ratio':>8}{'pipe only (no TF)':>20}"
    )
    for name, local_rate, remote_rate, pipe_rate in rows:
        print(
            f"{name:<22}{local_rate:>20,.0f}{remote_rate:>12,.0f}"
            f"{remote_rate / local_rate:>8.2f}{pipe_rate:>20,.0f}"
        )
    print(f"\n2 threads x 2 PyProcesses, frame op: {two_threads:,.0f} runs/s in total")
    print(f"\nChild start time, s (median of {args.starts}; min-max)")

    def show(name, times):
        print(
            f"  {name:<58}{statistics.median(times):6.3f}  "
            f"({min(times):.3f}-{max(times):.3f})"
        )

    show("PyProcess.start() (fresh interpreter, -c bootstrap)", starts["pyprocess"])
    print(f"  {'PyProcess start_all() of 8, total':<58}{parallel_8:6.3f}")
    print(
        f"  {'multiprocessing forkserver, first (boots the server)':<58}"
        f"{forkserver_first:6.3f}"
    )
    show("multiprocessing forkserver, later", starts["forkserver"])
    show("multiprocessing spawn (re-imports this TF-free __main__)", starts["spawn"])
    print(f"  {'fresh interpreter: import tensorflow':<58}{tf_import:6.3f}")
    print(f"\nPyProcess child resident memory: {child_rss:.0f} MiB")
    common.write_json(
        args.json,
        {
            "round_trips_per_s": [
                dict(
                    zip(("op", "py_func", "py_process", "pipe_only"), row, strict=True)
                )
                for row in rows
            ],
            "two_threads_frames_runs_per_s": two_threads,
            "start_s": starts,
            "start_all_8_s": parallel_8,
            "forkserver_first_s": forkserver_first,
            "tensorflow_import_s": tf_import,
            "child_rss_mib": child_rss,
        },
    )


if __name__ == "__main__":
    main()
