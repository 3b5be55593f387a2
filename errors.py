"""The errors that end a run, by what the user can do about them.

experiment.py turns each into one line on stderr and an exit code: a
`FlagError` exits 2 (fix the command line), a `TrainingError` exits 1 (the
run cannot go on; the message says what was kept). Modules raise them
without knowing about flags' parsing; the messages name the flag to change.
"""


class FlagError(ValueError):
    """A setting this program cannot run with; the message names the flag,
    the value and the fix."""


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what was kept."""


class EnvironmentFailedError(TrainingError):
    """An actor's environment failed repeatedly, even in fresh processes."""


class NonFiniteUpdateError(TrainingError):
    """A learner step had a NaN/Inf loss or gradient; it was not applied."""


class CheckpointError(TrainingError):
    """--logdir holds checkpoint files, but none of them can be restored."""
