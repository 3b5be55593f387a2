"""Python objects living in child processes, called from TensorFlow graphs as ops.

Environments (ALE, DeepMind Lab) are stateful C libraries that hold the GIL while
they step and may crash. Each `PyProcess` runs one object of a user class in its own
child process; `process.proxy.method(*tensors)` builds a `py_func` op that sends the
call to the child over a pipe and returns its result as tensors:

    env = PyProcess(AtariEnv, 'pong', seed=1)       # registers in a graph collection
    observation = env.proxy.initial()                # nest of tf.Tensor
    reward, done, observation = env.proxy.step(action)
    with tf.compat.v1.train.MonitoredSession(hooks=[PyProcessHook()]) as session:
        ...                                          # children started in begin()

The op's dtypes and static shapes come from the class's static method
`_tensor_specs(method_name, kwargs, constructor_kwargs)`, which returns a nest of
`tf.TensorSpec` (or None: the proxy then returns a `tf.Operation`). `kwargs` maps the
method's parameter names to the tensors (or Python values) passed to the proxy.

Failure behaviour (what the rest of the code base may rely on):
  * A call never hangs on a dead child: every wait on the pipe is a poll with a
    timeout followed by a liveness check, and the pipe reports EOF as soon as the
    child exits. The call raises `PyProcessDiedError`, e.g.
    "PyProcess AtariEnv (pid 123) died: killed by signal SIGKILL (while running
    step())"; inside `session.run` this surfaces as a `tf.errors.UnknownError` whose
    message contains that text. Later calls raise the same kind of error at once.
  * An exception raised by a method in the child is sent back (type name, message,
    child traceback) and re-raised as `PyProcessRemoteError`. The object's state is
    undefined after a failed method (an environment may be half-way through a step),
    so the child then shuts itself down cleanly (calls the object's close(), exits
    with code 0) and later calls fail with an error that repeats the cause. Other
    processes are not affected. `restart()` brings up a fresh child.
  * An exception in the constructor surfaces from `start()` (and so from
    `PyProcessHook.begin()`, i.e. from session creation) as `PyProcessRemoteError`
    with the original type name, message and traceback.
  * A child that does not answer a call within `PyProcess.call_timeout_s`
    seconds (None, the default: no limit) is taken for hung (an environment
    stuck in a loop, a stopped process): it is SIGKILLed and the call raises
    `PyProcessError` ("... was killed after no answer for 60 s by the parent
    while running step()").
  * `alive` is False after any of these; `restart()` kills the old child (if
    running) and starts a fresh one with the same constructor arguments; ops built
    before keep working because they look up the current child at call time.

Shutdown: `close()` asks the child to call the object's close() and exit, waits,
then escalates to SIGTERM and SIGKILL, and always reaps the child (no zombies).
Children ignore SIGINT, so Ctrl-C reaches only the parent, whose atexit hook closes
every child still open. If the parent dies without cleaning up (SIGKILL, an
unhandled SIGTERM, a crash), the kernel kills the children (PR_SET_PDEATHSIG on
Linux); children also exit when their pipe reports EOF.

Also here: `start_all(processes)` / `close_all(processes)` (parallel start and
close, used by PyProcessHook), `PyProcess.pid` (current or last child),
`PyProcess.name` (the class name used in messages) and `PyProcess.last_error`
(the PyProcessError of the last failed call, which inside `session.run`
reaches the caller only as the text of a `tf.errors` error).

Calls on one process are serialised (a lock around the pipe), so any number of
TensorFlow threads may run its ops; different processes run in parallel. Results
travel pickled over a socketpair: pickling a frame adds little to a session.run
of the op (BENCHMARKS.md, "py_process benchmark"), so no shared memory.

This module must not import TensorFlow at import time: child processes import it
(directly, and through environment modules that build PyProcesses) and should start
in a fraction of a second without TensorFlow's 2.4 s import and its memory. Every
TensorFlow use is a local import in code that runs only in the parent.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from concurrent import futures
from multiprocessing import connection as mp_connection
from typing import Any

import numpy as np

__all__ = [
    "PyProcess",
    "PyProcessDiedError",
    "PyProcessError",
    "PyProcessHook",  # noqa: F822 - created on first access, see __getattr__
    "PyProcessRemoteError",
    "close_all",
    "start_all",
]

_log = logging.getLogger(__name__)

# How often a call waiting for its result checks that the child still lives. A dead
# child is normally noticed at once (its end of the pipe closes, so poll() returns
# and recv() raises EOFError); this bounds the delay when the pipe stays open, e.g.
# when the environment library forked a helper that inherited the descriptor.
_POLL_INTERVAL_S = 0.5
# close(): how long the child may take to run the object's close() and exit before
# SIGTERM, and then before SIGKILL.
_CLOSE_TIMEOUT_S = 10.0
_TERMINATE_TIMEOUT_S = 2.0
# close() while another thread is inside a call: how long to let the call finish
# before killing the child to free it.
_CLOSE_WAIT_FOR_CALL_S = 5.0
# After a child reported a method error or closed its pipe, how long to wait for it
# to exit by itself before killing it.
_EXIT_AFTER_ERROR_TIMEOUT_S = 10.0

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


class PyProcessError(RuntimeError):
    """A PyProcess could not do what was asked. Messages start with the process name."""


class PyProcessDiedError(PyProcessError):
    """The child process exited or was killed; `exitcode` is Popen's returncode."""

    def __init__(self, message: str, exitcode: int | None = None):
        super().__init__(message)
        self.exitcode = exitcode


