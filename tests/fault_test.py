"""Fault tests of experiment.py: what a long training run survives.

The end-to-end tests run experiment.py on the real ALE (atari/pong, small
sizes) in subprocesses that share one --logdir, one after the other, so that
each run starts from what the previous one left:

  1. a run to 4000 frames during which one environment process is SIGKILLed
     and the other SIGSTOPped (hung: alive but silent; killed after
     --environment_timeout_secs): both restart, the run reaches its target
     and exits 0;
  2. a resumed run whose learner is SIGKILLed right after a checkpoint;
  3. a rerun: it resumes at that checkpoint's frame count; SIGTERM then
     stops it with a final checkpoint, exit code 143 and no child left;
  4. with the newest checkpoint truncated and NaN rewards (real Pong never
     gives one: train_with_nan_rewards.py runs experiment.py with Atari's
     family replaced by one that gives a NaN reward, nan_rewards.py):
     it resumes from the previous checkpoint with a warning, then stops with
     exit code 1 before the NaN update, leaving that checkpoint's bytes as
     they were.

In-process tests cover what a subprocess cannot show cheaply: checkpoint
selection over damaged files, the NaN guard leaving variables untouched, and
the actor's give-up logic with a fake environment process (a real ALE cannot
be made to fail on every restart). Every subprocess wait has a timeout.
"""

import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types

import nan_rewards
import pytest
import tensorflow as tf
from run_helpers import (
    FRAMES_PER_UPDATE,
    REPO_ROOT,
    RUN_TIMEOUT_S,
    SCRIPT,
    SMALL,
    child_pids,
    process_exists,
)

import py_process
from actor import runner as runner_lib
from actor import supervisor as supervisor_lib
from actor.supervisor import EnvironmentSupervisor
from runtime import checkpoints, child_main, errors
from runtime.shutdown import ShutdownRequest

# The target of the run whose one environment process is killed mid-run.
ENV_KILL_TARGET = 12000
HANG_TIMEOUT_S = 2  # --environment_timeout_secs of the run that hangs one
FAR_TARGET = 10**6  # Runs stopped by a signal or an error never reach it.
WAIT_TIMEOUT_S = 120
NAN_SCRIPT = os.path.join(REPO_ROOT, "tests", "train_with_nan_rewards.py")
KILLED_AT_START_SCRIPT = os.path.join(
    REPO_ROOT, "tests", "train_with_killed_at_start.py"
)


# -- helpers --------------------------------------------------------------------


def environment_pids(pid: int) -> list[int]:
    """pid's environment processes (py_process children)."""
    found = []
    for child in child_pids(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if child_main.BOOTSTRAP.encode() in f.read():
                    found.append(child)
        except OSError:
            pass
    return found


def wait_until_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.time() + timeout
    alive = [p for p in pids if process_exists(p)]
    while alive and time.time() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if process_exists(p)]
    return alive


def checkpoint_steps(logdir: str) -> list[int]:
    """Steps of the checkpoints in logdir (with an index file), ascending."""
    steps = []
    for path in glob.glob(os.path.join(logdir, "model.ckpt-*.index")):
        steps.append(int(re.search(r"-(\d+)\.index$", path).group(1)))
    return sorted(steps)


def latest_step(logdir: str) -> int:
    """The step of the checkpoint the `checkpoint` state file names."""
    latest = tf.train.latest_checkpoint(logdir)
    assert latest, f"no checkpoint in {logdir}: {os.listdir(logdir)}"
    return int(tf.train.load_checkpoint(latest).get_tensor("global_step"))


def checkpoint_files(logdir: str, step: int) -> dict[str, bytes]:
    prefix = os.path.join(logdir, f"model.ckpt-{step}")
    files = {}
    for path in [prefix + ".index", *glob.glob(prefix + ".data-*")]:
        with open(path, "rb") as f:
            files[os.path.basename(path)] = f.read()
    return files


