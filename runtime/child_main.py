"""The child side of runtime/child_process.py: what runs in a child process.

A child is a fresh interpreter started by the parent with `BOOTSTRAP`, which
reads sys.path and this module's name from the pipe, imports this module and
runs `child_main`: it builds the one object the parent asked for and serves
its method calls until the parent says close or goes away (the messages:
runtime/child_wire.py). It ignores SIGINT (the parent coordinates shutdown)
and dies with its parent (`parent_death_signal_setter`, also used by
launch.py for its tasks). No TensorFlow.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from multiprocessing import connection as mp_connection
from typing import Any

from runtime.child_wire import PICKLE_PROTOCOL, exception_fields

# Start method. Plain fork is unsafe: by the time processes start, TensorFlow
# runs threads (`import tensorflow` alone leaves two native threads), and a
# forked copy of a multi-threaded process can deadlock on a lock some vanished
# thread held. multiprocessing's 'spawn' re-imports the parent's __main__
# script in every child (for experiment.py: TensorFlow, its seconds and its
# hundreds of MiB, in every child); 'forkserver' imports __main__ into its
# server too and forks every child from it, which brings the fork hazard
# back, is process-global state shared with any other multiprocessing user,
# and makes the server the children's parent, so PR_SET_PDEATHSIG would watch
# the server. Chosen: subprocess (fork+exec done in C, safe next to threads)
# of a fresh interpreter running BOOTSTRAP, which imports only this module and
# the class's module: spawn without TensorFlow. The start times measured for
# each choice are in benchmarks/results/py_process.md; start time is paid once
# per environment per run (and per restart).
BOOTSTRAP = (
    "import importlib, pickle, sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:], module_name = pickle.loads(conn.recv_bytes())\n"
    "importlib.import_module(module_name).child_main(conn, int(sys.argv[2]))\n"
)


def parent_death_signal_setter(signum: int, parent_pid: int):
    """A function that asks the kernel to send `signum` to the process that
    calls it when that process's parent dies (Linux prctl
    PR_SET_PDEATHSIG), and exits at once if the parent (`parent_pid`) has
    already died; it returns whether the signal is armed. None where prctl
    is not available. libc is loaded here, so the function only makes the
    call: it is safe as a subprocess preexec_fn (launch.py's tasks) as well
    as in a child (this module's environment processes).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_signal() -> bool:
        armed = prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) == 0
        # The parent may have died before prctl took effect; we are then
        # already re-parented and nobody would ever send the signal.
        if os.getppid() != parent_pid:
            os._exit(1)
        return armed

    return set_signal


def _die_with_parent(parent_pid: int) -> None:
    """Makes sure this child does not outlive the parent process."""
    set_signal = parent_death_signal_setter(signal.SIGKILL, parent_pid)
    armed = set_signal() if set_signal is not None else False
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


def _close_object(obj: Any) -> tuple[str, str, str] | None:
    close = getattr(obj, "close", None)
    if not callable(close):
        return None
    try:
        close()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which logs it
        return exception_fields(e)
    return None


def child_main(conn: mp_connection.Connection, parent_pid: int) -> None:
    """Serves calls on one object until the parent says close or goes away."""
    # Ctrl-C sends SIGINT to the whole foreground process group. The parent
    # coordinates shutdown (its atexit hook closes us), so a child must not die
    # half-way through a step with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    # The pipe came in as an inherited descriptor (pass_fds); programs the
    # object starts (a ViZDoom engine) must not get it too, or the parent sees
    # no end of the pipe when this process dies while they live on.
    os.set_inheritable(conn.fileno(), False)
    import faulthandler

    faulthandler.enable()  # a segfault in an environment library prints a traceback

    def send(message: tuple) -> None:
        conn.send_bytes(pickle.dumps(message, protocol=PICKLE_PROTOCOL))

    try:
        try:
            type_, args, kwargs = pickle.loads(conn.recv_bytes())
            obj = type_(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - anything the constructor raises
            send(("error", *exception_fields(e)))
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
                    send(("error", *exception_fields(e)))
                    return
                try:
                    data = pickle.dumps(("ok", result), protocol=PICKLE_PROTOCOL)
                except Exception as e:  # noqa: BLE001 - unpicklable result
                    send(
                        (
                            "error",
                            *exception_fields(
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
