"""What the DeepMind Lab tests share: the real library or the stand-in.

DeepMind Lab is a library the user installs from its own project; machines
without it (CI's among them) run the DeepMind Lab path on the stand-in
package in tests/standin/deepmind_lab, which follows the real API's contract
(its docstring lists what it models and what it does not). A test runs on
one of them through a `DeepMindLab`: the environment variables for the
processes it starts (experiment.py, and through py_process every
environment process) and, for checks inside the test process, `in_process`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from run_helpers import REPO_ROOT

from families import dmlab

STANDIN_DIR = os.path.join(REPO_ROOT, "tests", "standin")
REAL, STANDIN = "real", "stand-in"

NOT_INSTALLED = (
    "DeepMind Lab is not installed: install it from its own project "
    "(https://github.com/google-deepmind/lab, following its documentation) "
    "with dm-env, so that `import deepmind_lab` works; the stand-in variant "
    "of each test runs without it"
)

LEVEL = "explore_goal_locations_small"
FULL_LEVEL = "contributed/dmlab30/" + LEVEL
EPISODE_FRAMES = 5400  # explore_goal_locations_small: 90 s at 60 frames/s
SMALL = ["--agent=shallow", "--unroll_length=20", "--width=96", "--height=72"]
CONFIG = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}


@dataclasses.dataclass(frozen=True)
class DeepMindLab:
    """Which `deepmind_lab` a test runs on, and how to reach it."""

    kind: str  # REAL or STANDIN

    def environ(self, **extra: str) -> dict[str, str]:
        """The environment of a child process that imports this deepmind_lab
        (the stand-in first on its PYTHONPATH); `extra` is added."""
        env = dict(os.environ)
        if self.kind == STANDIN:
            path = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = STANDIN_DIR + (os.pathsep + path if path else "")
        return {**env, **extra}

    def in_process(self, monkeypatch) -> None:
        """Makes `deepmind_lab` importable in this process for one test (the
        stand-in is imported but never asked for a Lab here: the real engine
        allows one per process, and tests start theirs in children)."""
        if self.kind == REAL:
            return
        spec = importlib.util.spec_from_file_location(
            "deepmind_lab", os.path.join(STANDIN_DIR, "deepmind_lab", "__init__.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, "deepmind_lab", module)

    def run(self, args: list[str], timeout: float, **extra: str):
        """Runs `args` (a command line) from the repository root to its end."""
        return subprocess.run(
            args,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.environ(**extra),
        )

    def in_child(self, code: str, **extra: str) -> dict:
        """Runs `code` (which fills `out`, a dict) in a fresh Python with
        this deepmind_lab; returns `out`. Each Lab runs in a child process of
        its own, as in training."""
        program = (
            "import json, sys, time\n"
            "import numpy as np\n"
            "from families import dmlab\n"
            "import environments\n"
            f"CONFIG = {CONFIG!r}\n"
            "out = {}\n" + code + "\nprint('OUT=' + json.dumps(out))\n"
        )
        result = self.run([sys.executable, "-c", program], timeout=180, **extra)
        assert result.returncode == 0, result.stderr[-3000:]
        (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("OUT=")]
        return json.loads(line[len("OUT=") :])


def deepmind_lab(kind: str) -> DeepMindLab:
    """The DeepMind Lab of that kind; skips the test when the real library is
    asked for and not installed."""
    if kind == REAL and not dmlab.deepmind_lab_available():
        pytest.skip(NOT_INSTALLED)
    return DeepMindLab(kind)


def read_trace(path) -> list[dict]:
    """The stand-in's events (see its DEEPMIND_LAB_STANDIN_TRACE)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
