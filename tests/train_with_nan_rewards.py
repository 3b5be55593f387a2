"""experiment.py with Atari's family replaced by one that gives a NaN reward
(nan_rewards.py): how tests/fault_test.py shows the NaN guard on a real run.
The same flags as experiment.py; NAN_REWARD_AT_STEP must be set."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nan_rewards  # noqa: E402

import environments  # noqa: E402
import experiment  # noqa: E402
from families import atari  # noqa: E402

environments.register(nan_rewards.FAMILY, replace=atari.FAMILY)

if __name__ == "__main__":
    experiment.run()
