"""Tests for batcher.cc and dynamic_batching.py.

Every wait is bounded: calls that may block run on daemon threads joined
with a timeout, and blocking session runs carry RunOptions timeouts, so a
bug fails a test instead of hanging it.
"""

import collections
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import dynamic_batching

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOIN_TIMEOUT_S = 30.0

Pair = collections.namedtuple("Pair", "first second")


@pytest.fixture(scope="module")
def ops():
    return dynamic_batching.load_library()


class Call:
    """Runs fn() on a daemon thread; result() waits a bounded time."""

    def __init__(self, fn, *args):
        self._value = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._thread.start()

    def _run(self, fn, *args):
        try:
            self._value = fn(*args)
        except Exception as e:  # noqa: BLE001 - handed to the test thread
            self._error = e

    def done(self):
        return not self._thread.is_alive()

    def wait(self, timeout=JOIN_TIMEOUT_S):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"call still blocked after {timeout} s"

    def result(self, timeout=JOIN_TIMEOUT_S):
        self.wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def error(self, timeout=JOIN_TIMEOUT_S):
        self.wait(timeout)
        return self._error


def run_options(timeout_ms):
    return tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)


def wait_for(predicate, timeout=JOIN_TIMEOUT_S, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Session:
    """A graph + session with the batching queue runners started."""

    def __init__(self, start_runners=True, config=None):
        self.graph = tf.Graph()
        self._start_runners = start_runners
        self._config = config

    def __enter__(self):
        self._graph_ctx = self.graph.as_default()
        self._graph_ctx.__enter__()
        return self

    def start(self):
        self.sess = tf.compat.v1.Session(graph=self.graph, config=self._config)
        self.coord = tf.train.Coordinator()
        self.threads = []
        if self._start_runners:
            self.threads = tf.compat.v1.train.start_queue_runners(
                self.sess, coord=self.coord
            )
        return self.sess

    def __exit__(self, *exc):
        if hasattr(self, "sess"):
            self.coord.request_stop()
            self.coord.join(self.threads, stop_grace_period_secs=10)
            self.sess.close()
        self._graph_ctx.__exit__(*exc)


# ---------------------------------------------------------------------------
# batch_fn end to end.


def test_one_call():
    with Session() as s:

        @dynamic_batching.batch_fn
        def f(a, b):
            return a + b

        x = tf.constant([[1.0, 2.0]])
        with tf.device("/job:localhost/replica:0/task:0"):
            out = f(x, 2 * x)
        assert out.shape.as_list() == [1, 2]
        # The batcher ops only have CPU kernels; a partial device scope merges.
        assert out.op.device == "/job:localhost/replica:0/task:0/device:CPU:0"
        sess = s.start()
        np.testing.assert_allclose(
            sess.run(out, options=run_options(10_000)), [[3.0, 6.0]]
        )


def test_nests_in_and_out():
    with Session() as s:

        @dynamic_batching.batch_fn
        def f(pair, extra):
            return {
                "sum": pair.first + pair.second,
                "pair": Pair(extra["x"], pair.first),
            }

        a = tf.constant([[1]])
        b = tf.constant([[2]])
        c = tf.constant([["s"]])
        out = f(Pair(a, b), {"x": c})
        sess = s.start()
        result = sess.run(out, options=run_options(10_000))
        assert result["sum"].tolist() == [[3]]
        assert isinstance(result["pair"], Pair)
        assert result["pair"].first.tolist() == [[b"s"]]
        assert result["pair"].second.tolist() == [[1]]


def test_two_concurrent_calls_form_one_batch():
    with Session() as s:
        sizes = []

        @dynamic_batching.batch_fn_with_options(minimum_batch_size=2, timeout_ms=None)
        def f(x):
            batch = tf.shape(x)[0]
            return x * 10, tf.fill([batch], batch)

        x = tf.compat.v1.placeholder(tf.float32, [1])
        out = f(x)
        sess = s.start()
        calls = [Call(sess.run, out, {x: [i]}) for i in (1.0, 2.0)]
        for i, call in zip((1.0, 2.0), calls, strict=True):
            y, size = call.result()
            assert y.tolist() == [i * 10]
            sizes.append(int(size[0]))
        assert sizes == [2, 2]


@pytest.mark.parametrize(
    "inter_op_threads",
    [0, 1, -1],
    ids=["default_pool", "one_inter_op_thread", "ops_in_caller_thread"],
)
def test_many_small_calls_64_threads(inter_op_threads):
    # 64 callers; 0 is the default session thread pool (one inter-op thread
    # per core). Asynchronous kernels must not starve the batching thread,
    # even with one inter-op thread or with ops run in the calling thread.
    # Per-session threads: the global pool is sized by the first session.
    config = tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=inter_op_threads,
        use_per_session_threads=inter_op_threads > 0,
    )
    with Session(config=config) as s:

        @dynamic_batching.batch_fn
        def f(x):
            return x * 2 + 1, tf.fill([tf.shape(x)[0]], tf.shape(x)[0])

        x = tf.compat.v1.placeholder(tf.int64, [1, 3])
        out = f(x)
        sess = s.start()
        sizes = collections.Counter()
        lock = threading.Lock()

        def caller(i):
            for j in range(20):
                v = i * 100 + j
                y, n = sess.run(out, {x: [[v, v + 1, v + 2]]})
                assert y.tolist() == [[2 * v + 1, 2 * v + 3, 2 * v + 5]], (i, j, y)
                with lock:
                    sizes[int(n[0])] += 1

        calls = [Call(caller, i) for i in range(64)]
        for call in calls:
            call.result(timeout=60)
        assert sum(sizes.values()) == 64 * 20
        assert max(sizes) > 1, f"never batched: {sizes}"


