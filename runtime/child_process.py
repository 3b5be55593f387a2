"""Python objects living in child processes, called over a pipe: the parent's
side of the TensorFlow-free half of py_process (the child's side is
child_main.py, the messages between them child_wire.py).

`ChildProcess(type_, *args, **kwargs)` runs one object of a user class in a
child process of its own (a fresh interpreter that imports only this module
and the class's module, never TensorFlow) and calls its methods over a
socketpair; py_process.PyProcess adds the TensorFlow ops that do so from a
graph. `start_each`, `start_all` and `close_all` start and close many in
parallel, and
`parent_death_signal_setter` is the kernel's parent-death signal, also used
by launch.py for its tasks.

Failure behaviour (what the rest of the code base may rely on):
  * A call never hangs on a dead child: every wait on the pipe is a poll with a
    timeout followed by a liveness check, and the pipe reports EOF as soon as the
    child exits. The call raises `PyProcessDiedError`, e.g.
    "PyProcess PyProcessAtari (pid 123) died: killed by signal SIGKILL (while running
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
    with the original type name, message and traceback; `start_each` reports
    each child's failure to start (`killed_by_signal` tells a crash, such as
    the OOM killer's, from a constructor that raised), and what to do about
    it is the caller's policy (actor/supervisor.py for environments).
  * A child that does not answer a call within `call_timeout_s` seconds (None,
    the default: no limit) is taken for hung (an environment stuck in a loop, a
    stopped process): it is SIGKILLed and the call raises `PyProcessError`
    ("... was killed after no answer for 60 s by the parent while running
    step()").
  * `alive` is False after any of these; `restart()` kills the old child (if
    running) and starts a fresh one with the same constructor arguments; ops built
    before keep working because they look up the current child at call time.

Shutdown: `close()` asks the child to call the object's close() and exit, waits,
then escalates to SIGTERM and SIGKILL, and always reaps the child (no zombies).
Each child leads a process group of its own, and whenever a child ends (closed,
restarted, killed, or found dead) its whole group is SIGKILLed after it: a
process the object started (ViZDoom's engine, say) never outlives it.
Children ignore SIGINT, so Ctrl-C reaches only the parent, whose atexit hook closes
every child still open. If the parent dies without cleaning up (SIGKILL, an
unhandled SIGTERM, a crash), the kernel kills the children (PR_SET_PDEATHSIG on
Linux); children also exit when their pipe reports EOF.

Calls on one process are serialised (a lock around the pipe), so any number of
threads may call it; different processes run in parallel. Results travel
pickled over the socketpair: pickling a frame adds little to a call
(benchmarks/results/py_process.md), so no shared memory.

This module never imports TensorFlow: child processes import it and start in
a fraction of a second without TensorFlow's import and its memory
(tests/architecture_test.py keeps it so).
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
import weakref
from concurrent import futures
from multiprocessing import connection as mp_connection
from typing import Any

from runtime import child_main
from runtime.child_wire import PICKLE_PROTOCOL, POLL_INTERVAL_S, CutShort, read_message
from runtime.errors import (  # the children's errors, re-exported here
    PyProcessDiedError,
    PyProcessError,
    PyProcessRemoteError,
    killed_by_signal,
)

__all__ = [
    "ChildProcess",
    "PyProcessDiedError",
    "PyProcessError",
    "PyProcessRemoteError",
    "close_all",
    "killed_by_signal",
    "start_all",
    "start_each",
]

_log = logging.getLogger(__name__)

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


class _Child:
    """One child process and its pipe.

    Not thread-safe: ChildProcess serialises call(), ensure_ready() and shutdown() with
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
                [sys.executable, "-c", child_main.BOOTSTRAP, str(fd), str(os.getpid())],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                # Its own process group (pgid = its pid), so that ending the
                # child can end everything it started (_end_group).
                process_group=0,
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
                    (list(sys.path), child_main.__name__), protocol=PICKLE_PROTOCOL
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
            returncode = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            returncode = self.popen.wait()
        self._end_group()
        return returncode

    def _end_group(self) -> None:
        """SIGKILLs what is left of the child's process group: processes the
        object started (an engine, a helper), which would otherwise outlive
        a child that was killed, crashed or exited without ending them."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

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
            wait = POLL_INTERVAL_S
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                if self.conn.poll(wait):
                    message = read_message(
                        self.conn, deadline, alive=lambda: self.popen.poll() is None
                    )
                    if message is not None:
                        return pickle.loads(message)
            except CutShort:
                self.kill(f"killed after no answer for {timeout:g} s")
                raise self._gone(activity) from None
            except (EOFError, OSError):
                raise self._gone(activity) from None
            if deadline is not None and time.monotonic() >= deadline:
                # Hung: the pipe then reports EOF, and _gone says why.
                self.kill(f"killed after no answer for {timeout:g} s")
                raise self._gone(activity)
            if self.popen.poll() is not None:
                # Exited; a last message may still sit in the pipe.
                try:
                    message = read_message(self.conn, time.monotonic())
                    if message is not None:
                        return pickle.loads(message)
                except (EOFError, OSError, CutShort):
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
                ("call", method, args, kwargs), protocol=PICKLE_PROTOCOL
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
        """SIGKILLs the child and its process group. Safe from any thread."""
        self.stop_reason = reason
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self._end_group()

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
                self.conn.send_bytes(pickle.dumps(("close",), protocol=PICKLE_PROTOCOL))
                # A child still in its constructor answers 'ready' first; the
                # wait below then covers the rest.
                answer = read_message(self.conn, deadline)
                if answer is not None:
                    message = pickle.loads(answer)
                    if message[0] == "closed" and message[1] is not None:
                        _log.warning(
                            "%s: %s.close() raised %s: %s",
                            self.name,
                            self.label,
                            message[1][0],
                            message[1][1],
                        )
            except (EOFError, OSError, CutShort):
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
        self._end_group()
        self.conn.close()


# Every ChildProcess that has (had) a child, so the atexit hook can close them.
_REGISTRY: weakref.WeakSet = weakref.WeakSet()


class ChildProcess:
    """An object of `type_` living in a child process, called over a pipe.

    Args:
      type_: a class importable by module name in a fresh interpreter (defined at
        module level, not in __main__). It must have a static method
        `_tensor_specs(...)` for py_process's ops; it may have a `close()`
        method, called in the child at shutdown.
      *constructor_args, **constructor_kwargs: picklable; the child constructs
        `type_(*constructor_args, **constructor_kwargs)`.

    It is not started by the constructor. py_process.PyProcess adds the
    TensorFlow ops that call it.
    """

    # Seconds a call may wait for the child's answer before the child is taken
    # for hung and killed (see the module docstring); None: no limit.
    call_timeout_s: float | None = None

    def __init__(self, type_: type, *constructor_args: Any, **constructor_kwargs: Any):
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
                (type_, constructor_args, constructor_kwargs), protocol=PICKLE_PROTOCOL
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

    def _child_name(self) -> str:
        child = self._child
        return child.name if child is not None else f"PyProcess {self._label}"


def start_each(
    processes: list[ChildProcess],
) -> list[tuple[ChildProcess, PyProcessError]]:
    """Launches every child, then waits for each (their constructors run at
    the same time); returns the ones that failed to start, with why. The
    others are left running."""
    failed: list[tuple[ChildProcess, PyProcessError]] = []
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


def start_all(processes: list[ChildProcess]) -> None:
    """Starts processes in parallel (`start_each`). If any fails, all of
    `processes` are closed and the first error is raised (the others are
    logged). Environments are started through their supervisor instead,
    which restarts a child killed while it starts (actor/supervisor.py)."""
    processes = list(processes)
    failed = start_each(processes)
    if failed:
        errors = [error for _, error in failed]
        for error in errors[1:]:
            _log.error("Another PyProcess failed to start too: %s", error)
        close_all(processes)
        raise errors[0]


def close_all(processes: list[ChildProcess]) -> None:
    """Closes processes in parallel (each close waits for its child to exit)."""
    processes = [p for p in processes if p._child is not None]
    if len(processes) <= 1:
        for process in processes:
            process.close()
        return

    def close(process: ChildProcess) -> None:
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