class PyProcessRemoteError(PyProcessError):
    """The constructor or a method raised in the child.

    Attributes: `exception_type` (the class name, e.g. 'ValueError'),
    `exception_message` (str(exception)) and `child_traceback` (formatted text).
    """

    def __init__(
        self,
        message: str,
        exception_type: str,
        exception_message: str,
        child_traceback: str,
    ):
        super().__init__(message)
        self.exception_type = exception_type
        self.exception_message = exception_message
        self.child_traceback = child_traceback


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exited with code {returncode}"


# --------------------------------------------------------------------------------
# Child side. Runs in a fresh interpreter started by _Launcher; no TensorFlow.
# --------------------------------------------------------------------------------

# Start method. Plain fork is unsafe: by the time processes start, TensorFlow runs
# threads (`import tensorflow` alone leaves two native threads), and a forked copy
# of a multi-threaded process can deadlock on a lock some vanished thread held.
# Measured per child, medians (benchmarks/results/py_process.md; 2 cores shared
# with other work, load average 4-6, so a quiet machine is ~3x faster):
#   * multiprocessing 'spawn': a fresh interpreter, 0.30-0.49 s, but it re-imports
#     the parent's __main__ script in every child; for experiment.py that means
#     importing TensorFlow in every child (2.4 s on a quiet machine, 8-15 s on
#     this busy one, and ~400 MB more memory per child).
#   * multiprocessing 'forkserver': 0.30 s once the server is up, but the server
#     also imports __main__ (TensorFlow and its threads) and every child is forked
#     from it, which brings the fork hazard back; it is process-global state
#     shared with any other multiprocessing user; and the children's parent is the
#     server, so PR_SET_PDEATHSIG would watch the server, not us.
#   * chosen: subprocess (fork+exec done in C, safe next to threads) of a fresh
#     interpreter running the bootstrap below, which imports only this module and
#     the class's module: 0.45-0.49 s here (~0.12 s of interpreter start and
#     imports on a quiet machine), i.e. spawn without TensorFlow; 29 MiB resident;
#     start_all() starts 8 children in 2-4.6 s on the 2 busy cores.
# Start time is paid once per environment per run (and per restart), so the
# isolation is worth the ~0.15 s over forkserver.
#
# The bootstrap receives sys.path and the name of this module over the pipe,
# imports this module and runs _child_main.
_BOOTSTRAP = (
    "import importlib, pickle, sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:], module_name = pickle.loads(conn.recv_bytes())\n"
    "importlib.import_module(module_name)._child_main(conn, int(sys.argv[2]))\n"
)


