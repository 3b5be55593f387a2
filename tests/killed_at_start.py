"""Atari whose first environment process is SIGKILLed while it starts: the
environment side of the "killed while it starts" fault tests.

The OOM killer (or an operator) may kill an environment process while its
constructor runs; nothing in a real environment can be made to die there on
cue, so tests/fault_test.py and tests/distributed_test.py train Pong with
this family in Atari's place (tests/train_with_killed_at_start.py registers
it). The first environment constructed in a run (the one that creates the
file KILLED_AT_START_MARKER names, an environment variable of the run)
writes its pid there and SIGKILLs itself; every other one starts as Atari's
does. TF-free: the environment class is imported by the child process.
"""

from __future__ import annotations

import os
import signal

from families import atari

MARKER_VARIABLE = "KILLED_AT_START_MARKER"


class KilledAtStartAtari(atari.PyProcessAtari):
    """PyProcessAtari, except in the run's first environment process."""

    def __init__(self, *args, marker: str, **kwargs):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            super().__init__(*args, **kwargs)
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class KilledAtStartFamily(atari.AtariFamily):
    """Atari's levels, with KilledAtStartAtari as their environment class."""

    def environment_class(self, level_name, seed, is_test=False, **options):
        env_type, kwargs = super().environment_class(
            level_name, seed, is_test, **options
        )
        assert env_type is atari.PyProcessAtari
        kwargs["marker"] = os.environ[MARKER_VARIABLE]
        return KilledAtStartAtari, kwargs


FAMILY = KilledAtStartFamily()