def test_batch_fn_inside_while_loop():
    # The agent calls the batched network inside tf.scan (a v2 while loop):
    # the batched computation must be lifted out of the loop body.
    with Session() as s:

        @dynamic_batching.batch_fn
        def f(x):
            return x + 1

        def step(acc, _):
            return f(acc)

        result = tf.scan(step, tf.range(5), initializer=tf.constant([0]))
        sess = s.start()
        assert sess.run(result, options=run_options(10_000)).tolist() == [
            [1],
            [2],
            [3],
            [4],
            [5],
        ]


def test_static_batch_shape():
    with Session() as s:
        seen = {}

        @dynamic_batching.batch_fn_with_options(
            minimum_batch_size=2, maximum_batch_size=2, timeout_ms=None
        )
        def static_f(x):
            seen["static"] = x.shape.as_list()
            return x

        @dynamic_batching.batch_fn
        def dynamic_f(x):
            seen["dynamic"] = x.shape.as_list()
            return tf.reduce_sum(x, axis=1)

        x = tf.zeros([1, 3, 4])
        static_out = static_f(x)
        dynamic_out = dynamic_f(x)
        assert seen == {"static": [2, 3, 4], "dynamic": [None, 3, 4]}
        assert static_out.shape.as_list() == [1, 3, 4]
        assert dynamic_out.shape.as_list() == [1, 4]
        sess = s.start()
        calls = [Call(sess.run, static_out) for _ in range(2)]
        for call in calls:
            assert call.result().shape == (1, 3, 4)


def test_input_batch_size_must_be_one():
    with Session() as s:

        @dynamic_batching.batch_fn
        def f(x):
            return x

        with pytest.raises(ValueError, match="leading .batch. dimension 1"):
            f(tf.zeros([2, 3]))
        with pytest.raises(ValueError, match="leading .batch. dimension 1"):
            f(tf.zeros([]))
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        out = f(x)
        sess = s.start()
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="leading .batch. dimension 1"
        ):
            sess.run(out, {x: np.zeros([2, 3])}, options=run_options(10_000))
        # A run after an error works.
        assert sess.run(
            out, {x: [[1, 2, 3]]}, options=run_options(10_000)
        ).tolist() == [[1, 2, 3]]


