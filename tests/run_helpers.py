"""What the tests that run experiment.py in a subprocess share.

The small configuration (atari/pong, shallow agent, 2 actors, batch 2, unroll 20, 4
action repeats: 160 environment frames per learner update) keeps each run to
seconds on a 2-core machine while still using the real ALE.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "experiment.py")

SMALL = [
    "--level_name=atari/pong",
    "--agent=shallow",
    "--num_actors=2",
    "--batch_size=2",
    "--unroll_length=20",
]
FRAMES_PER_UPDATE = 2 * 20 * 4
RUN_TIMEOUT_S = 150


def command(*args: str) -> list[str]:
    """The command line of experiment.py with `args`."""
    return [sys.executable, SCRIPT, *args]


def run_experiment(*args: str, timeout: float = RUN_TIMEOUT_S):
    """Runs experiment.py to its end; the CompletedProcess (text output)."""
    return subprocess.run(
        command(*args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def run_command_line(*args: str) -> int:
    """experiment.py's mode for the command line `args`, in this process;
    returns its exit code."""
    import experiment

    return experiment.run_mode(experiment.parse_flags(["experiment.py", *args]))


def one_error_line(stderr: str) -> str:
    """The one line experiment.py printed of its own (TensorFlow may print
    others); fails if there is not exactly one, or a traceback."""
    assert "Traceback" not in stderr
    ours = [line for line in stderr.splitlines() if line.startswith("experiment.py:")]
    assert len(ours) == 1, stderr
    return ours[0]


def small_config(logdir: str = "/tmp/agent", **learner_overrides):
    """The SMALL settings as a config.Config, for tests that build the graph
    pieces in-process (no flags involved)."""
    import config

    num_actions = 6  # atari/pong's minimal action set
    return config.Config(
        run=config.RunConfig(logdir=logdir, num_actors=2),
        environment=config.EnvironmentConfig(
            level_name="atari/pong", level_names=("atari/pong",), num_actions=6
        ),
        agent=config.AgentConfig(
            torso="shallow", num_actions=num_actions, use_instruction=False
        ),
        learner=config.LearnerConfig(
            **{
                "batch_size": 2,
                "unroll_length": 20,
                "num_action_repeats": 4,
                "total_environment_frames": 10**6,
                **learner_overrides,
            }
        ),
    )


def run_and_kill_one_environment(args: list[str], log_path, env=None):
    """Runs experiment.py with `args` (two environment processes, a short
    --save_checkpoint_secs), SIGKILLs its first environment process once a
    checkpoint after the first update is written, and waits for the run's
    end. Returns (exit code, the run's output, the killed pid)."""
    import glob
    import re
    import signal
    import time

    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(*args),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.time() + 180
        with open(log_path) as log:
            text = ""
            while not re.search(r"Saving checkpoints for [1-9]\d* ", text):
                assert process.poll() is None and time.time() < deadline, text[-3000:]
                time.sleep(0.2)
                text += log.read()
        children = [
            int(p)
            for path in glob.glob(f"/proc/{process.pid}/task/*/children")
            for p in open(path).read().split()
        ]
        assert len(children) == 2, children
        os.kill(children[0], signal.SIGKILL)
        returncode = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with open(log_path) as log:
        return returncode, log.read(), children[0]
