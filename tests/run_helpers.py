"""What the tests that run experiment.py in a subprocess share.

The small configuration (atari/pong, shallow agent, 2 actors, batch 2, unroll 20, 4
action repeats: 160 environment frames per learner update) keeps each run to
seconds on a 2-core machine while still using the real ALE.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "experiment.py")

SMALL = [
    "--level_name=atari/pong",
    "--agent=shallow",
    "--num_actors=2",
    # One environment an actor: Atari's defaults (its flag file) would give
    # each actor 32 games in one process.
    "--envs_per_actor=1",
    "--envs_per_process=1",
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


def run_at_once(
    commands: dict[str, list[str]], env=None, timeout: float = 180
) -> dict[str, tuple[int, str]]:
    """Runs every command line of `commands` (name -> argv) at the same time
    from the repository root, each mostly waiting for TensorFlow's import;
    returns {name: (exit code, stderr)}. None outlives the call."""
    processes = {}
    try:
        for name, argv in commands.items():
            processes[name] = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        results = {}
        for name, process in processes.items():
            _, stderr = process.communicate(timeout=timeout)
            results[name] = (process.returncode, stderr)
        return results
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def run_command_line(*args: str) -> int:
    """experiment.py's mode for the command line `args`, in this process;
    returns its exit code."""
    import experiment

    return experiment.run_mode(experiment.parse_flags(["experiment.py", *args]))


def resolved_settings(*args: str) -> dict:
    """The settings experiment.py resolves for the command line `args`
    ({name: {"value", "source"}}), as --print_config and a run's record give
    them; in this process, nothing written."""
    import experiment

    f = experiment.parse_flags(["experiment.py", *args])
    _, restored = experiment.restore_from_record(f)
    defaults = experiment.apply_family_defaults(f)
    experiment.validate_flags(f, defaults)
    config = experiment.config_from_flags(f, defaults)
    cluster = experiment.cluster_config_from_flags(f) if f.mode == "train" else None
    return experiment.resolved_settings(f, config, defaults, restored, cluster)


def experiment_values(settings: dict) -> dict:
    """{name: value} of the settings that are the run's (not the process's:
    --mode, --logdir, the cluster's addresses, ...)."""
    from runtime import run_record

    return {
        name: entry["value"]
        for name, entry in settings.items()
        if name not in run_record.PROCESS_SETTINGS
    }


def one_error_line(stderr: str) -> str:
    """The one line experiment.py printed of its own (TensorFlow may print
    others); fails if there is not exactly one, or a traceback."""
    assert "Traceback" not in stderr
    ours = [line for line in stderr.splitlines() if line.startswith("experiment.py:")]
    assert len(ours) == 1, stderr
    return ours[0]


def learner_gone_line(task: str, learner_host: str, bound_secs: int) -> str:
    """The regex of the one line a cluster task prints when it exits 3, its
    learner gone for --learner_lost_secs (`task`: 'actor task 1')."""
    import re

    actor = "actor" in task
    ending = "; its environment processes stopped, exiting" if actor else "; exiting"
    return (
        rf"experiment\.py: error: {task}: no {'learner' if actor else 'chief learner'} "
        rf"at {re.escape(learner_host)} for \d+ s after it was last reached "
        rf"\(--learner_lost_secs={bound_secs}\){ending}\."
    )


def small_config(logdir: str = "/tmp/agent", **learner_overrides):
    """The SMALL settings as a config.Config, for tests that build the graph
    pieces in-process (no flags involved)."""
    import config
    import environments

    num_actions = 6  # atari/pong's minimal action set
    return config.Config(
        run=config.RunConfig(logdir=logdir, num_actors=2),
        environment=config.EnvironmentConfig(
            level_name="atari/pong", level_names=("atari/pong",), num_actions=6
        ),
        agent=config.AgentConfig(
            torso="shallow",
            num_actions=num_actions,
            use_instruction=False,
            **environments.frame_stack_settings(["atari/pong"]),
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


def random_unrolls(specs, count: int, num_actions: int, levels, seed: int = 0) -> list:
    """`count` batch-major unrolls (NumPy) of random data in the shapes of
    `specs` (an ActorOutput of tf.TensorSpec); unroll i is of level
    levels[i % len(levels)], its actions in [0, num_actions)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    unrolls = []
    for i in range(count):

        def fill(spec, i=i):
            shape = spec.shape.as_list()
            if spec.dtype == tf.string:  # the level name; instructions ('')
                text = levels[i % len(levels)].encode() if not shape else b""
                return np.full(shape, text, dtype=object)
            if spec.dtype == tf.uint8:
                return rng.integers(0, 256, shape, dtype=np.uint8)
            if spec.dtype == tf.bool:
                return rng.random(shape) < 0.1
            if spec.dtype.is_integer:
                return rng.integers(0, num_actions, shape).astype(
                    spec.dtype.as_numpy_dtype
                )
            return (3.0 * rng.standard_normal(shape)).astype(np.float32)

        unrolls.append(tf.nest.map_structure(fill, specs))
    return unrolls


def child_pids(pid: int) -> list[int]:
    """The direct children of pid (from /proc/<pid>/task/*/children)."""
    pids = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:
            pass  # The thread ended meanwhile.
    return pids


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    return [p for child in child_pids(pid) for p in (child, *descendants(child))]


def process_exists(pid: int) -> bool:
    """True while pid runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclasses.dataclass
class KilledEnvironmentRun:
    """What run_and_kill_one_environment saw: the run's exit code and
    output, the killed environment process, the processes below each
    environment process when it was killed ({environment pid: pids}), and
    those below the killed one still alive once its restart was logged."""

    returncode: int
    output: str
    killed: int
    started: dict[int, list[int]]
    left_after_restart: list[int]


def run_and_kill_one_environment(args: list[str], log_path, env=None):
    """Runs experiment.py with `args` (two environment processes, a short
    --save_checkpoint_secs, a target it does not reach), SIGKILLs its first
    environment process once a checkpoint after the first update is
    written, waits for the restart and for a checkpoint after it (training
    went on), then stops the run with SIGINT (130 and a final checkpoint:
    the documented stop). Each step waits for its event, not for a time.
    Returns a KilledEnvironmentRun."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(*args),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    left_after_restart = []
    try:
        deadline = time.time() + 180
        with open(log_path) as log:
            text = ""
            while not re.search(r"Saving checkpoints for [1-9]\d* ", text):
                assert process.poll() is None and time.time() < deadline, text[-3000:]
                time.sleep(0.2)
                text += log.read()
            children = child_pids(process.pid)
            assert len(children) == 2, children
            started = {child: descendants(child) for child in children}
            os.kill(children[0], signal.SIGKILL)
            while "environment restarted" not in text and process.poll() is None:
                time.sleep(0.2)
                text += log.read()
            restarted_at = text.find("environment restarted")
            # The restart ends the killed process's group (child_process).
            grace = time.time() + 5
            while time.time() < grace:
                left_after_restart = [
                    p for p in started[children[0]] if process_exists(p)
                ]
                if not left_after_restart:
                    break
                time.sleep(0.2)
            saved = re.compile(r"Saving checkpoints for [1-9]\d* ")
            while (
                restarted_at >= 0
                and process.poll() is None
                and not saved.search(text, restarted_at)
            ):
                assert time.time() < deadline, text[-3000:]
                time.sleep(0.2)
                text += log.read()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        returncode = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with open(log_path) as log:
        return KilledEnvironmentRun(
            returncode, log.read(), children[0], started, left_after_restart
        )