def test_input_shapes_must_match():
    with Session() as s:

        @dynamic_batching.batch_fn_with_options(minimum_batch_size=2, timeout_ms=None)
        def f(x):
            return x * 2

        x = tf.compat.v1.placeholder(tf.float32, [1, None])
        out = f(x)
        sess = s.start()
        first = Call(sess.run, out, {x: [[1.0, 2.0]]})
        stats = dynamic_batching.load_library().batcher_stats(
            s.graph.get_operation_by_name("batched_f/Batcher").outputs[0]
        )
        wait_for(lambda: sess.run(stats)[0] == 1, what="first caller to wait")
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="same dtypes and shapes"
        ):
            sess.run(out, {x: [[1.0, 2.0, 3.0]]}, options=run_options(10_000))
        assert not first.done()
        # A matching caller completes the batch: runs after the error work.
        second = sess.run(out, {x: [[3.0, 4.0]]}, options=run_options(10_000))
        assert second.tolist() == [[6.0, 8.0]]
        assert first.result().tolist() == [[2.0, 4.0]]


def test_output_needs_batch_dimension_of_batch_size():
    with Session() as s:

        @dynamic_batching.batch_fn
        def bad(x):
            # One row too many whenever the input is negative.
            extra = tf.cast(tf.reduce_any(x < 0), tf.int32)
            return tf.concat([x, tf.zeros([extra, 1])], axis=0)

        @dynamic_batching.batch_fn
        def scalar(x):
            return tf.reduce_sum(x)

        with pytest.raises(ValueError, match="batch dimension"):
            scalar(tf.zeros([1, 1]))
        x = tf.compat.v1.placeholder(tf.float32, [1, 1])
        out = bad(x)
        sess = s.start()
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="leading .batch. dimension"
        ):
            sess.run(out, {x: [[-1.0]]}, options=run_options(10_000))
        # The runner survived the error.
        assert sess.run(out, {x: [[5.0]]}, options=run_options(10_000)).tolist() == [
            [5.0]
        ]


def test_error_inside_batched_function_fails_callers_not_hangs():
    with Session() as s:

        @dynamic_batching.batch_fn
        def f(x):
            with tf.control_dependencies([tf.debugging.assert_non_negative(x)]):
                return tf.identity(x)

        x = tf.compat.v1.placeholder(tf.float32, [1])
        out = f(x)
        sess = s.start()
        with pytest.raises(tf.errors.InternalError, match="batched function"):
            sess.run(out, {x: [-1.0]}, options=run_options(10_000))
        assert sess.run(out, {x: [2.0]}, options=run_options(10_000)).tolist() == [2.0]


def test_caller_run_timeout_and_session_close_do_not_hang():
    with Session(start_runners=False) as s:

        @dynamic_batching.batch_fn
        def f(x):
            return x

        out = f(tf.zeros([1]))
        sess = s.start()
        # No runner: the call can only end by its step's cancellation.
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(out, options=run_options(200))
        pending = Call(sess.run, out)
        time.sleep(0.2)
        sess.close()
        assert isinstance(pending.error(), tf.errors.CancelledError)


def test_monitored_session_starts_and_stops_runner():
    graph = tf.Graph()
    with graph.as_default():

        @dynamic_batching.batch_fn
        def f(x):
            return x * 3

        out = f(tf.ones([1, 2]))
        with tf.compat.v1.train.MonitoredSession() as sess:
            assert sess.run(out).tolist() == [[3.0, 3.0]]


# ---------------------------------------------------------------------------
# The ops directly.


