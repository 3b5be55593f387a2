"""experiment.py with every Atari game played by counted_atari.CountedAtari
(the real environment class, its emulator's calls counted): a game that
ends appends ALE's own frame count and return to $COUNTED_ATARI_LOG.<pid>."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import counted_atari  # noqa: E402

import experiment  # noqa: E402
from families import atari  # noqa: E402

# AtariFamily.environment_class looks the class up here at each call.
atari.PyProcessAtari = counted_atari.CountedAtari

if __name__ == "__main__":
    experiment.run()
