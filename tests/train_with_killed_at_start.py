"""experiment.py with Atari's family replaced by one whose first environment
process is killed while it starts (killed_at_start.py): how the fault tests
show a start-up crash on a real run, single-machine or a cluster task. The
same flags as experiment.py; KILLED_AT_START_MARKER must be set."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import killed_at_start  # noqa: E402

import environments  # noqa: E402
import experiment  # noqa: E402
from families import atari  # noqa: E402

environments.register(killed_at_start.FAMILY, replace=atari.FAMILY)

if __name__ == "__main__":
    experiment.run()