def test_close_cancels_get_inputs_and_compute(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=2, maximum_batch_size=2, timeout_ms=-1)
        compute = ops.batcher_compute(handle, [tf.zeros([1, 2])], Tout=[tf.float32])
        inputs, _ = ops.batcher_get_inputs(handle, Tin=[tf.float32])
        close = ops.batcher_close(handle)
        stats = ops.batcher_stats(handle)
        with tf.compat.v1.Session() as sess:
            sess.run(handle)
            get = Call(sess.run, inputs)
            callers = [Call(sess.run, compute)]
            wait_for(lambda: sess.run(stats).tolist() == [1, 1, 0], what="ops to wait")
            sess.run(close)
            for call in [get, *callers]:
                assert isinstance(call.error(), tf.errors.CancelledError), call.error()
            # Later calls fail at once too.
            with pytest.raises(tf.errors.CancelledError, match="closed"):
                sess.run(compute, options=run_options(10_000))
            with pytest.raises(tf.errors.CancelledError, match="closed"):
                sess.run(inputs, options=run_options(10_000))
            sess.run(close)  # closing twice is fine


def test_close_cancels_computation_in_flight(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=1, maximum_batch_size=4, timeout_ms=-1)
        compute = ops.batcher_compute(handle, [tf.zeros([1])], Tout=[tf.float32])
        (inputs,), cid = ops.batcher_get_inputs(handle, Tin=[tf.float32])
        set_outputs = ops.batcher_set_outputs(handle, cid, [inputs])
        close = ops.batcher_close(handle)
        with tf.compat.v1.Session() as sess:
            caller = Call(sess.run, compute)
            batch, computation_id = sess.run([inputs, cid], options=run_options(10_000))
            assert batch.shape == (1,)
            sess.run(close)
            assert isinstance(caller.error(), tf.errors.CancelledError)
            with pytest.raises(tf.errors.CancelledError):
                sess.run(set_outputs, {cid: computation_id, inputs: batch})


def test_minimum_and_maximum_batch_size(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=2, maximum_batch_size=3, timeout_ms=-1)
        value = tf.compat.v1.placeholder(tf.int32, [1])
        compute = ops.batcher_compute(handle, [value], Tout=[tf.int32])
        (inputs,), cid = ops.batcher_get_inputs(handle, Tin=[tf.int32])
        set_outputs = ops.batcher_set_outputs(handle, cid, [inputs * 10])
        stats = ops.batcher_stats(handle)
        with tf.compat.v1.Session() as sess:
            callers = [Call(sess.run, compute, {value: [0]})]
            wait_for(lambda: sess.run(stats)[0] == 1, what="one caller")
            # One input is below the minimum: no batch, even after a while.
            with pytest.raises(tf.errors.DeadlineExceededError):
                sess.run(inputs, options=run_options(300))
            for i in range(1, 5):  # one at a time, so arrival order is known
                callers.append(Call(sess.run, compute, {value: [i]}))
                wait_for(lambda i=i: sess.run(stats)[0] == i + 1, what=f"caller {i}")
            first, id1 = sess.run([inputs, cid], options=run_options(10_000))
            second, id2 = sess.run([inputs, cid], options=run_options(10_000))
            assert first.tolist() == [0, 1, 2]  # the maximum, oldest first
            assert second.tolist() == [3, 4]  # the rest reach the minimum
            assert id1 != id2
            sess.run(set_outputs, {inputs: first, cid: id1})
            sess.run(set_outputs, {inputs: second, cid: id2})
            results = [c.result()[0].tolist() for c in callers]
            assert results == [[0], [10], [20], [30], [40]]


def test_timeout_forms_partial_batch(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=4, maximum_batch_size=8, timeout_ms=300)
        compute = ops.batcher_compute(handle, [tf.ones([1, 2])], Tout=[tf.float32])
        (inputs,), cid = ops.batcher_get_inputs(handle, Tin=[tf.float32])
        stats = ops.batcher_stats(handle)
        close = ops.batcher_close(handle)
        with tf.compat.v1.Session() as sess:
            sess.run(handle)
            start = time.monotonic()
            caller = Call(sess.run, compute)
            wait_for(lambda: sess.run(stats)[0] == 1, what="caller")
            batch, _ = sess.run([inputs, cid], options=run_options(10_000))
            elapsed = time.monotonic() - start
            assert batch.shape == (1, 2)
            # Not before the batcher's wait for more callers (a slower
            # machine only adds to it; no upper bound asserted).
            assert elapsed >= 0.25, elapsed
            sess.run(close)
            assert isinstance(caller.error(), tf.errors.CancelledError)


