"""The Docker image, built and run by a real container engine.

`docker/check.sh` builds the image and runs its default command, plain and
with the DeepMind Lab stand-in packed as a wheel. That takes minutes and
an engine, so these tests run where one answers and the base image is at
hand, and skip, saying why, elsewhere (CI's machines have no engine). The
Dockerfile's text is checked in tests/docs_test.py.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from run_helpers import REPO_ROOT

CHECK = os.path.join(REPO_ROOT, "docker", "check.sh")
TIMEOUT_S = 1800


def _engine() -> str | None:
    result = subprocess.run(
        [os.path.join(REPO_ROOT, "docker", "engine.sh")],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def _base_image() -> str:
    if os.environ.get("PYTHON_IMAGE"):
        return os.environ["PYTHON_IMAGE"]
    with open(os.path.join(REPO_ROOT, "Dockerfile")) as f:
        return re.search(r"^ARG PYTHON_IMAGE=(\S+)", f.read(), re.M).group(1)


@pytest.fixture(scope="module")
def engine() -> str:
    engine = _engine()
    if engine is None:
        pytest.skip("no container engine answers here (docker/engine.sh)")
    base = _base_image()
    present = subprocess.run(
        [engine, "image", "inspect", base], capture_output=True
    ).returncode
    if present != 0:
        pytest.skip(
            f"the base image {base} is not here (and the registry may be out "
            "of reach): make one with docker/local_base.sh and set PYTHON_IMAGE"
        )
    return engine


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, level",
    [([], "atari/pong"), (["--standin-wheel"], "explore_goal_locations_small")],
    ids=["plain", "deepmind-lab-wheel"],
)
def test_the_image_builds_checks_itself_and_trains_then_evaluates(engine, args, level):
    result = subprocess.run(
        [CHECK, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
        env={"DMLAB_DATASET": "skip", **os.environ},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "image check passed" in output
    assert f"the default command trained and evaluated {level}" in output
    assert not [
        n for n in os.listdir(os.path.join(REPO_ROOT, "wheels")) if n.endswith(".whl")
    ], "the stand-in's wheel was left in wheels/"