def _die_with_parent(parent_pid: int) -> None:
    """Makes sure this child does not outlive the parent process."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            armed = libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    # The parent may have died before prctl took effect; we are then already
    # re-parented and nobody would ever send the signal.
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        # No prctl (not Linux): poll the parent id instead. This needs the GIL, so
        # unlike the kernel signal it cannot stop a child stuck in C code.
        def watch() -> None:
            while os.getppid() == parent_pid:
                threading.Event().wait(1.0)
            os._exit(1)

        threading.Thread(
            target=watch, name="py_process-parent-watch", daemon=True
        ).start()


def _exception_fields(exception: BaseException) -> tuple[str, str, str]:
    return (
        type(exception).__qualname__,
        str(exception),
        "".join(traceback.format_exception(exception)),
    )


def _close_object(obj: Any) -> tuple[str, str, str] | None:
    close = getattr(obj, "close", None)
    if not callable(close):
        return None
    try:
        close()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which logs it
        return _exception_fields(e)
    return None


def _child_main(conn: mp_connection.Connection, parent_pid: int) -> None:
    """Serves calls on one object until the parent says close or goes away."""
    # Ctrl-C sends SIGINT to the whole foreground process group. The parent
    # coordinates shutdown (its atexit hook closes us), so a child must not die
    # half-way through a step with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    import faulthandler

    faulthandler.enable()  # a segfault in an environment library prints a traceback

    def send(message: tuple) -> None:
        conn.send_bytes(pickle.dumps(message, protocol=_PICKLE_PROTOCOL))

    try:
        try:
            type_, args, kwargs = pickle.loads(conn.recv_bytes())
            obj = type_(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - anything the constructor raises
            send(("error", *_exception_fields(e)))
            return
        send(("ready", os.getpid()))
        try:
            while True:
                message = pickle.loads(conn.recv_bytes())
                if message[0] == "close":
                    closing, obj = obj, None
                    send(("closed", _close_object(closing)))
                    return
                _, method, args, kwargs = message
                try:
                    result = getattr(obj, method)(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - SystemExit included
                    send(("error", *_exception_fields(e)))
                    return
                try:
                    data = pickle.dumps(("ok", result), protocol=_PICKLE_PROTOCOL)
                except Exception as e:  # noqa: BLE001 - unpicklable result
                    send(
                        (
                            "error",
                            *_exception_fields(
                                TypeError(
                                    f"the result of {method}() cannot be pickled: {e}"
                                )
                            ),
                        )
                    )
                    return
                conn.send_bytes(data)
        finally:
            if obj is not None:
                _close_object(obj)
    except (EOFError, OSError):
        return  # The parent closed the pipe or died: nothing left to serve.


# --------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------


class _Launcher:
    """Starts every child from one long-lived daemon thread.

    Linux sends PR_SET_PDEATHSIG when the *thread* that forked the child exits, not
    when the parent process does. A child started from a short-lived thread (a
    thread pool in a hook, a resilience thread calling restart()) would be killed
    when that thread ends. A daemon thread lives until the interpreter is gone, after
    the atexit hook has closed the children cleanly.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._owner_pid: int | None = None

    def _serve(self) -> None:
        while True:
            future, argv, kwargs = self._requests.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(subprocess.Popen(argv, **kwargs))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    future.set_exception(e)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._owner_pid != os.getpid() or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="py_process-launcher", daemon=True
                )
                self._thread.start()
                self._owner_pid = os.getpid()
        future: futures.Future = futures.Future()
        self._requests.put((future, argv, kwargs))
        return future.result()


_LAUNCHER = _Launcher()


def _child_module_name() -> str:
    # Run as a script, this module is __main__, which the child cannot import.
    return "py_process" if __name__ == "__main__" else __name__


