"""What a new user meets: the progress line, test mode's table, TensorBoard,
and bad input that ends in one line.

- The progress line's format (frames against the target, frames/s, ETA),
  from progress.py directly.
- Bad --logdir and --dataset_path values: exit code 2 and one line naming
  the flag and the value (in-process through experiment.run_mode; the
  subprocess versions, which also show that no traceback is printed, are in
  experiment_test.py's bad-flag runs).
- A --logdir whose disk fills up between checkpoints: a real run on a small
  tmpfs of its own (root only, as in CI), filled while it trains.
- The real TensorBoard, on a loopback port, over a real run's events.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import tensorflow as tf
from run_helpers import (
    REPO_ROOT,
    SMALL,
    command,
    one_error_line,
    run_command_line,
)

from cluster import ports
from learner import progress
from runtime import checkpoints, tf_logging

# -- the progress line ------------------------------------------------------------


def test_progress_line_says_where_the_run_is_against_its_target():
    line = progress.progress_line(7200, 10**9, 720.0, 4.5, [-21.0, -19.0], 1)
    assert line.startswith("frames 7,200 / 1,000,000,000 (0.0 %) | 720 frames/s | ")
    # (1e9 - 7200) / 720 s is 16 days and 2 hours.
    assert "| ETA 16 d 1 h |" in line
    assert "4.50 learner steps/s" in line
    assert "mean return (last 2 episodes) -20.00 | queue 1" in line
    half = progress.progress_line(500_000, 1_000_000, 1000.0, 1.0, [], 0)
    assert "(50.0 %)" in half and "ETA 8 min" in half
    assert "mean return (last 0 episodes) nan" in half
    # A stalled run has no finite ETA.
    assert "ETA ? |" in progress.progress_line(10, 100, 0.0, 0.0, [], 0)


@pytest.mark.parametrize(
    "seconds, expected",
    [(0, "0 s"), (59.4, "59 s"), (60, "1 min"), (3599, "59 min"), (3660, "1 h 01 min")]
    + [(47 * 3600, "47 h 00 min"), (50 * 3600, "2 d 2 h")],
)
def test_format_duration(seconds, expected):
    assert progress.format_duration(seconds) == expected


class _RecordingWriter:
    def __init__(self):
        self.values = []

    def add_summary(self, summary, step):
        self.values += [(v.tag, step, v.simple_value) for v in summary.value]


def test_progress_logger_logs_the_line_and_writes_frames_per_second(caplog):
    caplog.set_level(logging.INFO, logger="absl")  # whatever earlier tests set
    writer = _RecordingWriter()
    logger = progress.ProgressLogger(writer, total_frames=10_000, interval_secs=0.05)
    logger.step(1000, [], 0)  # Counts from here.
    time.sleep(0.1)
    logger.step(2000, [1.0], 1)
    lines = [r.getMessage() for r in caplog.records if "frames 2,000" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert re.match(
        r"frames 2,000 / 10,000 \(20\.0 %\) \| \d+ frames/s \| ETA \S+", lines[0]
    )
    ((tag, step, fps),) = writer.values
    assert tag == "frames_per_second" and step == 2000 and 0 < fps <= 1000 / 0.1


# -- the default run: Pong with the tested command's settings ---------------------------


def fallback_flags(monkeypatch, *args: str):
    """experiment.py's flags for `args` after the fallback, where DeepMind Lab
    is not installed (hidden for the test where it is: a module set to None
    in sys.modules reads as absent)."""
    import experiment

    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    f = experiment.parse_flags(["experiment.py", *args])
    experiment.apply_family_defaults(f)
    return f


def flag_file_values(f) -> dict:
    """Atari's default flag file's values (the fallback's family), parsed as
    its flags parse them."""
    import config as config_lib
    from families import atari

    values = config_lib.read_flag_file(atari.FAMILY.default_flagfiles[0])
    return {name: f[name].parser.parse(value) for name, value in values.items()}


def test_the_default_run_without_deepmind_lab_has_the_tested_pong_commands_settings(
    monkeypatch, caplog
):
    import environments
    import experiment

    caplog.set_level(logging.WARNING, logger="absl")
    f = fallback_flags(monkeypatch)
    expected = flag_file_values(f)
    assert expected.pop("level_name") == "atari/pong" and len(expected) >= 10
    assert {name: f[name].value for name in expected} == expected
    config = experiment.config_from_flags(f, experiment.apply_family_defaults(f))
    assert config.environment.level_name == "atari/pong"
    assert config.agent.torso == expected["agent"]
    assert config.run.num_actors == expected["num_actors"]
    assert config.learner.batch_size == expected["batch_size"]
    assert config.learner.entropy_cost == expected["entropy_cost"]
    assert (
        config.learner.total_environment_frames == expected["total_environment_frames"]
    )
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "DeepMind Lab is not installed" in warning
    assert f"using {environments.FALLBACK_LEVEL!r} instead" in warning
    summary = config.summary()
    (default_file, *_) = environments.family_of("atari/pong").default_flagfiles
    assert f"Atari's defaults from {default_file}" in summary
    assert f"{expected['total_environment_frames']:,} frames" in summary
    experiment.parse_flags(["experiment.py"])


def test_a_command_line_flag_wins_over_the_fallbacks_settings(monkeypatch):
    import experiment

    f = fallback_flags(monkeypatch, "--num_actors=2", "--entropy_cost=0.02")
    expected = flag_file_values(f)
    assert expected["num_actors"] != 2 and expected["entropy_cost"] != 0.02
    assert (f.num_actors, f.entropy_cost) == (2, 0.02)
    assert f.batch_size == expected["batch_size"] and f.agent == expected["agent"]
    experiment.parse_flags(["experiment.py"])


def test_no_fallback_settings_for_test_mode_but_for_a_cluster_task(monkeypatch):
    """Test mode reads the run's record instead; a cluster's task is the
    same experiment as one machine's."""
    import experiment

    f = fallback_flags(monkeypatch, "--mode=test")
    assert not f["batch_size"].present and f.batch_size == 2
    f = fallback_flags(monkeypatch, "--job_name=learner", "--task=0")
    assert f.batch_size == flag_file_values(f)["batch_size"] != 2
    experiment.parse_flags(["experiment.py"])


def test_with_deepmind_lab_the_default_stays_the_references(monkeypatch):
    """The stand-in on the path, as the real library would be: the default
    level and the reference's settings, no flag file."""
    from dmlab_helpers import STANDIN, DeepMindLab

    import environments
    import experiment

    DeepMindLab(STANDIN).in_process(monkeypatch)
    f = experiment.parse_flags(["experiment.py", "--level_cache_dir="])
    assert experiment.apply_family_defaults(f) is None
    config = experiment.config_from_flags(f)
    assert config.environment.level_name == environments.DEFAULT_LEVEL
    assert (config.run.num_actors, config.learner.batch_size) == (4, 2)
    assert config.learner.unroll_length == 100
    assert config.learner.total_environment_frames == 10**9
    experiment.parse_flags(["experiment.py"])


# The default run below: a Pong game of a new agent lasts about 4,600
# frames, so by 16,000 frames each of its two environments has ended one
# (the learner writes an episode's return as it trains on it), which the
# TensorBoard test further down reads from the same run.
DEFAULT_RUN_FRAMES = 16_000


def default_run_frames_per_update() -> int:
    """Batch 2 of Atari's default unroll (its flag file's), 4 frames a step."""
    import config as config_lib
    from families import atari

    values = config_lib.read_flag_file(atari.FAMILY.default_flagfiles[0])
    return 2 * int(values["unroll_length"]) * 4


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`python3 experiment.py` as a newcomer runs it, a short target and a
    small layout on top (and a progress line every second); without
    DeepMind Lab, so on atari/pong; where DeepMind Lab is installed, with
    --level_name=atari/pong (the same run for the TensorBoard test; the
    default-run test skips). (logdir, CompletedProcess, whether the level
    was the default)."""
    from families.contract import importable

    is_default = not importable("deepmind_lab")
    logdir = str(tmp_path_factory.mktemp("default_run") / "run")
    result = subprocess.run(
        command(
            *([] if is_default else ["--level_name=atari/pong"]),
            f"--total_environment_frames={DEFAULT_RUN_FRAMES}",
            "--agent=shallow",
            "--num_actors=1",
            "--envs_per_actor=2",
            "--envs_per_process=2",
            "--batch_size=2",
            "--progress_secs=1",
            f"--logdir={logdir}",
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return logdir, result, is_default


@pytest.mark.slow
def test_the_default_run_ends_with_its_summary_and_the_test_command(default_run):
    """The default run (above) ends in seconds: the first line names the
    flag file and the target; the last says what the run did and how to
    evaluate it. Without DeepMind Lab it trains on atari/pong after one
    warning that says where DeepMind Lab comes from (with DeepMind Lab, on
    its stand-in, dmlab_standin_test)."""
    from families import atari

    logdir, result, is_default = default_run
    if not is_default:
        pytest.skip("DeepMind Lab is installed here: the default is its level")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(
        r"DeepMind Lab is not installed.*using 'atari/pong' instead",
        result.stderr,
    ), result.stderr[-3000:]
    warnings = [ln for ln in result.stderr.splitlines() if "is not installed" in ln]
    assert len(warnings) == 1 and "google-deepmind/lab" in warnings[0], warnings
    (training,) = re.findall(r"\] Training (?!done).*", result.stderr)
    assert "Training atari/pong" in training, training
    assert f"{DEFAULT_RUN_FRAMES:,} frames" in training, training
    flagfile = atari.FAMILY.default_flagfiles[0]
    (unroll,) = re.findall(
        r"^--unroll_length=\d+$", open(os.path.join(REPO_ROOT, flagfile)).read(), re.M
    )
    assert (
        f"Atari's defaults from {flagfile}, its tested command, for the flags "
        f"not given: {unroll}" in training
    ), training
    assert "--agent=shallow" not in training  # given: not the family's
    done = re.search(
        r"Training done: (\d+) environment frames, \d+ episodes in [^;]+; "
        r"mean return of the last \d+ episodes: (-?[\d.]+|none yet); mean policy "
        r"lag (\d+\.\d) updates\. Checkpoint and TensorBoard "
        rf"logs in {re.escape(logdir)}\. Evaluate it: python3 experiment\.py "
        rf"--mode=test --level_name=atari/pong --logdir={re.escape(logdir)}$",
        result.stderr,
        flags=re.M,
    )
    assert done and int(done.group(1)) >= DEFAULT_RUN_FRAMES, result.stderr[-3000:]
    # Fresh unrolls only, no replay: the actors are at most a few updates
    # behind (the queue, the staging area and the unroll itself).
    assert 0.0 < float(done.group(3)) < 10.0, done.group(0)


# -- a quiet start ---------------------------------------------------------------------

BANNERS = ("absl::InitializeLog", "oneDNN custom operations")
# With its verbose log on, TensorFlow's runtime prints this INFO line while it
# is imported, on every CPU. The banners above are not printed everywhere
# (no oneDNN banner where oneDNN is off by default, as on AVX2-only CPUs), so
# the tests below see the filter work on this line on any machine.
VERBOSE = {"TF_CPP_MAX_VLOG_LEVEL": "3"}
ALWAYS_PRINTED = "Register external type id"


def test_visible_lines_keep_errors_and_drop_lower_levels_with_their_continuations():
    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are "
        "written to STDERR\n"
        "I0000 00:00:17.1 15293 port.cc:153] oneDNN custom operations are on.\n"
        "I0000 00:00:17.2 15293 cpu_feature_guard.cc:227] This binary uses\n"
        "To enable the following instructions: AVX2, rebuild TensorFlow.\n"
        "E0000 00:00:17.3 15293 some.cc:1] a real error\n"
        "a line of another program\n"
    )
    level_2 = tf_logging.visible_lines(text, 2)
    assert level_2 == [
        "E0000 00:00:17.3 15293 some.cc:1] a real error\n",
        "a line of another program\n",
    ]
    assert tf_logging.visible_lines(text, 0) == text.splitlines(keepends=True)
    assert len(tf_logging.visible_lines(text, 1)) == 3  # the notice is a warning


def start_up_stderr(tmp_path, **env) -> str:
    """experiment.py's stderr up to its first error (no checkpoint to test)."""
    result = subprocess.run(
        command("--mode=test", "--level_name=atari/pong", f"--logdir={tmp_path}"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=user_environ(**env),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    return result.stderr


def user_environ(**env) -> dict[str, str]:
    """As a user starts a program: without the test set-up's TensorFlow
    variables, with `env`."""
    unset = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    return {**environ, **env}


def tensorflow_import_messages(**env) -> list[str]:
    """What a bare `import tensorflow` logs on this machine (the text of each
    log line, without its time stamp and thread id)."""
    result = subprocess.run(
        [sys.executable, "-c", "import tensorflow"],
        capture_output=True,
        text=True,
        timeout=120,
        env=user_environ(**env),
    )
    return re.findall(r"^[IWEF]\d{4} [^\]]*\] (.*)$", result.stderr, flags=re.M)


def test_start_up_prints_no_tensorflow_banners(tmp_path):
    stderr = start_up_stderr(tmp_path, **VERBOSE)
    hidden = (*BANNERS, ALWAYS_PRINTED)
    assert not [line for line in stderr.splitlines() if any(b in line for b in hidden)]
    assert stderr.splitlines()[0].startswith("experiment.py: error: --logdir=")


def test_the_banners_come_back_with_tf_cpp_min_log_level_0(tmp_path):
    stderr = start_up_stderr(tmp_path, TF_CPP_MIN_LOG_LEVEL="0", **VERBOSE)
    assert ALWAYS_PRINTED in stderr
    # Every line TensorFlow logs at import on this CPU, banners included
    # wherever it prints them, comes back.
    messages = tensorflow_import_messages(TF_CPP_MIN_LOG_LEVEL="0", **VERBOSE)
    assert any(ALWAYS_PRINTED in m for m in messages)
    assert not [m for m in messages if m not in stderr]


KERAS_LEFT_OUT = """
import sys
from runtime import tf_logging
tf_logging.import_tensorflow_quietly()
print("keras imported:", "keras" in sys.modules)
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
weights = tf.compat.v1.get_variable("w", [2])
step = tf.compat.v1.train.RMSPropOptimizer(0.1).minimize(tf.reduce_sum(weights))
import sonnet
print("keras imported:", "keras" in sys.modules)
print("tf.keras:", tf.keras.layers.Dense.__name__)
print("keras imported:", "keras" in sys.modules)
"""


def test_tensorflow_is_imported_without_keras_and_tf_keras_still_works():
    result = subprocess.run(
        [sys.executable, "-c", KERAS_LEFT_OUT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Not by TensorFlow's import, a v1 optimizer or Sonnet; on first use of
    # tf.keras, as TensorFlow's lazy loader imports it.
    assert result.stdout.splitlines() == [
        "keras imported: False",
        "keras imported: False",
        "tf.keras: Dense",
        "keras imported: True",
    ]


# -- bad input: one line, exit code 2 ------------------------------------------------


def test_a_logdir_that_cannot_be_created_is_one_line(capsys):
    # /etc/passwd is a file: nothing can be created below it.
    code = run_command_line("--level_name=atari/pong", "--logdir=/etc/passwd/x")
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--logdir=/etc/passwd/x: cannot write there (Not a directory)" in line


def test_a_logdir_that_cannot_be_written_is_one_line(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes to any directory; the path case above covers root")
    logdir = tmp_path / "read_only"
    logdir.mkdir()
    logdir.chmod(0o500)
    code = run_command_line("--level_name=atari/pong", f"--logdir={logdir}")
    assert code == 2
    assert f"--logdir={logdir}: cannot write there" in one_error_line(
        capsys.readouterr().err
    )


def test_a_missing_dataset_path_is_one_line(tmp_path, capsys):
    missing = tmp_path / "no_such_dataset"
    code = run_command_line(
        "--level_name=atari/pong", f"--logdir={tmp_path}", f"--dataset_path={missing}"
    )
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--dataset_path={missing}: no such directory" in line
    assert os.listdir(tmp_path) == []  # Stopped before writing anything.


# -- a full disk at checkpoint time --------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(path, size_mb: int):
    """A tmpfs of `size_mb` MiB mounted at `path` (root only); unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a small file system (CI has both)")
    os.makedirs(path)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory) -> None:
    """Writes one file into `directory` until its file system is full."""
    block = b"\0" * (1 << 20)
    with (
        contextlib.suppress(OSError),
        open(os.path.join(directory, "ballast"), "wb") as f,
    ):
        while True:
            f.write(block)
            f.flush()


@pytest.mark.slow
def test_a_full_disk_at_checkpoint_time_stops_with_one_line_and_keeps_the_checkpoint(
    tmp_path,
):
    with small_tmpfs(tmp_path / "disk", size_mb=160) as logdir:
        log_path = tmp_path / "run.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                command(
                    *SMALL,
                    f"--logdir={logdir}",
                    "--total_environment_frames=100000000",
                    "--save_checkpoint_secs=2",
                ),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            # Once a checkpoint past step 0 is complete, the disk fills up.
            deadline = time.time() + 120
            while time.time() < deadline and process.poll() is None:
                text = log_path.read_text()
                if re.search(r"after saving checkpoint [1-9]\d*\.\.\.", text):
                    break
                time.sleep(0.2)
            else:
                pytest.fail(
                    f"no checkpoint past step 0:\n{log_path.read_text()[-3000:]}"
                )
            kept = tf.train.latest_checkpoint(str(logdir))
            fill(logdir)
            returncode = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        output = log_path.read_text()
        assert returncode == 2, output[-3000:]
        line = one_error_line(output)
        assert f"--logdir={logdir}: writing a checkpoint failed" in line
        assert "No space left on device" in line
        # The checkpoint the state file named is still named and reads back whole.
        assert tf.train.latest_checkpoint(str(logdir)) == kept
        assert checkpoints.checkpoint_problem(kept) is None
        assert f"the last complete checkpoint, {kept}, is kept" in line


# -- TensorBoard over a real run ---------------------------------------------------


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.mark.slow
def test_tensorboard_serves_the_runs_scalars(default_run):
    """The real TensorBoard over the default run's logdir: the losses (the
    first update's summary), the frames per second (each progress line) and
    each game's return, every point at a frame count after an update."""
    trained_logdir, result, _ = default_run
    assert result.returncode == 0, result.stderr[-3000:]
    per_update = default_run_frames_per_update()
    port = ports.pick_free_ports(1)[0]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            f"--logdir={trained_logdir}",
            "--host=127.0.0.1",
            f"--port={port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}/data/plugin/scalars"
    wanted = {
        "atari/pong/episode_return",
        "total_loss",
        "loss/policy_gradient",
        "loss/baseline",
        "loss/entropy",
        "frames_per_second",
    }
    try:
        deadline, tags = time.time() + 90, {}
        while time.time() < deadline:
            assert server.poll() is None, server.stderr.read()[-3000:]
            try:
                tags = get_json(f"{base}/tags").get(".", {})
            except OSError:
                tags = {}
            if wanted <= set(tags):
                break
            time.sleep(0.5)
        assert wanted <= set(tags), sorted(tags)
        for tag in sorted(wanted):
            query = urllib.parse.urlencode({"run": ".", "tag": tag})
            points = get_json(f"{base}/scalars?{query}")
            assert points, tag
            for _, step, value in points:
                # Every summary's step is the frame count after an update.
                assert step % per_update == 0, (tag, step)
                assert 0 <= step <= DEFAULT_RUN_FRAMES + per_update
                assert value == value, (tag, step)  # not NaN
        returns = get_json(
            f"{base}/scalars?"
            + urllib.parse.urlencode({"run": ".", "tag": "atari/pong/episode_return"})
        )
        assert all(-21 <= value <= 21 for _, _, value in returns)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    # Nothing of the server's group runs on: TensorBoard and its data server
    # (an exited child may stay a zombie until PID 1 reaps it).
    deadline = time.time() + 15
    while live_group_members(server.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert live_group_members(server.pid) == []


def live_group_members(pgid: int) -> list[str]:
    """'pid command' of every process in group `pgid` that is not a zombie."""
    found = []
    for stat_path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat_path) as f:
                name, rest = f.read().rsplit(")", 1)
        except OSError:
            continue  # It ended meanwhile.
        fields = rest.split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(f"{stat_path.split('/')[2]} {name.split('(', 1)[1]}")
    return found
