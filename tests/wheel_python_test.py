"""docker/wheel_python.py, the Dockerfile's check that the DeepMind Lab wheel
in wheels/ is for the image's Python, run as the Dockerfile runs it: by this
interpreter, on wheel file names for this Python and for others."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from run_helpers import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "docker", "wheel_python.py")
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"
# A Python the project does not run on, whichever of 3.11-3.13 runs this.
OTHER = "cp310"


def check(tmp_path, name: str) -> subprocess.CompletedProcess:
    wheel = tmp_path / name
    wheel.write_bytes(b"")  # only its name is read
    return subprocess.run(
        [sys.executable, SCRIPT, str(wheel)], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "name",
    [
        f"deepmind_lab-1.0-{CP}-{CP}-linux_x86_64.whl",
        # A build tag; upstream's and dmlab-gym's wheels are CPython-tagged.
        f"deepmind_lab-1.0-1-{CP}-{CP}-manylinux_2_28_x86_64.whl",
        "deepmind_lab-1.0-py3-none-any.whl",  # pure Python, as the stand-in's
    ],
)
def test_a_wheel_for_this_python_passes(tmp_path, name):
    result = check(tmp_path, name)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_a_wheel_for_another_python_is_one_line_naming_both_and_the_fix(tmp_path):
    name = f"deepmind_lab-1.0-{OTHER}-{OTHER}-linux_x86_64.whl"
    result = check(tmp_path, name)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"wheels/{name} is for Python 3.10 (cp310); this image has Python {HERE}: "
        f"bring a deepmind_lab wheel built for Python {HERE} ({CP}), or pass "
        "--build-arg PYTHON_IMAGE="
    )


def test_the_stand_in_wheel_passes(tmp_path):
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    import standin_wheel

    wheel = standin_wheel.build_wheel(str(tmp_path))
    result = subprocess.run(
        [sys.executable, SCRIPT, wheel], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_a_file_that_is_not_a_wheel_is_one_line(tmp_path):
    result = check(tmp_path, "deepmind_lab.whl")
    assert result.returncode == 1
    assert result.stderr == (
        "wheels/deepmind_lab.whl: deepmind_lab.whl is not a wheel's file name\n"
    )