def test_out_of_order_set_outputs(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=1, maximum_batch_size=1, timeout_ms=-1)
        value = tf.compat.v1.placeholder(tf.float32, [1, 2])
        compute = ops.batcher_compute(handle, [value], Tout=[tf.float32, tf.string])
        (inputs,), cid = ops.batcher_get_inputs(handle, Tin=[tf.float32])
        label = tf.strings.as_string(tf.reduce_sum(inputs, axis=1))
        set_outputs = ops.batcher_set_outputs(handle, cid, [inputs + 1, label])
        stats = ops.batcher_stats(handle)
        with tf.compat.v1.Session() as sess:
            a = Call(sess.run, compute, {value: [[1, 2]]})
            wait_for(lambda: sess.run(stats)[0] == 1, what="caller a")
            batch_a, id_a = sess.run([inputs, cid], options=run_options(10_000))
            b = Call(sess.run, compute, {value: [[3, 4]]})
            batch_b, id_b = sess.run([inputs, cid], options=run_options(10_000))
            assert sess.run(stats).tolist() == [0, 0, 2]
            sess.run(set_outputs, {inputs: batch_b, cid: id_b})
            out_b, label_b = b.result()
            assert out_b.tolist() == [[4, 5]] and label_b.tolist() == [b"7.000000"]
            assert not a.done()
            sess.run(set_outputs, {inputs: batch_a, cid: id_a})
            assert a.result()[0].tolist() == [[2, 3]]


def test_invalid_computation_id(ops):
    with tf.Graph().as_default():
        handle = ops.batcher()
        set_outputs = ops.batcher_set_outputs(
            handle, tf.constant(12345, tf.int64), [tf.zeros([1])]
        )
        with tf.compat.v1.Session() as sess:
            with pytest.raises(
                tf.errors.InvalidArgumentError, match="unknown computation_id 12345"
            ):
                sess.run(set_outputs)


def test_wrong_output_size_fails_every_caller(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=2, maximum_batch_size=2, timeout_ms=-1)
        compute = ops.batcher_compute(handle, [tf.ones([1])], Tout=[tf.float32])
        (inputs,), cid = ops.batcher_get_inputs(handle, Tin=[tf.float32])
        set_outputs = ops.batcher_set_outputs(handle, cid, [inputs[:1]])
        with tf.compat.v1.Session() as sess:
            callers = [Call(sess.run, compute) for _ in range(2)]
            with pytest.raises(tf.errors.InvalidArgumentError, match="batch size 2"):
                sess.run(set_outputs, options=run_options(10_000))
            for c in callers:
                assert isinstance(c.error(), tf.errors.InvalidArgumentError)


def test_shape_functions(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=2, maximum_batch_size=4, timeout_ms=5)
        assert handle.shape.as_list() == []
        assert handle.dtype == tf.resource
        with pytest.raises(ValueError, match="leading .batch. dimension 1"):
            ops.batcher_compute(handle, [tf.zeros([2, 3])], Tout=[tf.float32])
        with pytest.raises(ValueError, match="leading .batch. dimension 1"):
            ops.batcher_compute(handle, [tf.zeros([])], Tout=[tf.float32])
        out = ops.batcher_compute(
            handle, [tf.zeros([1, 3])], Tout=[tf.float32, tf.int32]
        )
        assert [t.shape.rank for t in out] == [None, None]

        inputs, cid = ops.batcher_get_inputs(handle, Tin=[tf.float32, tf.int32])
        assert [t.shape.rank for t in inputs] == [None, None]
        assert cid.shape.as_list() == [] and cid.dtype == tf.int64
        inputs, _ = ops.batcher_get_inputs(
            handle, Tin=[tf.float32, tf.int32], element_shapes=[[3, None], []]
        )
        assert [t.shape.as_list() for t in inputs] == [[None, 3, None], [None]]
        inputs, _ = ops.batcher_get_inputs(
            handle, Tin=[tf.float32], element_shapes=[[5]], batch_size=8
        )
        assert inputs[0].shape.as_list() == [8, 5]
        with pytest.raises(ValueError, match="element_shapes"):
            ops.batcher_get_inputs(handle, Tin=[tf.float32], element_shapes=[[5], [6]])

        with pytest.raises(ValueError, match="leading batch"):
            ops.batcher_set_outputs(handle, cid, [tf.zeros([])])
        with pytest.raises(ValueError):
            ops.batcher_set_outputs(handle, tf.zeros([2], tf.int64), [tf.zeros([2])])
        assert ops.batcher_stats(handle).shape.as_list() == [3]
        assert ops.batcher_close(handle).outputs == []


