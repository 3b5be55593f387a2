"""Small classes for tests/py_process_test.py and benchmarks/components/py_process_bench.py.

They live in their own module because py_process children start a fresh interpreter
and import the class by its module name; the test module itself imports TensorFlow
at the top, which would make every child slow. These classes import TensorFlow only
inside `_tensor_specs`, which runs in the parent.

These are fake environments on purpose: they make a child raise, hang, crash or
report its own state on demand, which a real ALE game cannot do.
"""

import collections
import ctypes
import os
import signal
import sys
import time

import numpy as np

Pair = collections.namedtuple("Pair", "total frame")


class Calculator:
    """Keeps a running total; methods cover each kind of argument and output."""

    def __init__(self, start=0, *, scale=1, close_marker=None):
        self._total = start
        self._scale = scale
        self._close_marker = close_marker

    def add(self, x):
        self._total += self._scale * int(x)
        return self._total

    def combine(self, a, b, mode=b"sum"):
        if mode == b"sum":
            return a + b
        if mode == b"product":
            return a * b
        raise ValueError(f"unknown mode {mode!r}")

    def nested(self, x):
        frame = np.full([2, 3], int(x), dtype=np.uint8)
        return {"pair": Pair(total=self._total, frame=frame), "name": "calc"}

    def noop(self):
        return None

    def info(self):
        # (child pid, whether TensorFlow is imported in the child)
        return os.getpid(), "tensorflow" in sys.modules

    def fail(self, message):
        raise ValueError(message.decode())

    def sleep(self, seconds):
        time.sleep(float(seconds))
        return self._total

    def crash(self):
        ctypes.string_at(0)  # Reads address 0: SIGSEGV, as a buggy C library would.

    def exit_code(self, code):
        os._exit(int(code))

    def wrong_shape(self):
        return np.zeros([3], np.int64)

    def wrong_dtype(self):
        return 1.5

    def close(self):
        if self._close_marker:
            with open(self._close_marker, "w") as f:
                f.write(str(os.getpid()))

    @staticmethod
    def _tensor_specs(method_name, kwargs, constructor_kwargs):
        import tensorflow as tf

        scalar = tf.TensorSpec([], tf.int64)
        if method_name in ("add", "sleep", "combine", "wrong_shape", "wrong_dtype"):
            return scalar
        if method_name == "nested":
            frame = tf.TensorSpec([2, 3], tf.uint8)
            return {
                "pair": Pair(total=scalar, frame=frame),
                "name": tf.TensorSpec([], tf.string),
            }
        if method_name == "info":
            return (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.bool))
        if method_name == "crash":
            return scalar
        return None  # noop, fail, exit_code


class FailingConstructor:
    """A constructor that raises, like an environment given a bad level name."""

    def __init__(self, level):
        raise ValueError(f"unknown level {level!r}")

    @staticmethod
    def _tensor_specs(method_name, kwargs, constructor_kwargs):
        return None


class StubbornClose:
    """close() never returns, so PyProcess.close() must escalate to signals."""

    def __init__(self):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Forces the SIGKILL step.

    def close(self):
        time.sleep(3600)

    @staticmethod
    def _tensor_specs(method_name, kwargs, constructor_kwargs):
        return None


class Frames:
    """For the benchmark: a no-op and an Atari-sized observation."""

    def __init__(self):
        self._frame = np.zeros([84, 84, 4], np.uint8)
        self._count = 0

    def noop(self):
        return 0

    def frame(self):
        self._count += 1  # New content each call, as an environment would give.
        self._frame[0, 0, 0] = self._count % 256
        return self._frame

    @staticmethod
    def _tensor_specs(method_name, kwargs, constructor_kwargs):
        import tensorflow as tf

        if method_name == "noop":
            return tf.TensorSpec([], tf.int32)
        return tf.TensorSpec([84, 84, 4], tf.uint8)


class ScriptedEnvironment:
    """An environment of the project's contract (families/contract.py) whose
    failures are scripted: it raises, hangs, or fails to construct at a
    given step, and marks its close() in a file. For families/vector.py's
    failure tests: a real game does none of this on demand.

    Observations are [2, 2, 1] frames filled with `seed + step`; reward is
    the action taken; every 5th step ends an episode.
    """

    def __init__(
        self,
        seed,
        fail_at_step=None,
        hang_at_step=None,
        fail_in_constructor=False,
        close_marker=None,
    ):
        if fail_in_constructor:
            raise ValueError(f"environment {seed} cannot start")
        self._seed = seed
        self._step = 0
        self._fail_at_step = fail_at_step
        self._hang_at_step = hang_at_step
        self._close_marker = close_marker

    def _observation(self):
        frame = np.full([2, 2, 1], (self._seed + self._step) % 256, np.uint8)
        return frame, f"env {self._seed}"

    def initial(self):
        return self._observation()

    def step(self, action):
        self._step += 1
        if self._step == self._fail_at_step:
            raise ValueError(f"environment {self._seed} broke at step {self._step}")
        if self._step == self._hang_at_step:
            time.sleep(3600)
        done = self._step % 5 == 0
        return np.float32(action), np.bool_(done), self._observation()

    def close(self):
        if self._close_marker:
            with open(self._close_marker, "a") as f:
                f.write(f"{self._seed}\n")

    @staticmethod
    def _tensor_specs(method_name, kwargs, constructor_kwargs):
        from families.contract import environment_tensor_specs

        return environment_tensor_specs(method_name, [2, 2, 1])


class StartsAProgram:
    """Starts a long `sleep` the way an environment library may start its
    engine (no close_fds); `program()` returns its pid."""

    def __init__(self):
        import subprocess

        self._program = subprocess.Popen(["sleep", "600"], close_fds=False)

    def program(self) -> int:
        return self._program.pid

    def close(self) -> None:
        self._program.kill()
        self._program.wait()


class SlowToStart:
    """Its constructor waits until the file `go` exists (so that a test can
    kill the child while it is constructing, whenever it likes), then works
    like a small environment: `ping()` returns its pid."""

    def __init__(self, go: str, started: str):
        with open(started, "a") as f:
            f.write(f"{os.getpid()}\n")
        while not os.path.exists(go):
            time.sleep(0.01)

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass
