"""The errors that end a run, by what the user can do about them.

experiment.py turns each into one line on stderr and an exit code: a
`FlagError` exits 2 (fix the command line), a `TrainingError` exits 1 (the
run cannot go on; the message says what was kept; a cluster task whose
learner is gone for good, `LearnerGoneError`, exits 3). Modules raise them
without knowing about flags' parsing; the messages name the flag to change.
`first_line` picks, for such messages, the line of a TensorFlow error that
says what failed.
"""


class FlagError(ValueError):
    """A setting this program cannot run with; the message names the flag,
    the value and the fix."""

    exit_code = 2


class LogdirError(FlagError):
    """--logdir cannot be written: not creatable, not writable, or full when a
    checkpoint was due. Nothing already written there is touched."""


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""

    exit_code = 1


class EnvironmentFailedError(TrainingError):
    """An actor's environment failed repeatedly, even in fresh processes."""


class NonFiniteUpdateError(TrainingError):
    """A learner step had a NaN/Inf loss or gradient; it was not applied."""


class LearnerGoneError(TrainingError):
    """A cluster task that had a session with the learner could not reach it
    for longer than --learner_lost_secs: the run is over or its learner is
    gone for good, and the task exits rather than wait forever."""

    exit_code = 3


class CheckpointError(TrainingError):
    """--logdir holds checkpoint files, but none of them can be restored."""


def first_line(error: Exception) -> str:
    """'ErrorType: the line of a TensorFlow error message that says what failed'.

    Graph execution errors start with 'Graph execution error:' and a stack;
    the cause follows 'From /job:...:' (an error on another task) or comes
    just before the '[[{{node ...}}]]' line.
    """
    message = getattr(error, "message", None) or str(error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for i, line in enumerate(lines):
        if line.startswith("From /job:") and i + 1 < len(lines):
            text = lines[i + 1]
            break
        if line.startswith("[[") and i > 0:
            text = lines[i - 1]
            break
    return f"{type(error).__name__}: {text[:300]}"


# -- a child process's errors (runtime/child_process.py raises them) ---------


class PyProcessError(RuntimeError):
    """A child process could not do what was asked. Messages start with the
    process name ("PyProcess <class> (pid N)", py_process's name for it)."""


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


def killed_by_signal(error: PyProcessError) -> bool:
    """Whether `error` says a child was killed by a signal (a crash, the OOM
    killer, an operator's kill), not that its object raised or it exited."""
    return (
        isinstance(error, PyProcessDiedError)
        and error.exitcode is not None
        and error.exitcode < 0
    )