def test_static_batch_size_must_match_batcher_options(ops):
    with tf.Graph().as_default():
        handle = ops.batcher(minimum_batch_size=2, maximum_batch_size=4, timeout_ms=-1)
        inputs, _ = ops.batcher_get_inputs(handle, Tin=[tf.float32], batch_size=2)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(
                tf.errors.InvalidArgumentError, match="static batch_size"
            ):
                sess.run(inputs, options=run_options(10_000))


def test_invalid_options():
    with pytest.raises(ValueError, match="minimum_batch_size=0"):
        dynamic_batching.batch_fn_with_options(minimum_batch_size=0)
    with pytest.raises(ValueError, match="maximum_batch_size=2 is smaller"):
        dynamic_batching.batch_fn_with_options(
            minimum_batch_size=3, maximum_batch_size=2
        )
    with pytest.raises(ValueError, match="timeout_ms"):
        dynamic_batching.batch_fn_with_options(timeout_ms=0.5)


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _num_threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def test_repeated_create_and_close_leaks_nothing(ops):
    def live_batchers():
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            return int(sess.run(ops.batcher_live_count()))

    def once():
        with Session() as s:
            # minimum > 1 with a timeout: this batcher owns a timer thread.
            @dynamic_batching.batch_fn_with_options(minimum_batch_size=2, timeout_ms=1)
            def f(x):
                return x + 1

            out = f(tf.zeros([1, 64]))
            sess = s.start()
            assert sess.run(out, options=run_options(10_000)).shape == (1, 64)
            assert live_batchers() >= 1

    baseline = live_batchers()
    for _ in range(5):  # warm up TensorFlow's caches
        once()
    threads_before, rss_before = _num_threads(), _rss_kib()
    for _ in range(40):
        once()
    assert live_batchers() == baseline
    # Session threads exit asynchronously; allow them a moment.
    wait_for(
        lambda: _num_threads() <= threads_before + 2, timeout=10, what="threads to exit"
    )
    growth_mib = (_rss_kib() - rss_before) / 1024
    assert growth_mib < 40, f"RSS grew {growth_mib:.1f} MiB over 40 create/close cycles"


# ---------------------------------------------------------------------------
# Building.


def test_is_available_and_library_cached(tmp_path):
    assert dynamic_batching.is_available()
    assert dynamic_batching.unavailable_reason() is None
    path, built = dynamic_batching.build_library()
    assert not built and os.path.isfile(path)
    assert os.path.basename(path).startswith(f"batcher-tf{tf.__version__}-")


def test_prebuild_command_prints_cached_library_path():
    # `python3 dynamic_batching.py` is the Dockerfile's prebuild step.
    expected, _ = dynamic_batching.build_library()  # cached from here on
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "dynamic_batching.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
    assert "dynamic_batching: cached" in result.stderr


# A tiny source keeps the cache and lock tests fast; the real batcher.cc is
# compiled once per machine by the `ops` fixture.
TINY_SOURCE = 'extern "C" int scalable_agent_tiny() { return 42; }\n'

