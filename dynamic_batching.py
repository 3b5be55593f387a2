"""Dynamic batching: run many single-example calls of a function as one batch.

Actor threads each call the agent network on one example ([1, ...]); IMPALA
batches those calls into one forward pass for throughput. Decorate the
function with `batch_fn` (or `batch_fn_with_options`) and call it as before:

    @dynamic_batching.batch_fn
    def f(a, b):          # a: [B, ...], b: [B, ...]  (batched, B varies)
        return a + b      # every output: [B, ...]

    out = f(x, y)         # x, y: [1, ...]; out: [1, ...]

Arguments and results are nests (tf.nest) of tensors whose leading dimension
is 1 for the caller and B inside `f`. A QueueRunner (in the graph's
QUEUE_RUNNERS collection) runs `f` on each batch, so the session must start
queue runners (MonitoredTrainingSession does; with a plain Session call
tf.compat.v1.train.start_queue_runners). Everything is graph mode: build
inside `with tf.Graph().as_default():`.

The ops come from batcher.cc, compiled on first use into a cache directory
($SCALABLE_AGENT_CACHE, default ~/.cache/scalable_agent), keyed by the
TensorFlow version and a hash of the source and compiler flags. Prebuild with
`python3 dynamic_batching.py` (prints the .so path).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

__all__ = [
    "BatcherBuildError",
    "batch_fn",
    "batch_fn_with_options",
    "build_library",
    "cache_dir",
    "is_available",
    "load_library",
    "unavailable_reason",
]

SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batcher.cc")

# Quiet flags: TensorFlow's headers trigger ~135 deprecation warnings.
_QUIET_OPTIONS = ["-Wno-deprecated-declarations", "-Wno-interference-size"]
_BASE_OPTIONS = ["-std=c++17", "-shared", "-fPIC", "-O2"]
_COMPILE_TIMEOUT_S = 900


class BatcherBuildError(RuntimeError):
    """batcher.cc could not be compiled or loaded.

    Attributes:
      command: the compiler command (list of str), or None.
      stderr: the compiler's (or loader's) output.
    """

    def __init__(
        self, message: str, command: list[str] | None = None, stderr: str = ""
    ):
        self.command = command
        self.stderr = stderr
        text = message
        if command:
            text += "\nCommand: " + " ".join(command)
        if stderr:
            text += "\nOutput:\n" + stderr.strip()
        super().__init__(text)


def cache_dir() -> str:
    """Directory holding compiled batcher libraries."""
    return os.environ.get("SCALABLE_AGENT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "scalable_agent"
    )


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""  # the build itself reports a missing compiler


def build_library(
    source: str = SOURCE_PATH, cache: str | None = None
) -> tuple[str, bool]:
    """Compiles `source` into the cache unless it is there already.

    Concurrent callers (threads or processes) build once: a file lock
    serialises them and the result is renamed into place atomically.

    Args:
      source: path of the C++ source.
      cache: cache directory; default `cache_dir()`.

    Returns:
      (path of the shared library, True if this call compiled it).

    Raises:
      BatcherBuildError: the source is missing or the compiler failed; carries
        the command and the compiler's output.
    """
    cache = cache or cache_dir()
    cxx = _compiler()
    try:
        with open(source, "rb") as f:
            code = f.read()
    except OSError as e:
        raise BatcherBuildError(
            f"Cannot read the batcher source {source!r}: {e}"
        ) from e
    flags = (
        _BASE_OPTIONS
        + _QUIET_OPTIONS
        + list(tf.sysconfig.get_compile_flags())
        + list(tf.sysconfig.get_link_flags())
    )
    key = hashlib.sha256()
    for part in (
        code,
        tf.__version__.encode(),
        cxx.encode(),
        _compiler_version(cxx).encode(),
    ):
        key.update(part)
        key.update(b"\0")
    key.update("\0".join(flags).encode())
    name = f"batcher-tf{tf.__version__}-{key.hexdigest()[:16]}.so"
    path = os.path.join(cache, name)
    if os.path.exists(path):
        return path, False

    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        raise BatcherBuildError(
            f"Cannot create the cache directory {cache!r}: {e}"
        ) from e
    try:
        lock_file = open(path + ".lock", "w")  # closed by the `with` below
    except OSError as e:
        raise BatcherBuildError(
            f"Cannot write to the cache directory {cache!r} ({e}); set "
            "SCALABLE_AGENT_CACHE to a writable directory."
        ) from e
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes
        if os.path.exists(path):  # another process built it while we waited
            return path, False
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
        # Sources before libraries: the linker resolves -l flags left to right.
        command = (
            [cxx]
            + _BASE_OPTIONS
            + _QUIET_OPTIONS
            + [source, "-o", tmp]
            + list(tf.sysconfig.get_compile_flags())
            + list(tf.sysconfig.get_link_flags())
        )
        logging.info("Compiling the dynamic batching ops (once): %s", " ".join(command))
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError) as e:
            _remove_quietly(tmp)
            raise BatcherBuildError(
                f"Could not run the C++ compiler ({e}). Install g++ (or set CXX).",
                command,
            ) from e
        if result.returncode != 0:
            _remove_quietly(tmp)
            raise BatcherBuildError(
                f"Compiling {source} failed with exit code {result.returncode}.",
                command,
                result.stderr + result.stdout,
            )
        os.replace(tmp, path)  # atomic: readers never see a partial file
    return path, True


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


_load_lock = threading.Lock()
_library: Any = None
_load_error: BatcherBuildError | None = None


def load_library() -> Any:
    """Builds (if needed) and loads the batcher ops; returns the op module.

    Raises:
      BatcherBuildError: building or loading failed (the same error is raised
        again on later calls in this process).
    """
    global _library, _load_error
    with _load_lock:
        if _library is not None:
            return _library
        if _load_error is not None:
            raise _load_error
        try:
            path, _ = build_library()
            try:
                _library = tf.load_op_library(path)
            except (tf.errors.OpError, OSError) as e:
                raise BatcherBuildError(
                    f"Loading {path} failed; delete it to force a rebuild.",
                    stderr=str(e),
                ) from e
        except BatcherBuildError as e:
            _load_error = e
            raise
        return _library


def is_available() -> bool:
    """True if the batcher ops build and load. Never raises."""
    try:
        load_library()
        return True
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return False


def unavailable_reason() -> str | None:
    """Why the ops are unavailable (the build error), or None if they load."""
    try:
        load_library()
        return None
    except Exception as e:  # noqa: BLE001
        return str(e)


class _BatcherRunner(tf.compat.v1.train.QueueRunner):
    """A QueueRunner whose "enqueue op" runs get_inputs -> f -> set_outputs.

    Unlike a plain QueueRunner it keeps serving after an error inside the
    batched function: that error has already failed the callers of that one
    batch, and the next batch may be fine. It stops when the batcher is
    closed (Cancelled) and closes the batcher when it stops for any other
    reason, so callers never wait for a thread that is gone.
    """

    def _run(self, sess, enqueue_op, coord=None):
        try:
            run_once = sess.make_callable(enqueue_op)
            while not (coord and coord.should_stop()):
                try:
                    run_once()
                except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
                    break  # batcher closed or session closing
                except tf.errors.OpError as e:
                    logging.error(
                        "Dynamic batching: the batched function %s failed; its "
                        "callers got an error, serving continues: %s",
                        self.name,
                        e,
                    )
        except Exception as e:  # noqa: BLE001 - reported like QueueRunner does
            if coord:
                coord.request_stop(e)
            else:
                logging.error("Exception in dynamic batching runner: %s", e)
                with self._lock:
                    self._exceptions_raised.append(e)
        finally:
            with self._lock:
                self._runs_per_session[sess] -= 1
            try:
                sess.run(self._close_op)
            except Exception as e:  # noqa: BLE001 - session may be gone
                logging.vlog(1, "Ignored exception closing the batcher: %s", e)


class _Built:
    """The batched computation built for one graph and input signature."""

    def __init__(self, handle, out_structure, out_dtypes, out_shapes):
        self.handle = handle
        self.out_structure = out_structure
        self.out_dtypes = out_dtypes
        self.out_shapes = out_shapes


class _BatchedFunction:
    def __init__(self, f, minimum_batch_size, maximum_batch_size, timeout_ms):
        self._f = f
        self._minimum = minimum_batch_size
        self._maximum = maximum_batch_size
        self._timeout = timeout_ms
        self._lock = threading.Lock()
        # graph -> {signature: _Built}; weak so dead graphs are dropped.
        self._built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, *args, **kwargs):
        if tf.executing_eagerly():
            raise RuntimeError(
                "batch_fn works in graph mode only: build the graph inside "
                "`with tf.Graph().as_default():`."
            )
        structure = (args, kwargs)
        flat = [tf.convert_to_tensor(x) for x in tf.nest.flatten(structure)]
        if not flat:
            raise ValueError(
                f"batch_fn({_name(self._f)}): call it with at least one tensor "
                "argument; the batch is formed from the arguments."
            )
        for i, t in enumerate(flat):
            rank = t.shape.rank
            if rank == 0 or (rank is not None and t.shape[0] not in (None, 1)):
                raise ValueError(
                    f"batch_fn({_name(self._f)}): argument leaf {i} ({t.name}) has "
                    f"shape {t.shape}; every argument needs leading (batch) "
                    "dimension 1. Add one with tf.expand_dims(x, 0)."
                )
        signature = (
            repr(tf.nest.map_structure(lambda _: None, structure)),
            tuple(
                (
                    t.dtype,
                    tuple(t.shape.as_list()) if t.shape.rank is not None else None,
                )
                for t in flat
            ),
        )
        with tf.init_scope():
            outer_graph = tf.compat.v1.get_default_graph()
        with self._lock:
            per_graph = self._built.setdefault(outer_graph, {})
            built = per_graph.get(signature)
            if built is None:
                built = self._build(structure, flat)
                per_graph[signature] = built
        with tf.device("/device:CPU:0"):
            outputs = load_library().batcher_compute(
                built.handle, flat, Tout=built.out_dtypes
            )
        for t, shape in zip(outputs, built.out_shapes, strict=True):
            t.set_shape(shape)
        return tf.nest.pack_sequence_as(built.out_structure, outputs)

    def _build(self, structure, flat) -> _Built:
        ops = load_library()
        static = self._minimum == self._maximum and self._timeout is None
        batch_size = self._minimum if static else -1
        # Lift out of any while-loop body / function graph and drop control
        # dependencies: the batched computation runs once per batch on the
        # runner thread, not as part of the caller's step.
        with tf.init_scope():
            graph = tf.compat.v1.get_default_graph()
            with graph.name_scope(None), graph.name_scope(f"batched_{_name(self._f)}"):
                # The batcher ops have CPU kernels only; f keeps the caller's
                # device scope. (A partial spec merges with an outer job/task.)
                with tf.device("/device:CPU:0"):
                    handle = ops.batcher(
                        minimum_batch_size=self._minimum,
                        maximum_batch_size=self._maximum,
                        timeout_ms=-1 if self._timeout is None else self._timeout,
                    )
                    batched, computation_id = ops.batcher_get_inputs(
                        handle,
                        Tin=[t.dtype for t in flat],
                        element_shapes=[t.shape[1:] for t in flat],
                        batch_size=batch_size,
                        # The runner's step runs f and set_outputs too; if it
                        # ends without set_outputs (f failed), fail the callers.
                        same_step_outputs=True,
                    )
                args, kwargs = tf.nest.pack_sequence_as(structure, batched)
                result = self._f(*args, **kwargs)
                flat_out = [tf.convert_to_tensor(x) for x in tf.nest.flatten(result)]
                if not flat_out:
                    raise ValueError(
                        f"batch_fn({_name(self._f)}): the function returned no "
                        "tensors; return at least one [batch, ...] tensor."
                    )
                for i, t in enumerate(flat_out):
                    if t.shape.rank == 0 or (
                        static
                        and t.shape.rank is not None
                        and t.shape[0] not in (None, batch_size)
                    ):
                        raise ValueError(
                            f"batch_fn({_name(self._f)}): output leaf {i} ({t.name}) "
                            f"has shape {t.shape}; every output needs the batch "
                            "dimension of the inputs first."
                        )
                with tf.device("/device:CPU:0"):
                    set_outputs = ops.batcher_set_outputs(
                        handle, computation_id, flat_out
                    )
                    close = ops.batcher_close(handle)
                runner = _BatcherRunner(
                    queue=handle.op,  # QueueRunner only uses its .name
                    enqueue_ops=[set_outputs],
                    close_op=close,
                    cancel_op=close,
                    queue_closed_exception_types=(
                        tf.errors.OutOfRangeError,
                        tf.errors.CancelledError,
                    ),
                )
                # Same as tf.compat.v1.train.add_queue_runner, minus its
                # deprecation notice.
                graph.add_to_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS, runner)
        out_shapes = [
            tf.TensorShape([1]).concatenate(t.shape[1:])
            if t.shape.rank is not None
            else tf.TensorShape(None)
            for t in flat_out
        ]
        return _Built(handle, result, [t.dtype for t in flat_out], out_shapes)


def _name(f) -> str:
    return getattr(f, "__name__", type(f).__name__)


def batch_fn_with_options(
    minimum_batch_size: int = 1,
    maximum_batch_size: int = 1024,
    timeout_ms: int | None = 100,
) -> Callable[[Callable], Callable]:
    """Decorator factory for dynamically batched functions.

    Args:
      minimum_batch_size: a batch waits for this many calls...
      maximum_batch_size: ...and never takes more than this many.
      timeout_ms: ...unless the oldest waiting call has waited this long, in
        which case the calls waiting so far form a batch. None (or negative)
        waits for minimum_batch_size calls indefinitely. With
        minimum == maximum and timeout_ms=None the batch dimension inside the
        function is static.

    Returns:
      A decorator. The decorated function takes and returns nests of tensors
      with leading dimension 1; the function itself sees leading dimension B.
    """
    for name, value in (
        ("minimum_batch_size", minimum_batch_size),
        ("maximum_batch_size", maximum_batch_size),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}: pass an int >= 1.")
    if maximum_batch_size < minimum_batch_size:
        raise ValueError(
            f"maximum_batch_size={maximum_batch_size} is smaller than "
            f"minimum_batch_size={minimum_batch_size}; make maximum >= minimum."
        )
    if timeout_ms is not None and (
        not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool)
    ):
        raise ValueError(f"timeout_ms={timeout_ms!r}: pass an int (ms) or None.")
    if timeout_ms is not None and timeout_ms < 0:
        timeout_ms = None

    def decorator(f: Callable) -> Callable:
        batched = _BatchedFunction(
            f, minimum_batch_size, maximum_batch_size, timeout_ms
        )

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return batched(*args, **kwargs)

        return wrapper

    return decorator


def batch_fn(f: Callable) -> Callable:
    """`batch_fn_with_options()` with the defaults (1, 1024, 100 ms)."""
    return batch_fn_with_options()(f)


def _main() -> int:
    try:
        path, built = build_library()
        load_library()
    except BatcherBuildError as e:
        print(f"dynamic_batching: build failed: {e}", file=sys.stderr)
        return 1
    print(f"dynamic_batching: {'compiled' if built else 'cached'}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
