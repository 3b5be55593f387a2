"""experiment.py with the toy family registered: how a researcher runs a
family of their own without touching the project (the script registers it,
then hands over to experiment.py's command line, whose flags now include
the family's own)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import toy_family  # noqa: E402

import environments  # noqa: E402
import experiment  # noqa: E402

environments.register(toy_family.FAMILY)

if __name__ == "__main__":
    experiment.run()