# Counts real compiler runs (not `--version`) and is slow enough that
# concurrent builders overlap and must meet at the lock.
SLOW_CXX = """#!/bin/sh
case "$1" in --version) exec g++ "$@";; esac
echo run >> "$COUNT_FILE"
sleep 1
exec g++ "$@"
"""

BUILD_SNIPPET = """
import sys, dynamic_batching
path, built = dynamic_batching.build_library(sys.argv[1], sys.argv[2])
print(path, built)
"""


@pytest.mark.slow
def test_concurrent_builds_compile_once_then_cache(tmp_path, monkeypatch):
    source = tmp_path / "tiny.cc"
    source.write_text(TINY_SOURCE)
    cxx = tmp_path / "slow-cxx"
    cxx.write_text(SLOW_CXX)
    cxx.chmod(0o755)
    count = tmp_path / "count"
    cache = tmp_path / "cache"
    env = dict(
        os.environ,
        CXX=str(cxx),
        COUNT_FILE=str(count),
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=REPO_ROOT,
    )

    def build():
        return subprocess.Popen(
            [sys.executable, "-c", BUILD_SNIPPET, str(source), str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    procs = [build() for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    results = [out.split() for out, _ in outputs]
    assert len({path for path, _ in results}) == 1
    assert sorted(built for _, built in results) == ["False", "True"]
    assert count.read_text().count("run") == 1
    path = results[0][0]
    assert os.path.dirname(path) == str(cache)
    assert sorted(os.listdir(cache)) == sorted(
        [os.path.basename(path), os.path.basename(path) + ".lock"]
    )
    # A later load uses the cache: no compiler run, same file.
    mtime = os.stat(path).st_mtime_ns
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("COUNT_FILE", str(count))
    assert dynamic_batching.build_library(str(source), str(cache)) == (path, False)
    assert count.read_text().count("run") == 1
    assert os.stat(path).st_mtime_ns == mtime


def test_cache_key_changes_with_source(tmp_path):
    source = tmp_path / "tiny.cc"
    source.write_text(TINY_SOURCE)
    first, built = dynamic_batching.build_library(str(source), str(tmp_path))
    assert built
    source.write_text(TINY_SOURCE + "// edited\n")
    second, built = dynamic_batching.build_library(str(source), str(tmp_path))
    assert built and second != first


def test_broken_source_raises_build_error_with_compiler_output(tmp_path):
    # A copy of batcher.cc broken at the top: a missing header stops g++ at
    # once, so the test does not pay for parsing TensorFlow's headers.
    broken = tmp_path / "batcher.cc"
    with open(dynamic_batching.SOURCE_PATH) as f:
        code = f.read()
    broken.write_text('#include "deliberately_missing_header.h"\n' + code)
    cache = tmp_path / "cache"
    with pytest.raises(dynamic_batching.BatcherBuildError) as info:
        dynamic_batching.build_library(str(broken), str(cache))
    error = info.value
    assert error.command[0] and str(broken) in error.command
    assert "deliberately_missing_header.h" in error.stderr and "error" in error.stderr
    assert "deliberately_missing_header.h" in str(error) and " ".join(
        error.command
    ) in str(error)
    assert not [f for f in os.listdir(cache) if f.endswith(".so") or ".tmp." in f]


def test_missing_source_raises_build_error(tmp_path):
    with pytest.raises(dynamic_batching.BatcherBuildError, match="Cannot read"):
        dynamic_batching.build_library(str(tmp_path / "absent.cc"), str(tmp_path))


def test_build_failure_makes_is_available_false(tmp_path, monkeypatch):
    # A fresh module state whose build fails, as on a machine without g++.
    monkeypatch.setattr(dynamic_batching, "_library", None)
    monkeypatch.setattr(dynamic_batching, "_load_error", None)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("SCALABLE_AGENT_CACHE", str(tmp_path / "cache"))
    assert dynamic_batching.is_available() is False
    assert "compiler" in dynamic_batching.unavailable_reason()
    with pytest.raises(dynamic_batching.BatcherBuildError):
        dynamic_batching.load_library()