class _Child:
    """One child process and its pipe.

    Not thread-safe: PyProcess serialises call(), ensure_ready() and shutdown() with
    its call lock. kill() may come from any thread; the thread inside a call then
    sees EOF and reports why the child went away.
    """

    def __init__(self, label: str, payload: bytes):
        self.label = label
        self.popen: subprocess.Popen | None = None
        self.conn: mp_connection.Connection | None = None
        self.pid: int | None = None
        self.ready = False
        self.failure: PyProcessError | None = None  # why it is unusable
        self.cause = ""  # e.g. 'died: killed by signal SIGKILL (while running step())'
        self.stop_reason: str | None = None  # 'closed' / 'restarted' by the parent
        self._payload = payload

    @property
    def name(self) -> str:
        return f"PyProcess {self.label} (pid {self.pid})"

    @property
    def usable(self) -> bool:
        return (
            self.failure is None
            and self.stop_reason is None
            and self.popen is not None
            and self.popen.poll() is None
        )

    def launch(self) -> None:
        parent_conn, child_conn = mp_connection.Pipe(duplex=True)
        try:
            fd = child_conn.fileno()
            self.popen = _LAUNCHER.popen(
                [sys.executable, "-c", _BOOTSTRAP, str(fd), str(os.getpid())],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        self.conn = parent_conn
        self.pid = self.popen.pid
        try:
            self.conn.send_bytes(
                pickle.dumps(
                    (list(sys.path), _child_module_name()), protocol=_PICKLE_PROTOCOL
                )
            )
            self.conn.send_bytes(self._payload)
        except OSError:
            pass  # The child died at once; ensure_ready() reports how.

    def _set_failure(self, error: PyProcessError, cause: str) -> PyProcessError:
        self.failure = error
        self.cause = cause
        return error

    def _reap(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def _gone(self, activity: str) -> PyProcessError:
        """The pipe broke or the child exited: reap it and describe what happened."""
        returncode = self._reap(_EXIT_AFTER_ERROR_TIMEOUT_S)
        if self.stop_reason is not None:
            cause = f"was {self.stop_reason} by the parent while {activity}"
            return self._set_failure(PyProcessError(f"{self.name} {cause}"), cause)
        cause = f"died: {_describe_exit(returncode)} (while {activity})"
        return self._set_failure(
            PyProcessDiedError(f"{self.name} {cause}", returncode), cause
        )

    def _receive(self, activity: str, timeout: float | None = None) -> tuple:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _POLL_INTERVAL_S
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                if self.conn.poll(wait):
                    return pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                raise self._gone(activity) from None
            if deadline is not None and time.monotonic() >= deadline:
                # Hung: the pipe then reports EOF, and _gone says why.
                self.kill(f"killed after no answer for {timeout:g} s")
                raise self._gone(activity)
            if self.popen.poll() is not None:
                # Exited; a last message may still sit in the pipe.
                try:
                    if self.conn.poll(0):
                        return pickle.loads(self.conn.recv_bytes())
                except (EOFError, OSError):
                    pass
                raise self._gone(activity)

    def _remote_error(self, message: tuple, what: str) -> PyProcessRemoteError:
        _, exception_type, exception_message, child_traceback = message
        error = PyProcessRemoteError(
            f"{self.name}: {what} raised {exception_type}: {exception_message}\n"
            f"The child process has been shut down (its state is undefined after an "
            f"exception); call restart() to start a fresh one.\n"
            f"Child traceback:\n{child_traceback}",
            exception_type,
            exception_message,
            child_traceback,
        )
        self._set_failure(
            error,
            f"was shut down after {what} raised {exception_type}: {exception_message}",
        )
        self._reap(_EXIT_AFTER_ERROR_TIMEOUT_S)  # It exits by itself after an error.
        return error

    def _unusable(self, activity: str) -> PyProcessError:
        cls = type(self.failure) if self.failure is not None else PyProcessError
        cause = self.cause or f"was {self.stop_reason}"
        message = (
            f"{self.name} is not running: it {cause}. Cannot run {activity}; "
            f"call restart() to start a fresh process."
        )
        if cls is PyProcessDiedError:
            return PyProcessDiedError(message, self.popen.returncode)
        if cls is PyProcessRemoteError:
            f = self.failure
            return PyProcessRemoteError(
                message, f.exception_type, f.exception_message, f.child_traceback
            )
        return cls(message)

    def ensure_ready(self) -> None:
        """Waits for the constructor's outcome; raises if it failed."""
        if self.ready:
            return
        if self.failure is not None:
            raise self._unusable("its constructor")
        message = self._receive(f"constructing {self.label}")
        if message[0] == "ready":
            self.ready = True
            return
        if message[0] == "error":
            raise self._remote_error(message, f"the constructor {self.label}(...)")
        cause = f"sent an unexpected message {message[0]!r} while starting"
        raise self._set_failure(PyProcessError(f"{self.name} {cause}"), cause)

    def call(
        self, method: str, args: tuple, kwargs: dict, timeout: float | None = None
    ) -> Any:
        activity = f"running {method}()"
        if self.failure is not None or self.stop_reason is not None:
            raise self._unusable(f"{method}()")
        try:
            data = pickle.dumps(
                ("call", method, args, kwargs), protocol=_PICKLE_PROTOCOL
            )
        except Exception as e:  # noqa: BLE001 - the child is untouched
            raise PyProcessError(
                f"{self.name}: cannot pickle the arguments of {method}(): {e}"
            ) from e
        try:
            self.conn.send_bytes(data)
        except OSError:
            raise self._gone(activity) from None
        message = self._receive(activity, timeout)
        if message[0] == "ok":
            return message[1]
        if message[0] == "error":
            raise self._remote_error(message, f"{method}()")
        cause = f"sent an unexpected message {message[0]!r} while {activity}"
        raise self._set_failure(PyProcessError(f"{self.name} {cause}"), cause)

    def kill(self, reason: str) -> None:
        """SIGKILLs the child. Safe from any thread."""
        self.stop_reason = reason
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()

    def shutdown(self, timeout: float | None = None) -> None:
        """Closes the object in the child, ends and reaps the child.

        Asks the child to close (it calls the object's close() and exits), waits
        up to `timeout` seconds in all, then SIGTERM, then SIGKILL. Idempotent.
        """
        if self.popen is None:
            return
        timeout = _CLOSE_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self.stop_reason is None:
            self.stop_reason = "closed"
        if self.popen.poll() is None and self.failure is None:
            try:
                self.conn.send_bytes(
                    pickle.dumps(("close",), protocol=_PICKLE_PROTOCOL)
                )
                # A child still in its constructor answers 'ready' first; the
                # wait below then covers the rest.
                if self.conn.poll(timeout):
                    message = pickle.loads(self.conn.recv_bytes())
                    if message[0] == "closed" and message[1] is not None:
                        _log.warning(
                            "%s: %s.close() raised %s: %s",
                            self.name,
                            self.label,
                            message[1][0],
                            message[1][1],
                        )
            except (EOFError, OSError):
                pass
        try:
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _log.warning(
                "%s did not exit within %.1f s of close; sending SIGTERM.",
                self.name,
                timeout,
            )
            self.popen.terminate()
            try:
                self.popen.wait(_TERMINATE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _log.warning("%s ignored SIGTERM; sending SIGKILL.", self.name)
                self.popen.kill()
                self.popen.wait()
        self.conn.close()


# Every PyProcess that has (had) a child, so the atexit hook can close them.
_REGISTRY: weakref.WeakSet = weakref.WeakSet()


class PyProcess:
    """An object of `type_` living in a child process, with TensorFlow ops to call it.

    Args:
      type_: a class importable by module name in a fresh interpreter (defined at
        module level, not in __main__). It must have a static method
        `_tensor_specs(method_name, kwargs, constructor_kwargs)` returning a nest of
        `tf.TensorSpec` or None for each method called through the proxy; it may
        have a `close()` method, called in the child at shutdown.
      *constructor_args, **constructor_kwargs: picklable; the child constructs
        `type_(*constructor_args, **constructor_kwargs)`.

    The process is added to the default graph's collection `PyProcess.COLLECTION`
    (for `PyProcessHook`). It is not started by the constructor.
    """

    COLLECTION = "py_process_processes"

    # Seconds a call may wait for the child's answer before the child is taken
    # for hung and killed (see the module docstring); None: no limit.
    call_timeout_s: float | None = None

    def __init__(self, type_: type, *constructor_args: Any, **constructor_kwargs: Any):
        import tensorflow as tf

        if not inspect.isclass(type_):
            raise TypeError(f"PyProcess: type_ must be a class, got {type_!r}.")
        if type_.__module__ == "__main__":
            raise ValueError(
                f"PyProcess: {type_.__qualname__} is defined in the __main__ script. "
                f"Child processes start a fresh interpreter and import only the "
                f"class's module (so that TensorFlow stays out of them), so they "
                f"cannot import __main__. Move {type_.__qualname__} into a module."
            )
        try:
            payload = pickle.dumps(
                (type_, constructor_args, constructor_kwargs), protocol=_PICKLE_PROTOCOL
            )
        except Exception as e:
            raise TypeError(
                f"PyProcess {type_.__name__}: the class and its constructor arguments "
                f"must be picklable (the class by its module-level name): {e}"
            ) from e
        self._type = type_
        self._constructor_args = constructor_args
        self._constructor_kwargs = dict(constructor_kwargs)
        self._payload = payload
        self._label = type_.__name__
        self._admin_lock = threading.Lock()  # start / restart / close
        self._call_lock = threading.Lock()  # one call at a time on the pipe
        self._child: _Child | None = None
        self._last_pid: int | None = None
        self._closed = False
        # The PyProcessError of the last failed call (None after a start).
        self.last_error: PyProcessError | None = None
        self._proxy = _Proxy(self)
        tf.compat.v1.add_to_collection(self.COLLECTION, self)

    def __repr__(self) -> str:
        child = self._child
        state = (
            "alive"
            if self.alive
            else "closed"
            if self._closed
            else "not started"
            if child is None
            else "not running"
        )
        return f"<PyProcess {self._label} pid={self.pid} {state}>"

    @property
    def proxy(self) -> _Proxy:
        """`proxy.method(*args, **kwargs)` builds an op calling `method` in the child."""
        return self._proxy

    @property
    def name(self) -> str:
        return self._label

    @property
    def pid(self) -> int | None:
        """The process id of the current (or, once closed, the last) child."""
        return self._last_pid

    @property
    def alive(self) -> bool:
        """True when the child is constructed, running and usable for calls."""
        child = self._child
        return child is not None and child.ready and child.usable

    def start(self) -> None:
        """Starts the child and waits for its constructor; no-op when already running.

        Also starts a fresh child when the previous one was closed, died or failed.
        Raises PyProcessRemoteError (constructor raised) or PyProcessDiedError.
        """
        self._wait_started(self._launch())

    def restart(self) -> None:
        """Kills the current child (if running) and starts a fresh one.

        Ops built before keep working: they call whichever child is current.
        """
        with self._admin_lock:
            self._retire("restarted")
            child = self._launch_locked()
        self._wait_started(child)

    def close(self, session: Any = None) -> None:
        """Ends the child: calls the object's close() there, exits, is reaped.

        Safe to call twice, before start, and after a failure. `session` is accepted
        for the reference API and unused.
        """
        del session
        with self._admin_lock:
            self._closed = True
            self._retire("closed")
        _REGISTRY.discard(self)

    def _retire(self, reason: str) -> None:
        """Shuts down the current child. Caller holds the admin lock."""
        child, self._child = self._child, None
        if child is None:
            return
        if reason == "restarted":
            child.kill(reason)  # Contract: restart kills; no graceful close.
        got_lock = self._call_lock.acquire(timeout=_CLOSE_WAIT_FOR_CALL_S)
        if not got_lock:
            # A call is in flight (a slow or hung method): kill the child so that the
            # call returns with an error, then take the pipe.
            child.kill(reason)
            self._call_lock.acquire()
        try:
            child.stop_reason = child.stop_reason or reason
            child.shutdown()
        finally:
            self._call_lock.release()

    def _launch(self) -> _Child:
        with self._admin_lock:
            child = self._child
            if child is not None and child.usable:
                return child  # Running or still constructing.
            self._retire("closed")
            return self._launch_locked()

    def _launch_locked(self) -> _Child:
        child = _Child(self._label, self._payload)
        child.launch()
        self._child = child
        self._last_pid = child.pid
        self._closed = False
        self.last_error = None
        _REGISTRY.add(self)
        return child

    def _wait_started(self, child: _Child) -> None:
        with self._call_lock:
            child.ensure_ready()

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        with self._call_lock:
            child = self._child
            if child is None:
                if self._closed:
                    raise PyProcessError(
                        f"PyProcess {self._label} is closed; cannot run {method}()."
                    )
                raise PyProcessError(
                    f"PyProcess {self._label} is not started; cannot run {method}(). "
                    f"Call start() or pass PyProcessHook() to the MonitoredSession."
                )
            try:
                child.ensure_ready()
                return child.call(method, args, kwargs, self.call_timeout_s)
            except PyProcessError as e:
                # Kept for the caller: inside session.run, py_func turns this
                # error into a tf.errors one that holds only its text.
                self.last_error = e
                raise

    def _method_arguments(self, method: str, args: tuple, kwargs: dict) -> dict:
        """Binds the proxy call's arguments to the method's parameter names."""
        function = getattr(self._type, method)
        signature = inspect.signature(function)
        if not isinstance(
            inspect.getattr_static(self._type, method), (staticmethod, classmethod)
        ):
            parameters = list(signature.parameters.values())[1:]  # drop self
            signature = signature.replace(parameters=parameters)
        try:
            return dict(signature.bind(*args, **kwargs).arguments)
        except TypeError as e:
            raise TypeError(
                f"PyProcess {self._label}: proxy.{method}() arguments do "
                f"not match {self._label}.{method}{signature}: {e}"
            ) from e

    def _build_op(self, method: str, args: tuple, kwargs: dict) -> Any:
        import tensorflow as tf

        arguments = self._method_arguments(method, args, kwargs)
        tensor_specs = getattr(self._type, "_tensor_specs", None)
        if tensor_specs is None:
            raise AttributeError(
                f"PyProcess {self._label}: {self._label} has no static method "
                f"_tensor_specs(method_name, kwargs, constructor_kwargs), which gives "
                f"the dtypes and shapes of {method}()'s outputs."
            )
        specs = tensor_specs(method, arguments, self._constructor_kwargs)
        outputs_plan = _Outputs(specs, f"{self._label}._tensor_specs({method!r}, ...)")
        pack_inputs, flat_inputs = _input_packer(tuple(args), dict(kwargs))

        def py_call(*values: Any) -> list:
            call_args, call_kwargs = pack_inputs(values)
            result = self._call(method, call_args, call_kwargs)
            return outputs_plan.convert(
                result, lambda: f"{self._child_name()}: {method}()"
            )

        # numpy_function is py_func without the deprecation warning.
        outputs = tf.compat.v1.numpy_function(
            py_call,
            flat_inputs,
            [spec.dtype for spec in outputs_plan.flat_specs],
            stateful=True,
            name=f"{self._label}_{method}",
        )
        if specs is None:
            return outputs  # A tf.Operation (None when executing eagerly).
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]  # Eager execution unwraps a single output.
        for tensor, spec in zip(outputs, outputs_plan.flat_specs, strict=True):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(specs, outputs)

    def _child_name(self) -> str:
        child = self._child
        return child.name if child is not None else f"PyProcess {self._label}"


def _input_packer(args: tuple, kwargs: dict) -> tuple[Any, list]:
    """Flattens a proxy call's arguments for py_func; returns (unflatten, flat list).

    Plain tensor/value arguments take a fast path: tf.nest.pack_sequence_as is a
    noticeable part of a round trip (BENCHMARKS.md, "Figures from the code").
    """
    import tensorflow as tf

    keys = sorted(kwargs)
    if any(tf.nest.is_nested(v) for v in (*args, *kwargs.values())):
        structure = (args, kwargs)

        def pack_nested(values: tuple) -> tuple[tuple, dict]:
            packed_args, packed_kwargs = tf.nest.pack_sequence_as(
                structure, list(values)
            )
            return tuple(packed_args), dict(packed_kwargs)

        return pack_nested, tf.nest.flatten(structure)
    num_args = len(args)

    def pack_flat(values: tuple) -> tuple[tuple, dict]:
        return tuple(values[:num_args]), dict(zip(keys, values[num_args:], strict=True))

    return pack_flat, [*args, *(kwargs[k] for k in keys)]


class _Outputs:
    """Checks and converts a method's results against its `_tensor_specs`.

    Built once per op (with TensorFlow, in the parent); `convert` runs per call and
    uses only numpy, several times cheaper than tf.nest and TensorShape.
    """

    def __init__(self, specs: Any, source: str):
        import tensorflow as tf

        self.specs = specs
        self._spec_type = tf.TensorSpec
        self.flat_specs: list = []

        def collect(spec: Any) -> None:
            if isinstance(spec, tf.TensorSpec):
                self.flat_specs.append(spec)
            elif isinstance(spec, dict):
                for key in sorted(spec):
                    collect(spec[key])
            elif isinstance(spec, (tuple, list)):
                for item in spec:
                    collect(item)
            else:
                raise TypeError(
                    f"PyProcess: {source} must return None or a nest (tuples, lists, "
                    f"namedtuples, dicts) of tf.TensorSpec; found {spec!r}."
                )

        if specs is not None:
            collect(specs)
        # Per output: numpy dtype (None for tf.string), dims (None if rank unknown).
        self._dtypes = [
            None if s.dtype == tf.string else np.dtype(s.dtype.as_numpy_dtype)
            for s in self.flat_specs
        ]
        self._dtype_names = [s.dtype.name for s in self.flat_specs]
        self._dims = [
            None if s.shape.rank is None else tuple(s.shape.as_list())
            for s in self.flat_specs
        ]

    def _flatten(self, spec: Any, value: Any, out: list, where: str) -> None:
        # tf.nest's order: sequences (namedtuples too) in order, dicts by sorted key.
        if isinstance(spec, self._spec_type):
            out.append(value)
        elif isinstance(spec, dict):
            if not isinstance(value, dict) or set(value) != set(spec):
                raise PyProcessError(
                    f"{where} returned {_short_repr(value)}; its _tensor_specs "
                    f"declares a dict with keys {sorted(spec)}."
                )
            for key in sorted(spec):
                self._flatten(spec[key], value[key], out, where)
        else:
            if not isinstance(value, (tuple, list)) or len(value) != len(spec):
                raise PyProcessError(
                    f"{where} returned {_short_repr(value)}; its _tensor_specs "
                    f"declares a sequence of {len(spec)}: {spec}."
                )
            for spec_item, value_item in zip(spec, value, strict=True):
                self._flatten(spec_item, value_item, out, where)

    def convert(self, result: Any, describe: Any) -> list:
        """Returns the flat list of numpy arrays for py_func; `describe()` names the
        call in error messages (computed only on error)."""
        if self.specs is None:
            return []
        values: list = []
        try:
            self._flatten(self.specs, result, values, "")
        except PyProcessError as e:
            raise PyProcessError(f"{describe()}{e}") from None
        outputs = []
        for index, value in enumerate(values):
            wanted = self._dtypes[index]
            if wanted is None:
                array = np.asarray(value, dtype=object)
            else:
                array = np.asarray(value)
                if array.dtype != wanted:
                    if not np.can_cast(array.dtype, wanted, casting="same_kind"):
                        raise PyProcessError(
                            f"{describe()} returned {array.dtype} for output {index} "
                            f"of {len(values)}, which cannot be cast to the "
                            f"{self._dtype_names[index]} its _tensor_specs declares."
                        )
                    array = array.astype(wanted)
            dims = self._dims[index]
            if dims is not None and (
                len(dims) != array.ndim
                or any(
                    d is not None and d != n
                    for d, n in zip(dims, array.shape, strict=True)
                )
            ):
                raise PyProcessError(
                    f"{describe()} returned shape {list(array.shape)} for output "
                    f"{index} of {len(values)}; its _tensor_specs declares shape "
                    f"{list(dims)}."
                )
            outputs.append(array)
        return outputs


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Proxy:
    """Attribute access gives functions building ops; see PyProcess."""

    def __init__(self, process: PyProcess):
        self._process = process

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        process = self._process
        attribute = getattr(process._type, name, None)
        if attribute is None or not callable(attribute):
            raise AttributeError(
                f"PyProcess {process._label}: {process._label} has no method "
                f"{name!r} to call through the proxy."
            )

        def build(*args: Any, **kwargs: Any) -> Any:
            return process._build_op(name, args, kwargs)

        build.__name__ = name
        build.__doc__ = getattr(attribute, "__doc__", None)
        return build


# A child killed by a signal while its constructor runs (the OOM killer, an
# operator's kill) is started again this many times, after 1 s, then 2 s: it
# is a crash like one in the middle of a run. A constructor that raises, or a
# child that exits with a code of its own, fails at once.
START_RETRIES_AFTER_A_SIGNAL = 2
START_RETRY_DELAY_SECS = 1.0


def _killed_by_signal(error: PyProcessError) -> bool:
    return (
        isinstance(error, PyProcessDiedError)
        and error.exitcode is not None
        and error.exitcode < 0
    )


def _start_in_parallel(
    processes: list[PyProcess],
) -> list[tuple[PyProcess, PyProcessError]]:
    """Launches every child, then waits for each; the ones that failed."""
    failed: list[tuple[PyProcess, PyProcessError]] = []
    launched = []
    for process in processes:
        try:
            launched.append((process, process._launch()))
        except PyProcessError as e:
            failed.append((process, e))
    for process, child in launched:
        try:
            process._wait_started(child)
        except PyProcessError as e:
            failed.append((process, e))
    return failed


def start_all(processes: list[PyProcess]) -> None:
    """Starts processes in parallel: launches every child, then waits for each.

    The children run their constructors at the same time. A child killed by
    a signal while it constructs is started again (up to
    START_RETRIES_AFTER_A_SIGNAL times, after 1 s, 2 s, ...). If any fails
    otherwise, or keeps being killed, all of `processes` are closed and the
    first error is raised (the others are logged).
    """
    processes = list(processes)
    failed = _start_in_parallel(processes)
    for attempt in range(1, START_RETRIES_AFTER_A_SIGNAL + 1):
        if not failed or not all(_killed_by_signal(e) for _, e in failed):
            break
        for _, error in failed:
            _log.warning(
                "%s; starting it again in a fresh process (retry %d of %d).",
                error,
                attempt,
                START_RETRIES_AFTER_A_SIGNAL,
            )
        time.sleep(START_RETRY_DELAY_SECS * attempt)
        failed = _start_in_parallel([process for process, _ in failed])
    if failed:
        errors = [error for _, error in failed]
        for error in errors[1:]:
            _log.error("Another PyProcess failed to start too: %s", error)
        close_all(processes)
        raise errors[0]


def close_all(processes: list[PyProcess]) -> None:
    """Closes processes in parallel (each close waits for its child to exit)."""
    processes = [p for p in processes if p._child is not None]
    if len(processes) <= 1:
        for process in processes:
            process.close()
        return

    def close(process: PyProcess) -> None:
        try:
            process.close()
        except Exception as e:  # noqa: BLE001 - keep closing the others
            _log.error("Closing %r failed: %s", process, e)

    # Plain threads, not a ThreadPoolExecutor: executors refuse work once the
    # interpreter is shutting down, and the atexit hook calls this function.
    threads = [
        threading.Thread(target=close, args=(p,), daemon=True, name="py_process-close")
        for p in processes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@atexit.register
def _close_all_at_exit() -> None:
    close_all(list(_REGISTRY))


def __getattr__(name: str) -> Any:
    # PyProcessHook subclasses a TensorFlow class, so it is built on first access
    # (always in the parent) to keep TensorFlow out of child processes.
    if name == "PyProcessHook":
        hook_class = _make_hook_class()
        globals()["PyProcessHook"] = hook_class
        return hook_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_hook_class() -> type:
    import tensorflow as tf

    class PyProcessHook(tf.compat.v1.train.SessionRunHook):
        """Starts every PyProcess of the graph in begin(), closes them at the end.

        Processes are taken from the collection PyProcess.COLLECTION of the default
        graph when begin() runs, and started in parallel; a constructor error is
        raised from begin() (so from the session's creation).

        MonitoredSession does not call end() when its `with` block exits with an
        exception, but always stops its coordinator when it closes. So the hook
        also registers a thread with the coordinator that closes the processes as
        soon as the coordinator stops: children end with the session, also after
        an error. When MonitoredSession re-creates its session (after a preemption
        error) after_create_session starts the processes again.
        """

        def __init__(self) -> None:
            self._processes: list[PyProcess] = []

        def begin(self) -> None:
            self._processes = list(tf.compat.v1.get_collection(PyProcess.COLLECTION))
            start_all(self._processes)

        def after_create_session(self, session: Any, coord: Any) -> None:
            del session
            start_all([p for p in self._processes if not p.alive])
            if coord is None:
                return
            processes = list(self._processes)

            def close_on_stop() -> None:
                coord.wait_for_stop()
                close_all(processes)

            thread = threading.Thread(
                target=close_on_stop, daemon=True, name="py_process-close-on-stop"
            )
            coord.register_thread(thread)
            thread.start()

        def end(self, session: Any) -> None:
            del session
            close_all(self._processes)

    PyProcessHook.__module__ = __name__
    return PyProcessHook


if __name__ == "__main__":
    print(__doc__)
