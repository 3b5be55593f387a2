"""SIGINT and SIGTERM: a clean stop, as an object passed to whatever loops.

experiment.py creates one `ShutdownRequest` per run and hands it to the
learner loop, the actor threads and the cluster tasks, which read
`requested` between steps. Nothing here is global.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import tensorflow as tf
from absl import logging


class ShutdownRequest:
    """SIGINT and SIGTERM: a clean stop of training.

    The first signal sets `requested` at once: a thread reads the signal
    wakeup fd, so this works also while the main thread waits inside
    session.run (Python runs signal handlers only between bytecodes of the
    main thread). The learner loop then ends after its current step, actors
    stop restarting environments, and the session's normal exit saves a
    final checkpoint and ends every environment process; main() logs
    'Training stopped by SIGTERM at N frames; checkpoint saved to ...' and
    exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the
    code a shell reports for a process ended by that signal, so a supervisor
    sees that the run did not finish. A second signal exits at once, with
    the same code, without a final checkpoint (the environment processes die
    with this process).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    LEARNER_STOP = (
        "stopping after the current learner step, with a final checkpoint; "
        "every environment process will be ended. Send it again to exit at "
        "once without a checkpoint"
    )
    ACTOR_TASK_STOP = (
        "this actor task stops after its current call to the learner and ends "
        "its environment process (it writes no checkpoint; the learner goes "
        "on). Send it again to exit at once"
    )

    def __init__(self):
        self.signum: int | None = None
        self._lock = threading.Lock()
        self._requested = threading.Event()
        # What the first signal does, for the log line (actor tasks differ).
        self.stop_description = self.LEARNER_STOP
        # While set (what the process is doing, e.g. creating its session
        # with the cluster's other tasks, a wait in C++ that no flag ends),
        # the first signal exits at once: nothing is trained yet.
        self._at_once: str | None = None

    def exit_at_once_while(self, what: str | None) -> None:
        """From now until called with None, a signal exits the process at
        once (128 + the signal), saying it stopped while `what`."""
        with self._lock:
            self._at_once = what
            pending = self.signum if what is not None else None
        if pending is not None:
            self._exit_now(pending, what)

    def _exit_now(self, signum: int, what: str) -> None:
        logging.warning(
            "Received %s while %s: exiting at once (exit code %d); nothing "
            "was trained yet.",
            signal.Signals(signum).name,
            what,
            128 + signum,
        )
        os._exit(128 + signum)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def wait(self, seconds: float) -> bool:
        """Waits up to `seconds` (0: not at all); True once a stop is
        requested (a signal arrived before or meanwhile)."""
        if seconds > 0:
            self._requested.wait(seconds)
        return self.requested

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def notice(self, signum: int) -> None:
        """Handles one delivered signal (called by the watcher thread)."""
        with self._lock:
            first = self.signum is None
            if first:
                self.signum = signum
                self._requested.set()
            at_once = self._at_once
        name = signal.Signals(signum).name
        if at_once is not None:
            self._exit_now(signum, at_once)
        if first:
            logging.warning("Received %s: %s.", name, self.stop_description)
            return
        logging.warning(
            "Received %s again: exiting at once (exit code %d), without a "
            "final checkpoint.",
            name,
            128 + signum,
        )
        os._exit(128 + signum)

    def log_stop(self, num_env_frames: int, logdir: str) -> None:
        logging.info(
            "Training stopped by %s at %d frames; checkpoint saved to %s. "
            "Exit code %d; rerun the same command to resume.",
            signal.Signals(self.signum).name,
            num_env_frames,
            tf.train.latest_checkpoint(logdir),
            self.exit_code,
        )

    def _watch(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as wakeups:
            while data := wakeups.read(64):  # Ends when the write end closes.
                for signum in data:
                    if signum in self.SIGNALS:
                        self.notice(signum)

    @contextlib.contextmanager
    def handling_signals(self):
        """Handles SIGINT and SIGTERM inside the `with` block (main thread
        only; elsewhere the block runs with the handlers unchanged)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        watcher = threading.Thread(
            target=self._watch, args=(read_fd,), name="shutdown-signals", daemon=True
        )
        watcher.start()
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        # Python-level handlers that do nothing: the C-level handler writes
        # the signal number to the wakeup fd, and the watcher does the rest.
        previous = {
            s: signal.signal(s, lambda signum, frame: None) for s in self.SIGNALS
        }
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(write_fd)
            watcher.join(timeout=5)