class Run:
    """experiment.py in a subprocess; output to a file that can be polled."""

    def __init__(
        self, logdir: str, name: str, *args: str, script: str = SCRIPT, env=None
    ):
        self.log_path = os.path.join(os.path.dirname(logdir), f"{name}.log")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, script, *SMALL, f"--logdir={logdir}", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.start = time.time()

    def output(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def wait_for(self, pattern: str, timeout: float = WAIT_TIMEOUT_S, after=None):
        """The first match of `pattern` in the output (and `after(match)`)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for match in re.finditer(pattern, self.output()):
                if after is None or after(match):
                    return match
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.kill()
        pytest.fail(
            f"no {pattern!r} in the output (exit code {self.process.returncode}):\n"
            + self.output()[-4000:]
        )

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.process.wait(
                timeout=max(1.0, self.start + timeout - time.time())
            )
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"experiment.py ran over {timeout} s:\n{self.output()[-4000:]}")
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def frames_of(match) -> int:
    return int(match.group(1))


# -- the shared sequence of runs ------------------------------------------------


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fault") / "run")


@pytest.fixture(scope="module")
def env_kill_run(logdir):
    """Trains towards a target it never reaches; after its first checkpoint
    SIGKILLs one environment process and SIGSTOPs the other (a hung
    environment: alive, never answering); once both have been restarted
    and training has written a checkpoint past that point, SIGINT stops it.
    Every wait is for a line of its log, not for a time."""
    run = Run(
        logdir,
        "env_kill",
        f"--total_environment_frames={FAR_TARGET}",
        "--save_checkpoint_secs=2",
        f"--environment_timeout_secs={HANG_TIMEOUT_S}",
    )
    restarted = r"Actor \d \(atari/pong\): environment restarted"
    try:
        # A checkpoint after step 0: the learner is training.
        run.wait_for(r"Saving checkpoints for [1-9]\d* ")
        pids = environment_pids(run.process.pid)
        assert len(pids) == 2, f"environment processes: {pids}"
        killed, stopped = pids
        os.kill(stopped, signal.SIGSTOP)
        os.kill(killed, signal.SIGKILL)
        run.wait_for(
            restarted, after=lambda m: len(re.findall(restarted, run.output())) >= 2
        )
        before = max(
            map(int, re.findall(r"Saving checkpoints for (\d+) ", run.output()))
        )
        run.wait_for(
            r"Saving checkpoints for (\d+) ", after=lambda m: frames_of(m) > before
        )
        run.process.send_signal(signal.SIGINT)
        returncode = run.wait()
    finally:
        run.kill()
    return types.SimpleNamespace(
        returncode=returncode,
        output=run.output(),
        killed=killed,
        stopped=stopped,
        checkpoint_before=before,
    )


@pytest.fixture(scope="module")
def learner_kill_run(logdir, env_kill_run):
    """Resumes, then SIGKILLs the learner just after a new checkpoint."""
    run = Run(
        logdir,
        "learner_kill",
        f"--total_environment_frames={FAR_TARGET}",
        "--save_checkpoint_secs=1",
    )
    try:
        resumed = frames_of(run.wait_for(r"Resuming from a checkpoint at (\d+) "))
        # A checkpoint past the resumed one, whole on disk ('Saving
        # checkpoints for N' comes before N is written).
        run.wait_for(
            r"after saving checkpoint (\d+)",
            after=lambda m: frames_of(m) > resumed + FRAMES_PER_UPDATE,
        )
        children = environment_pids(run.process.pid)
        run.process.kill()
        run.wait()
    finally:
        run.kill()
    return types.SimpleNamespace(
        resumed=resumed,
        children=children,
        checkpoint=latest_step(logdir),
        output=run.output(),
    )


@pytest.fixture(scope="module")
def sigterm_run(logdir, learner_kill_run):
    """Reruns after the SIGKILL, then stops the run with SIGTERM."""
    run = Run(
        logdir,
        "sigterm",
        f"--total_environment_frames={FAR_TARGET}",
        "--save_checkpoint_secs=1",
    )
    try:
        resumed = frames_of(run.wait_for(r"Resuming from a checkpoint at (\d+) "))
        # Once it has trained a little (a checkpoint past the resumed one).
        run.wait_for(
            r"Saving checkpoints for (\d+) ", after=lambda m: frames_of(m) > resumed
        )
        children = environment_pids(run.process.pid)
        run.process.send_signal(signal.SIGTERM)
        returncode = run.wait()
    finally:
        run.kill()
    return types.SimpleNamespace(
        resumed=resumed,
        returncode=returncode,
        children=children,
        output=run.output(),
    )


@pytest.fixture(scope="module")
def damaged_nan_run(logdir, sigterm_run):
    """Truncates the newest checkpoint, then resumes with NaN rewards."""
    steps = checkpoint_steps(logdir)
    assert len(steps) >= 2, steps
    newest, previous = steps[-1], steps[-2]
    data_files = glob.glob(os.path.join(logdir, f"model.ckpt-{newest}.data-*"))
    assert data_files, os.listdir(logdir)
    for path in data_files:
        os.truncate(path, os.path.getsize(path) // 2)
    damaged = checkpoint_files(logdir, newest)
    good = checkpoint_files(logdir, previous)
    # Each environment's reward is NaN at its step 100, the last of its
    # actor's fifth unroll of 20 steps: the four before it fill at least two
    # batches of 2, so the NaN step comes after two good updates at least.
    nan_at = previous + 2 * FRAMES_PER_UPDATE
    run = Run(
        logdir,
        "damaged_nan",
        f"--total_environment_frames={FAR_TARGET}",
        # A resume takes what it is not given from the run's record (the
        # runs before saved every second): the default, so that no save
        # but the start's comes before the NaN.
        "--save_checkpoint_secs=600",
        script=NAN_SCRIPT,
        env={**os.environ, nan_rewards.AT_STEP_VARIABLE: "100"},
    )
    try:
        returncode = run.wait()
    finally:
        run.kill()
    return types.SimpleNamespace(
        newest=newest,
        previous=previous,
        nan_at=nan_at,
        damaged=damaged,
        good=good,
        returncode=returncode,
        output=run.output(),
    )


# -- 1. a killed environment process --------------------------------------------


@pytest.mark.slow
def test_killed_and_hung_environments_restart_and_training_goes_on(
    env_kill_run, logdir
):
    output = env_kill_run.output
    # Stopped by SIGINT once training had gone on past both restarts.
    assert env_kill_run.returncode == 130, output[-4000:]
    assert re.search(
        r"Actor \d \(atari/pong\): environment failed: PyProcess \w+ "
        rf"\(pid {env_kill_run.killed}\) died: killed by signal SIGKILL",
        output,
    ), output[-4000:]
    # The stopped one: killed once the call timed out, then restarted too.
    assert re.search(
        r"Actor \d \(atari/pong\): environment failed: PyProcess \w+ "
        rf"\(pid {env_kill_run.stopped}\) was killed after no answer for "
        rf"{HANG_TIMEOUT_S} s by the parent while running step\(\)",
        output,
    ), output[-4000:]
    # At least the two: on a loaded machine a healthy step may also take
    # longer than HANG_TIMEOUT_S and be restarted as hung, which is the
    # timeout doing its job, not a fault of the test.
    restarts = re.findall(r"Actor \d \(atari/pong\): environment restarted", output)
    assert len(restarts) >= 2, output[-4000:]
    assert not process_exists(env_kill_run.stopped)
    later = re.findall(r"Saving checkpoints for (\d+) ", output)
    assert max(map(int, later)) > env_kill_run.checkpoint_before


@pytest.mark.slow
def test_actor_of_two_environment_processes_survives_one_killed(tmp_path):
    """One actor with two environment processes (--envs_per_actor=4, 2 per
    process): one of them is SIGKILLed mid-run while it holds two
    environments; that one restarts, training reaches its target and every
    environment process is gone afterwards. (One environment a process is
    the killed-environment runs above.)"""
    run = Run(
        str(tmp_path / "run"),
        "vector_env_kill",
        "--num_actors=1",
        "--envs_per_actor=4",
        "--envs_per_process=2",
        f"--total_environment_frames={ENV_KILL_TARGET}",
        "--save_checkpoint_secs=2",
    )
    try:
        run.wait_for(r"Saving checkpoints for [1-9]\d* ")
        pids = environment_pids(run.process.pid)
        assert len(pids) == 2, f"environment processes: {pids}"
        os.kill(pids[0], signal.SIGKILL)
        returncode = run.wait()
    finally:
        run.kill()
    output = run.output()
    assert returncode == 0, output[-4000:]
    assert "1 actor x 4 environments (2 per" in output
    assert re.search(
        rf"Actor 0 \(atari/pong\): environment failed: PyProcess \w+ "
        rf"\(pid {pids[0]}\) died: killed by signal SIGKILL",
        output,
    ), output[-4000:]
    restarted = re.findall(
        r"Actor 0 \(atari/pong\): environment restarted \(pid (\d+)\)", output
    )
    assert len(restarted) == 1 and int(restarted[0]) not in pids, output[-4000:]
    done = re.search(r"Training done: (\d+) environment frames", output)
    assert done and int(done.group(1)) >= ENV_KILL_TARGET, output[-3000:]
    assert wait_until_gone([pids[1], int(restarted[0])]) == []


def restarts_in_tensorboard(logdir: str) -> list[float]:
    restarts = []
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            restarts += [
                v.simple_value
                for v in event.summary.value
                if v.tag == "environment_restarts"
            ]
    return sorted(restarts)


@pytest.mark.slow
def test_environment_restarts_go_to_tensorboard(env_kill_run, logdir):
    # One value per restart, the running count: 1, 2 and (where a loaded
    # machine's slow step was also taken for hung) more.
    restarts = restarts_in_tensorboard(logdir)
    assert restarts[:2] == [1.0, 2.0]
    assert restarts == [float(n) for n in range(1, len(restarts) + 1)]


@pytest.mark.slow
def test_an_environment_killed_while_it_starts_is_restarted_and_counted(tmp_path):
    """The OOM killer may strike while an environment starts: the actor's
    supervisor restarts it as it restarts one killed mid-run (the same
    back-off, the same count, in TensorBoard too) and training reaches its
    target (killed_at_start.py kills the run's first environment process)."""
    logdir, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    run = Run(
        logdir,
        "killed_at_start",
        "--total_environment_frames=2000",
        script=KILLED_AT_START_SCRIPT,
        env=dict(os.environ, KILLED_AT_START_MARKER=marker),
    )
    returncode, output = run.wait(), run.output()
    assert returncode == 0, output[-3000:]
    with open(marker) as f:
        killed = int(f.read())
    assert re.search(
        rf"Actor \d \(atari/pong\): environment failed: PyProcess "
        rf"KilledAtStartAtari \(pid {killed}\) died: killed by signal SIGKILL "
        rf"\(while constructing KilledAtStartAtari\)\. Restarting the environment",
        output,
    ), output[-3000:]
    assert "training continues (1 environment restart(s) in this run)" in output
    assert "Training done: " in output
    assert restarts_in_tensorboard(logdir) == [1.0]


# -- 2 and 3. a SIGKILLed learner, a rerun, SIGTERM ----------------------------


@pytest.mark.slow
def test_sigkilled_learner_leaves_no_environment_process(learner_kill_run):
    assert len(learner_kill_run.children) == 2
    # The kernel kills them with the learner (PR_SET_PDEATHSIG).
    assert not wait_until_gone(learner_kill_run.children)


@pytest.mark.slow
def test_rerun_after_sigkill_resumes_from_the_last_checkpoint(
    learner_kill_run, sigterm_run
):
    assert learner_kill_run.checkpoint > learner_kill_run.resumed
    assert sigterm_run.resumed == learner_kill_run.checkpoint, sigterm_run.output[
        -3000:
    ]


@pytest.mark.slow
def test_sigterm_saves_a_final_checkpoint_and_exits_143(sigterm_run, logdir):
    output = sigterm_run.output
    assert sigterm_run.returncode == 128 + signal.SIGTERM, output[-4000:]
    stopped = re.search(
        r"Training stopped by SIGTERM at (\d+) frames; checkpoint saved to "
        r"(\S+)\.",
        output,
    )
    assert stopped, output[-4000:]
    frames, checkpoint = int(stopped.group(1)), stopped.group(2)
    assert frames > sigterm_run.resumed
    assert checkpoint == os.path.join(logdir, f"model.ckpt-{frames}")
    assert latest_step(logdir) == frames


@pytest.mark.slow
def test_sigterm_leaves_no_child_process(sigterm_run):
    assert len(sigterm_run.children) == 2
    # Ended and reaped by experiment.py itself, before it exited.
    assert not [p for p in sigterm_run.children if process_exists(p)]
    assert "did not exit" not in sigterm_run.output


# -- 4. a truncated newest checkpoint, then a NaN -------------------------------


@pytest.mark.slow
def test_damaged_newest_checkpoint_resumes_from_the_previous_with_a_warning(
    damaged_nan_run,
):
    output = damaged_nan_run.output
    assert re.search(
        rf"Checkpoint \S+model\.ckpt-{damaged_nan_run.newest} \(.*\) cannot be "
        rf"restored: resuming from the previous checkpoint "
        rf"\S+model\.ckpt-{damaged_nan_run.previous} instead",
        output,
    ), output[-4000:]
    assert f"Resuming from a checkpoint at {damaged_nan_run.previous} " in output, (
        output[-4000:]
    )


@pytest.mark.slow
def test_nan_stops_training_before_the_update_with_exit_1(damaged_nan_run, logdir):
    output = damaged_nan_run.output
    assert damaged_nan_run.returncode == 1, output[-4000:]
    error = re.search(
        r"experiment.py: error: NaN or infinite loss or gradient in the learner "
        r"step at (\d+) environment frames .*the last checkpoint, (\S+), holds",
        output,
    )
    assert error, output[-4000:]
    assert int(error.group(1)) >= damaged_nan_run.nan_at
    assert error.group(2).endswith(f"model.ckpt-{damaged_nan_run.previous}")


@pytest.mark.slow
def test_nan_leaves_the_last_good_checkpoint_intact(damaged_nan_run, logdir):
    # The state file names the good checkpoint, whose bytes are unchanged
    # (it was only re-saved with the same values at the session's start).
    assert latest_step(logdir) == damaged_nan_run.previous
    assert checkpoint_files(logdir, damaged_nan_run.previous) == damaged_nan_run.good
    # Nothing newer was saved; the damaged files were left as they were.
    assert checkpoint_steps(logdir)[-1] == damaged_nan_run.newest
    assert checkpoint_files(logdir, damaged_nan_run.newest) == damaged_nan_run.damaged


# -- in-process: checkpoint selection -------------------------------------------


def save_checkpoints(logdir: str, steps: list[int]) -> None:
    """Checkpoints of a two-variable graph at `steps`, with checkpoint_saver."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.Variable(tf.ones([64]), name="weights")
        saver = checkpoints.checkpoint_saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in steps:
                session.run(step.assign(value))
                saver.save(session, os.path.join(logdir, "model.ckpt"), value)


def resume_in_graph(logdir: str):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.Variable(tf.ones([64]), name="weights")
        return checkpoints.resume_checkpoint(logdir, "--agent=test")


def test_resume_checkpoint_of_a_new_run_is_none(tmp_path):
    assert resume_in_graph(str(tmp_path)) is None


def test_resume_checkpoint_skips_damaged_ones(tmp_path, caplog):
    logdir = str(tmp_path)
    save_checkpoints(logdir, [10, 20, 30])
    with open(os.path.join(logdir, "model.ckpt-30.index"), "r+b") as f:
        f.truncate(10)
    os.remove(os.path.join(logdir, "model.ckpt-20.data-00000-of-00001"))
    before = sorted(os.listdir(logdir))
    assert resume_in_graph(logdir) == os.path.join(logdir, "model.ckpt-10")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("model.ckpt-30" in w and "model.ckpt-10" in w for w in warnings)
    assert any("model.ckpt-20" in w for w in warnings)
    assert tf.train.latest_checkpoint(logdir).endswith("model.ckpt-10")
    assert sorted(os.listdir(logdir)) == before  # Nothing deleted.


def test_resume_checkpoint_never_starts_over_a_run(tmp_path):
    logdir = str(tmp_path)
    save_checkpoints(logdir, [10, 20])
    for path in glob.glob(os.path.join(logdir, "*.data-*")):
        os.truncate(path, 0)
    before = sorted(os.listdir(logdir))
    with pytest.raises(errors.CheckpointError) as raised:
        resume_in_graph(logdir)
    assert "model.ckpt-10" in str(raised.value)
    assert "model.ckpt-20" in str(raised.value)
    assert sorted(os.listdir(logdir)) == before


def test_state_file_naming_missing_files_is_an_error(tmp_path):
    logdir = str(tmp_path)
    save_checkpoints(logdir, [10])
    for path in glob.glob(os.path.join(logdir, "model.ckpt-10.*")):
        os.remove(path)
    with pytest.raises(errors.CheckpointError, match="model.ckpt-10"):
        resume_in_graph(logdir)


# -- in-process: giving up on an environment -------------------------------------


class FakeEnvProcess:
    """Stands in for a PyProcess: a real ALE cannot be made to fail on every
    restart. `alive` is False after a failure until a restart succeeds."""

    def __init__(self, restarts_fail: bool):
        self.alive = True
        self.pid = 1
        self.restarts_fail = restarts_fail
        self.restarts = 0

    def restart(self):
        self.restarts += 1
        if self.restarts_fail:
            raise py_process.PyProcessRemoteError(
                "PyProcess FakeEnv (pid 2): the constructor FakeEnv(...) raised "
                "ValueError: no such level",
                "ValueError",
                "no such level",
                "",
            )
        self.alive = True

    def close(self):
        self.alive = False


class FakeSession:
    """Runs 'enqueue' by calling `enqueue()`; records every op it runs."""

    def __init__(self, enqueue):
        self.enqueue = enqueue
        self.ran = []

    def run(self, op):
        self.ran.append(op)
        if op == "enqueue":
            self.enqueue()


def run_actor(process, enqueue, monkeypatch, timeout: float = 10):
    """Runs an ActorRunner over `process` (a FakeEnvProcess, or a tuple of
    them for an actor of several environments) until its thread ends."""
    monkeypatch.setattr(supervisor_lib, "ENV_RESTART_DELAY_SECS", 0.01)
    processes = process if isinstance(process, tuple) else (process,)
    actor = runner_lib.Actor(0, "atari/pong", processes, None, "enqueue", "reset_actor")
    runner = runner_lib.ActorRunner(actor)
    session = FakeSession(enqueue)
    coord = tf.train.Coordinator()
    runner.start(session, coord)
    runner.thread.join(timeout)
    assert not runner.thread.is_alive()
    return runner, session, coord


def dies(process: FakeEnvProcess):
    process.alive = False
    raise tf.errors.UnknownError(
        None,
        None,
        "PyProcessDiedError: PyProcess AtariEnv (pid 1) died: killed by signal "
        "SIGKILL (while running step())",
    )


def test_actor_restarts_its_environment_and_goes_on(monkeypatch):
    process = FakeEnvProcess(restarts_fail=False)
    calls = []

    def enqueue():
        calls.append(1)
        if len(calls) in (2, 4, 5):  # Fails twice in a row at most.
            dies(process)
        if len(calls) == 8:
            raise tf.errors.CancelledError(None, None, "queue closed")

    runner, session, coord = run_actor(process, enqueue, monkeypatch)
    assert not coord.should_stop()
    assert process.restarts == runner.environment_restarts == 3
    assert session.ran.count("reset_actor") == 3
    assert runner.unrolls == 4  # 8 unrolls: 3 dropped, the last one cancelled.


def test_actor_of_several_environments_restarts_only_the_failed_one(monkeypatch):
    processes = tuple(FakeEnvProcess(restarts_fail=False) for _ in range(3))
    calls = []

    def enqueue():
        calls.append(1)
        if len(calls) == 2:
            dies(processes[1])
        if len(calls) == 4:
            raise tf.errors.CancelledError(None, None, "queue closed")

    runner, session, coord = run_actor(processes, enqueue, monkeypatch)
    assert not coord.should_stop()
    assert [p.restarts for p in processes] == [0, 1, 0]
    assert runner.environment_restarts == 1
    # The whole actor is reset: every environment's initial() runs again.
    assert session.ran.count("reset_actor") == 1
    assert runner.unrolls == 2


def test_actor_gives_up_after_repeated_failures(monkeypatch):
    process = FakeEnvProcess(restarts_fail=True)
    runner, _, coord = run_actor(process, lambda: dies(process), monkeypatch)
    assert coord.should_stop()
    with pytest.raises(errors.EnvironmentFailedError) as raised:
        coord.raise_requested_exception()
    message = str(raised.value)
    assert "actor 0 (atari/pong) failed 3 times in a row" in message
    assert "no such level" in message
    assert process.restarts == 2  # Failure 1, failed restart 2, failed restart 3.


class FakeUnrollSession:
    """Runs a cluster actor task's 'output' op by calling `unroll()`."""

    def __init__(self, unroll):
        self.unroll = unroll
        self.ran = []

    def run(self, op):
        self.ran.append(op)
        if op == "output":
            return self.unroll()
        return None


def cluster_actor_unroll(failures: int, monkeypatch):
    """A cluster actor task's `_unroll` over a FakeEnvProcess whose
    environment dies `failures` times in a row before an unroll completes;
    returns (what _unroll returned or raised, the process, the session)."""
    from cluster import actor_task

    monkeypatch.setattr(supervisor_lib, "ENV_RESTART_DELAY_SECS", 0.01)
    process = FakeEnvProcess(restarts_fail=False)
    supervisor = EnvironmentSupervisor(
        0, "atari/pong", (process,), after_giving_up="This actor task stopped. "
    )
    ops = actor_task.ActorTaskOps(
        sync_weights=None,
        output="output",
        state_initializer="reset_actor",
        placeholders=None,
        enqueue=None,
        training_done=None,
        confirm_finished=None,
        uninitialized=None,
        learner_tasks=None,
        settings="",
        chiefs_settings=None,
    )
    calls = []

    def unroll():
        calls.append(1)
        if len(calls) <= failures:
            dies(process)
        return "unroll"

    session = FakeUnrollSession(unroll)
    try:
        result = actor_task._unroll(session, ops, supervisor, ShutdownRequest())
    except errors.EnvironmentFailedError as e:
        result = e
    return result, process, session, supervisor


def test_a_cluster_actor_task_survives_two_environment_failures(monkeypatch):
    """The cluster actor task restarts its environment as the single-machine
    actor does (the same EnvironmentSupervisor): two failures in a row, each
    restarted after its back-off, then the unroll goes through."""
    result, process, session, supervisor = cluster_actor_unroll(2, monkeypatch)
    assert result == "unroll"
    assert process.restarts == supervisor.environment_restarts == 2
    assert session.ran.count("reset_actor") == 2
    assert supervisor.failures_in_a_row == 0  # the unroll completed


def test_a_cluster_actor_task_gives_up_at_the_third_failure_in_a_row(monkeypatch):
    result, process, _, _ = cluster_actor_unroll(3, monkeypatch)
    assert isinstance(result, errors.EnvironmentFailedError)
    message = str(result)
    assert "actor 0 (atari/pong) failed 3 times in a row" in message
    assert "This actor task stopped." in message
    assert process.restarts == 2


def test_shutdown_request_is_noticed_by_its_watcher_thread():
    shutdown = ShutdownRequest()
    previous = signal.getsignal(signal.SIGTERM)
    with shutdown.handling_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        # The Python-level handler does nothing: the watcher thread, reading
        # the wakeup fd, sets `requested` (also while the main thread is
        # inside session.run).
        deadline = time.time() + 5
        while not shutdown.requested and time.time() < deadline:
            threading.Event().wait(0.05)
    assert shutdown.requested and shutdown.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) == previous  # Restored.
