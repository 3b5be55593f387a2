"""End-to-end tests of experiment.py on the real ALE (atari/pong).

Training, resuming and test mode run experiment.py in subprocesses with small
sizes (2 actors, batch 2, unroll 20, the shallow agent, about 2000 frames);
the learning check and flag checks run in-process (the pieces built from
config objects; the command line parsed with experiment.parse_flags). Every
subprocess has a timeout, so a hang fails the test instead of stalling CI.
"""

import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types

import imageio.v3 as iio
import numpy as np
import pytest
import tensorflow as tf
from run_helpers import (
    FRAMES_PER_UPDATE,
    REPO_ROOT,
    RUN_TIMEOUT_S,
    SMALL,
    command,
    one_error_line,
    run_at_once,
    run_command_line,
    run_experiment,
    small_config,
)

import agent as agent_lib
import environments
import experiment
import py_process
import trajectory
from actor import runner
from actor.envs import create_flow_environment
from actor.unroll import actor_output_specs, build_actor, build_vector_actor
from evaluation import test_mode
from families import atari, atari57, dmlab
from learner import pipeline, progress
from learner.loss import clip_rewards
from learner.update import build_learner
from runtime import checkpoints
from runtime.errors import FlagError
from trajectory import ActorOutput

FLAGS = experiment.FLAGS
# Pong's frames, stacked by the agent as in training.
PONG_STACK = environments.frame_stack_settings(["atari/pong"])
UNROLL = 20  # SMALL's --unroll_length

COUNTED_ATARI_SCRIPT = os.path.join(REPO_ROOT, "tests", "run_with_counted_atari.py")

FIRST_TARGET = 2000
SECOND_TARGET = 3000


def expected_frames(target: int, start: int = 0) -> int:
    """The frame count after training from `start` until >= target."""
    updates = -(-(target - start) // FRAMES_PER_UPDATE)  # ceil
    return start + updates * FRAMES_PER_UPDATE


def saved_frames(logdir: str) -> int:
    reader = tf.train.load_checkpoint(logdir)
    return int(reader.get_tensor("global_step"))


def summary_tags(logdir: str) -> set[str]:
    tags = set()
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


# -- sockets --------------------------------------------------------------------


def _process_tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/<pid>/task/*/children)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for children in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                with open(children) as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass  # The task ended meanwhile.
    return pids


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _open_ports() -> dict[str, str]:
    """inode -> 'proto local_address' for TCP listeners and bound UDP sockets."""
    ports = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{proto}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if proto.startswith("udp") or state == "0A":  # 0A: TCP_LISTEN
                ports[inode] = f"{proto} {local}"
    return ports


def listening_sockets(pid: int) -> list[str]:
    """The open network ports held by pid or its descendants."""
    ports = _open_ports()
    found = []
    for p in _process_tree(pid):
        for inode in _socket_inodes(p):
            if inode in ports:
                found.append(f"pid {p}: {ports[inode]}")
    return found


# -- the training run shared by several tests -----------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short training run; scans for open ports while it trains."""
    logdir = str(tmp_path_factory.mktemp("train"))
    log_path = os.path.join(logdir, "stderr.txt")
    start = time.time()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(
                *SMALL,
                f"--logdir={logdir}",
                f"--total_environment_frames={FIRST_TARGET}",
            ),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        sockets, scans = [], 0
        try:
            # The session exists once the first checkpoint (step 0) is
            # written; scan from then until the run ends.
            while process.poll() is None and time.time() - start < RUN_TIMEOUT_S:
                if os.path.exists(os.path.join(logdir, "checkpoint")):
                    sockets += listening_sockets(process.pid)
                    scans += 1
                time.sleep(0.2)
            returncode = process.wait(
                timeout=max(1, RUN_TIMEOUT_S - (time.time() - start))
            )
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    with open(log_path) as f:
        output = f.read()
    return types.SimpleNamespace(
        logdir=logdir,
        returncode=returncode,
        output=output,
        sockets=sockets,
        scans=scans,
    )


@pytest.mark.slow
def test_training_exits_0_with_checkpoint_events_and_frames(trained):
    assert trained.returncode == 0, trained.output[-3000:]
    assert tf.train.latest_checkpoint(trained.logdir)
    assert saved_frames(trained.logdir) == expected_frames(FIRST_TARGET)
    tags = summary_tags(trained.logdir)
    for tag in ("total_loss", "learning_rate", "loss/baseline", "policy_entropy"):
        assert tag in tags, sorted(tags)
    assert "Traceback" not in trained.output
    # The fallback warning is for the default level only, not an explicit one.
    assert "DeepMind Lab is not installed" not in trained.output


@pytest.mark.slow
def test_single_machine_training_opens_no_listening_socket(trained):
    assert trained.returncode == 0, trained.output[-3000:]
    assert trained.scans > 0, "the run ended before a scan could happen"
    assert trained.sockets == []


@pytest.mark.slow
def test_rerun_resumes_from_checkpoint(trained):
    first = saved_frames(trained.logdir)
    result = run_experiment(
        *SMALL,
        f"--logdir={trained.logdir}",
        f"--total_environment_frames={SECOND_TARGET}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from a checkpoint at {first} environment frames" in result.stderr
    assert saved_frames(trained.logdir) == expected_frames(SECOND_TARGET, first)


@pytest.mark.slow
def test_test_mode_plays_an_episode_and_writes_json(trained, tmp_path):
    # On a copy at another path: the checkpoint state file names its files
    # relative to the logdir, so a moved run still finds them.
    with open(os.path.join(trained.logdir, "checkpoint")) as f:
        assert trained.logdir not in f.read()
    moved = str(tmp_path / "moved")
    shutil.copytree(trained.logdir, moved)
    # The real environment class with its emulator's calls counted
    # (tests/counted_atari.py): each game that ends appends ALE's own frame
    # count and return to counted.<pid>.
    counted = str(tmp_path / "counted")
    result = subprocess.run(
        [
            sys.executable,
            COUNTED_ATARI_SCRIPT,
            *SMALL,
            f"--logdir={moved}",
            "--mode=test",
            "--test_num_episodes=1",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=dict(os.environ, COUNTED_ATARI_LOG=counted),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"from {moved}/model.ckpt-" in result.stderr
    with open(os.path.join(moved, test_mode.TEST_RESULTS_FILE)) as f:
        results = json.load(f)
    pong = results["levels"]["atari/pong"]
    assert len(pong["returns"]) == len(pong["episode_steps"]) == 1
    # The episode as the environment counted it: the first game its one
    # process ended. Its return is the sum of ALE's rewards; its length in
    # agent steps is the number of steps the environment took; ALE's own
    # frame count is the no-op start and 4 frames a step (the last step's
    # repeats stop at the game's end).
    (log,) = glob.glob(counted + ".*")
    with open(log) as f:
        game = json.loads(f.readline())
    assert pong["returns"] == [float(game["ale_return"])]
    assert pong["episode_steps"] == [game["steps"]]
    assert game["ale_return"] in range(-21, 22)  # one side reached 21
    steps, noops = game["steps"], game["noops"]
    assert 0 <= noops <= atari.DEFAULT_NOOP_MAX
    assert noops + 4 * (steps - 1) < game["ale_frames"] <= noops + 4 * steps
    assert "mean return" in result.stderr
    # The table on stdout: a header, a rule, and Pong's row with its
    # human-normalised score (Pong is one of the Atari-57 games).
    header, rule, row = result.stdout.strip().splitlines()[-3:]
    assert header.split() == [
        "level",
        "episodes",
        "mean",
        "return",
        "human-normalised",
        "%",
    ]
    assert set(rule) <= {"-", " "}
    level, episodes, mean_return, score = row.split()
    assert (level, episodes) == ("atari/pong", "1")
    assert float(mean_return) == pytest.approx(pong["mean_return"], abs=0.01)
    assert float(score) == pytest.approx(
        atari57.human_normalized_score("pong", pong["returns"]), abs=0.1
    )


@pytest.mark.slow
def test_exported_weights_play_in_test_mode_and_write_a_video(trained, tmp_path):
    weights = str(tmp_path / "weights")
    checkpoints.export_weights(trained.logdir, weights)
    saved = dict(tf.train.list_variables(weights))
    trained_variables = dict(tf.train.list_variables(trained.logdir))
    # The agent's weights, each as trained, and nothing else.
    assert saved and all(checkpoints.is_weight(name) for name in saved)
    assert saved == {
        n: s for n, s in trained_variables.items() if checkpoints.is_weight(n)
    }
    assert any("RMSProp" in name for name in trained_variables)
    prefix = tf.train.latest_checkpoint(weights)
    assert prefix.endswith(f"model.ckpt-{saved_frames(trained.logdir)}")
    for name in saved:
        np.testing.assert_array_equal(
            tf.train.load_variable(weights, name),
            tf.train.load_variable(trained.logdir, name),
        )

    videos = tmp_path / "videos"
    # The README's command for pretrained weights: no --agent (the default
    # is deep); test mode reads the torso from the checkpoint.
    result = run_experiment(
        "--level_name=atari/pong",
        f"--logdir={weights}",
        "--mode=test",
        "--test_num_episodes=2",
        f"--test_video_dir={videos}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with the agent it holds: --agent=shallow --use_lstm=true" in result.stderr
    with open(os.path.join(weights, test_mode.TEST_RESULTS_FILE)) as f:
        first_return = json.load(f)["levels"]["atari/pong"]["returns"][0]
    # One GIF: the first episode, its return in the name.
    (gif,) = videos.iterdir()
    assert gif.name == f"atari_pong_return{first_return:+g}.gif"
    pictures = iio.imread(gif, index=None)
    # A Pong game has at least 21 points of a few dozen agent steps each;
    # the GIF writer merges identical consecutive frames, so fewer than the
    # episode's steps can come back.
    assert 200 <= len(pictures) <= 27000
    assert pictures.shape[1:3] == (252, 252)  # 84 x 84, enlarged 3x
    assert pictures.dtype == np.uint8
    assert len(np.unique(pictures)) > 2  # a picture, not a blank


@pytest.mark.slow
def test_training_on_exported_weights_is_a_clear_error(trained, tmp_path, capsys):
    weights = str(tmp_path / "weights")
    checkpoints.export_weights(trained.logdir, weights)
    code = run_command_line(*SMALL, f"--logdir={weights}")
    assert code == 2
    check_one_error_line(capsys.readouterr().err, "weights only")
    # And a second export onto it writes nothing.
    with pytest.raises(FlagError, match="already holds a checkpoint"):
        checkpoints.export_weights(trained.logdir, weights)


@pytest.mark.slow
def test_unwritable_video_dir_is_a_clear_error(trained, tmp_path, capsys):
    weights = str(tmp_path / "weights")
    checkpoints.export_weights(trained.logdir, weights)
    code = run_command_line(
        *SMALL, f"--logdir={weights}", "--mode=test", "--test_video_dir=/etc/passwd/x"
    )
    assert code == 2
    check_one_error_line(capsys.readouterr().err, "--test_video_dir=/etc/passwd/x")
    assert not os.path.exists(os.path.join(weights, test_mode.TEST_RESULTS_FILE))


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--agent=deep", "--use_lstm=false"])
def test_checkpoint_of_another_agent_is_a_clear_error(trained, capsys, flag):
    # The flag given (test mode reads the torso and the core from the
    # checkpoint only when it is not); the run was shallow, with the LSTM (a
    # feed-forward agent's heads are wider).
    code = run_command_line(
        "--level_name=atari/pong", f"--logdir={trained.logdir}", "--mode=test", flag
    )
    assert code == 2
    err = capsys.readouterr().err
    # Refused by the run's record before the checkpoint is read.
    check_one_error_line(err, "the run in this --logdir was trained with")
    assert flag in err


@pytest.mark.slow
def test_feed_forward_agent_trains_and_test_mode_reads_it_from_the_checkpoint(
    tmp_path,
):
    """--use_lstm=false end to end: training writes a checkpoint without the
    LSTM core, and test mode without the flag (default true) plays with it:
    from the run's record, and, in a logdir without one (a run made before
    records), from the checkpoint, saying so."""
    logdir = str(tmp_path / "ff")
    result = run_experiment(
        *SMALL,
        "--use_lstm=false",
        f"--logdir={logdir}",
        "--total_environment_frames=800",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    names = [name for name, _ in tf.train.list_variables(logdir)]
    assert any(n.startswith("agent/shallow_torso/") for n in names)
    assert not any("core_lstm" in n for n in names)
    assert checkpoints.saved_agent(logdir, ())[1] is False
    from runtime import run_record

    assert run_record.read(logdir)["settings"]["use_lstm"]["value"] is False
    os.remove(os.path.join(logdir, run_record.RECORD_FILE))
    result = run_experiment(
        "--level_name=atari/pong",
        f"--logdir={logdir}",
        "--mode=test",
        "--test_num_episodes=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with the agent it holds: --agent=shallow --use_lstm=false" in result.stderr
    with open(os.path.join(logdir, test_mode.TEST_RESULTS_FILE)) as f:
        (episode_return,) = json.load(f)["levels"]["atari/pong"]["returns"]
    assert -21 <= episode_return <= 21


# -- bad flags: one line, non-zero exit, no traceback ---------------------------


# Run as real processes (exit status, no traceback); the others in-process.
BAD_FLAG_PROCESSES = {
    "unknown_level": (
        ["--level_name=atari/not_a_game"],
        "--level_name='atari/not_a_game'",
    ),
    "zero_batch": (["--level_name=atari/pong", "--batch_size=0"], "--batch_size=0"),
    # Once a FailedPreconditionError traceback from TensorFlow.
    "logdir_below_a_file": (
        ["--level_name=atari/pong", "--logdir=/etc/passwd/x"],
        "--logdir=/etc/passwd/x: cannot write there",
    ),
    "missing_dataset": (
        ["--level_name=atari/pong", "--dataset_path=/nonexistent/dmlab_data"],
        "--dataset_path=/nonexistent/dmlab_data: no such directory",
    ),
}


@pytest.fixture(scope="module")
def bad_flag_runs(tmp_path_factory):
    """The bad-flag processes at once (each mostly waits for TF's import)."""
    return run_at_once(
        {
            name: command(f"--logdir={tmp_path_factory.mktemp(name)}", *args)
            for name, (args, _) in BAD_FLAG_PROCESSES.items()
        },
        timeout=120,
    )


def check_one_error_line(stderr: str, expected: str) -> None:
    line = one_error_line(stderr)
    assert line.startswith("experiment.py: error: ")
    assert expected in line


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_FLAG_PROCESSES))
def test_bad_flags_exit_nonzero_with_one_line(bad_flag_runs, name):
    returncode, stderr = bad_flag_runs[name]
    assert returncode == 2, stderr[-3000:]
    check_one_error_line(stderr, BAD_FLAG_PROCESSES[name][1])


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--total_environment_frames=-5"], "--total_environment_frames=-5"),
        (["--num_actors=0"], "--num_actors=0"),
        (["--unroll_length=0"], "--unroll_length=0"),
        (["--envs_per_actor=0"], "--envs_per_actor=0"),
        (["--envs_per_actor=4", "--envs_per_process=3"], "--envs_per_process=3"),
        (["--envs_per_process=0"], "--envs_per_process=0"),
        (["--progress_secs=0"], "--progress_secs=0: must be >= 1"),
        (["--learning_rate_decay_frames=-1"], "--learning_rate_decay_frames=-1"),
        (["--vtrace_lambda=1.5"], "--vtrace_lambda=1.5: must be in [0, 1]"),
        (["--mode=test"], "no checkpoint"),
        (["--level_name=explore_goal_locations_small"], "DeepMind Lab"),
    ],
)
def test_bad_flags_in_process(args, expected, tmp_path, capsys):
    if "level_name" in args[0] and dmlab.deepmind_lab_available():
        pytest.skip("DeepMind Lab is installed here")
    code = run_command_line("--level_name=atari/pong", f"--logdir={tmp_path}", *args)
    assert code == 2
    check_one_error_line(capsys.readouterr().err, expected)


def test_validate_flags_accepts_more_unrolls_than_actors():
    # One actor fills a batch of 8 over time: not an error.
    values = {name: FLAGS[name].default for name in FLAGS}
    values.update(batch_size=8, num_actors=1, mode="train")
    experiment.validate_flags(types.SimpleNamespace(**values))


def test_default_level_falls_back_to_pong_without_deepmind_lab():
    level, warning = environments.resolve_level_name(
        environments.DEFAULT_LEVEL, is_default=True, default_available=False
    )
    assert level == "atari/pong" and "DeepMind Lab is not installed" in warning
    level, warning = environments.resolve_level_name(
        environments.DEFAULT_LEVEL, is_default=False, default_available=False
    )
    assert level == environments.DEFAULT_LEVEL and warning is None
    level, warning = environments.resolve_level_name(
        environments.DEFAULT_LEVEL, is_default=True, default_available=True
    )
    assert level == environments.DEFAULT_LEVEL and warning is None


def test_clip_rewards():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        rewards = tf.constant([-10.0, -0.5, 0.0, 0.5, 10.0])
        abs_one, soft = session.run(
            (
                clip_rewards(rewards, "abs_one"),
                clip_rewards(rewards, "soft_asymmetric"),
            )
        )
    np.testing.assert_allclose(abs_one, [-1, -0.5, 0, 0.5, 1])
    expected = 5 * np.tanh(np.array([-10, -0.5, 0, 0.5, 10]) / 5)
    expected[:2] *= 0.3
    np.testing.assert_allclose(soft, expected, rtol=1e-5)


# -- learning sanity on a fixed, real batch -------------------------------------


def learner_on(agent, batch, learner_config):
    """The learner built on a stacked batch (pipeline.stack_unrolls)."""
    return build_learner(agent, [batch], learner_config)


def collect_real_batch(num_unrolls: int = 2, max_tries: int = 40):
    """Pong unrolls from real actors, each with a non-zero reward in it.

    Also checks that consecutive unrolls of an actor overlap by one step.
    """
    level, environment = "atari/pong", small_config().environment
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        agent = agent_lib.Agent(6, torso="shallow", **PONG_STACK)
        outputs = []
        for i in range(num_unrolls):
            _, env = create_flow_environment(level, i + 1, environment)
            output, _ = build_actor(agent, env, level, UNROLL)
            outputs.append(output)
        unrolls = []
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            for output in outputs:
                previous = None
                for _ in range(max_tries):
                    unroll = session.run(output)
                    assert unroll.env_outputs.reward.shape == (UNROLL + 1,)
                    if previous is not None:
                        np.testing.assert_array_equal(
                            unroll.env_outputs.observation[0][0],
                            previous.env_outputs.observation[0][-1],
                        )
                        assert (
                            unroll.agent_outputs.action[0]
                            == (previous.agent_outputs.action[-1])
                        )
                    previous = unroll
                    if np.any(unroll.env_outputs.reward[1:] != 0):
                        unrolls.append(unroll)
                        break
                else:
                    pytest.fail(f"no reward in {max_tries} Pong unrolls")
    return unrolls


@pytest.mark.parametrize("inference", ["unbatched", "dynamic_batching", "vector"])
def test_learner_recomputes_the_actors_policy_exactly(inference):
    """With the actors' own weights, the learner's unroll over their
    trajectories gives back the behaviour policy: every log rho is 0.

    This pins the alignment the learner relies on (which observation, last
    action and core state produced each recorded action, and the step shared
    by consecutive unrolls): any shift by one step, or a core state carried
    wrongly between unrolls, makes the probabilities differ. (Shifting the
    learner's outputs by one step fails it.) "vector": one actor stepping
    both environments (--envs_per_actor=2), inference on a batch of 2.
    """
    level, config = "atari/pong", small_config()
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(4)
        agent = agent_lib.create_agent(config.agent)
        inference_fn, batched = runner.make_inference_fn(
            agent, "/cpu:0", dynamic=inference == "dynamic_batching"
        )
        assert batched == (inference == "dynamic_batching")
        envs = [
            create_flow_environment(level, i + 1, config.environment)[1]
            for i in range(2)
        ]
        if inference == "vector":
            vector, _ = build_vector_actor(agent, envs, level, UNROLL)
            outputs = [
                tf.nest.map_structure(lambda t, k=k: t[k], vector) for k in (0, 1)
            ]
        else:
            outputs = [
                build_actor(agent, env, level, UNROLL, inference_fn)[0] for env in envs
            ]
        # The learner reads the very unrolls the actors produce in the same
        # session.run, before any update.
        batch = trajectory.stack_unrolls(outputs)
        learner = learner_on(agent, batch, config.learner)
        returns = learner.vtrace_returns
        with tf.compat.v1.train.SingularMonitoredSession(
            hooks=[py_process.PyProcessHook()]
        ) as session:
            for _ in range(3):  # The first unroll starts an episode.
                log_rhos, behaviour = session.run(
                    (returns.log_rhos, returns.behaviour_action_log_probs)
                )
                assert log_rhos.shape == (UNROLL, 2)
                assert np.all(behaviour < 0)  # real, non-trivial policies
                np.testing.assert_allclose(log_rhos, 0.0, atol=1e-4)


def pipeline_log_rhos(
    envs_per_actor: int,
    envs_per_process: int,
    learning_rate: float,
    steps: int,
    **agent_overrides,
):
    """max |log rho| of each of `steps` learner updates of the whole
    single-machine pipeline: actor threads (dynamic batching with one
    environment per actor, a batch of K otherwise; envs_per_process of an
    actor's environments to a process), the queue, dequeue_many, the staging
    area and the learner's unroll, built as experiment.train builds them."""
    config = small_config(learning_rate=learning_rate)
    config = dataclasses.replace(
        config,
        run=dataclasses.replace(
            config.run,
            envs_per_actor=envs_per_actor,
            envs_per_process=envs_per_process,
        ),
        agent=dataclasses.replace(config.agent, **agent_overrides),
    )
    run, learner_config = config.run, config.learner
    specs = actor_output_specs(
        config.environment, config.agent, learner_config.unroll_length
    )
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(3)
        agent = agent_lib.create_agent(config.agent)
        queue = pipeline.create_queue(specs)
        learner_pipeline = pipeline.build_learner_pipeline(
            agent, [queue], specs, learner_config, ["/cpu:0"]
        )
        inference_fn, _ = runner.make_inference_fn(
            agent, "/cpu:0", True, envs_per_actor
        )
        actor_list = runner.build_actors(
            agent,
            config.environment,
            run,
            learner_config.unroll_length,
            [queue],
            inference_fn,
        )
        hooks = [
            runner.ActorRunnerHook(
                [runner.ActorRunner(a) for a in actor_list],
                queue.close(cancel_pending_enqueues=True),
            ),
            py_process.PyProcessHook(),
        ]
        learner = learner_pipeline.learner
        fetches = (learner.train_and_count, learner.vtrace_returns.log_rhos)
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
            session.run(learner_pipeline.stage_op)
            maxima = []
            for _ in range(steps):
                _, log_rhos = session.run((fetches, learner_pipeline.stage_op))[0]
                maxima.append(float(np.max(np.abs(log_rhos))))
    return maxima


@pytest.mark.parametrize(
    "envs_per_actor,envs_per_process,agent_overrides,control",
    [
        (1, 1, {}, True),
        (2, 1, {}, False),
        (4, 2, {}, False),
        (1, 1, {"torso_dtype": "bfloat16"}, False),
        (4, 2, {"torso": "deep", "torso_dtype": "bfloat16"}, False),
        (1, 1, {"use_lstm": False}, True),
        (4, 2, {"use_lstm": False}, False),
    ],
    ids=["1x1", "2x1", "4x2", "1x1-bf16", "4x2-deep-bf16", "1x1-ff", "4x2-ff"],
)
def test_training_pipeline_pairs_each_action_with_its_policy(
    envs_per_actor, envs_per_process, agent_overrides, control
):
    """With learning rate 0 the learner's policy is the actors', so every
    log rho of every batch that comes through the real pipeline is 0: each
    action reaches the learner with the observation, core state and last
    action that produced it, K environments per actor included, and
    environments that share a process. With updates (the control) the
    learner's policy moves ahead of the actors' and the log rhos do not stay
    0, so the check can fail; the control runs once for an agent with core
    state and once for one without, since what it shows does not depend on
    the layout of the environments. A bfloat16 torso too: the actors'
    batches of 1-4 and the learner's of T x B compute the same rounded
    values. A feed-forward agent (no core state in the unrolls) too."""
    args = (envs_per_actor, envs_per_process)
    assert max(pipeline_log_rhos(*args, 0.0, steps=6, **agent_overrides)) < 1e-4
    if control:
        assert max(pipeline_log_rhos(*args, 0.01, steps=6, **agent_overrides)) > 1e-3


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_learner_updates_lower_the_loss_on_a_fixed_batch(optimizer):
    unrolls = collect_real_batch()
    config = dataclasses.replace(small_config().learner, optimizer=optimizer)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(2)
        agent = agent_lib.Agent(6, torso="shallow", **PONG_STACK)
        batch = trajectory.stack_unrolls(
            [tf.nest.map_structure(tf.constant, u) for u in unrolls]
        )
        assert batch.env_outputs.reward.shape == (UNROLL + 1, 2)
        learner = learner_on(agent, batch, config)
        returns = learner.vtrace_returns
        with tf.compat.v1.Session() as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            before, advantages, log_probs_before = session.run(
                (learner.losses, returns.pg_advantages, returns.target_action_log_probs)
            )
            for _ in range(20):
                frames = session.run(learner.train_and_count)
            after, log_probs_after = session.run(
                (learner.losses, returns.target_action_log_probs)
            )
    assert frames == 20 * FRAMES_PER_UPDATE
    # The value function fits the batch's V-trace targets...
    assert after.baseline < 0.8 * before.baseline, (before, after)
    # ...and the policy-gradient loss with the advantages held fixed falls:
    # actions with positive advantages became likelier, the others rarer.
    surrogate_before = -np.sum(log_probs_before * advantages)
    surrogate_after = -np.sum(log_probs_after * advantages)
    assert surrogate_after < surrogate_before, (surrogate_before, surrogate_after)


@pytest.mark.parametrize(
    "decay_frames,expected",
    [
        # 0: over --total_environment_frames (10**6 here), the paper's way.
        (0, {0: 6e-4, 250_000: 4.5e-4, 10**6: 0.0}),
        # A horizon past the run's end: the rate barely falls within it.
        (10**7, {0: 6e-4, 10**6: 5.4e-4}),
        # A horizon shorter than the run: 0 from there on, never negative.
        (500_000, {250_000: 3e-4, 500_000: 0.0, 900_000: 0.0}),
    ],
)
def test_learning_rate_decays_linearly_over_its_horizon(decay_frames, expected):
    """The learning rate the optimiser uses at a given global step (frames),
    with --learning_rate_decay_frames set or left 0."""
    config = small_config(learning_rate=6e-4, learning_rate_decay_frames=decay_frames)
    specs = actor_output_specs(
        config.environment, config.agent, config.learner.unroll_length
    )
    with tf.Graph().as_default():
        agent = agent_lib.Agent(6, torso="shallow", **PONG_STACK)
        # Zeros of the real shapes: only the schedule is read here.
        batch = trajectory.stack_unrolls(
            [tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)] * 2
        )
        learner = learner_on(agent, batch, config.learner)
        with tf.compat.v1.Session() as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    # The learner's hyperparameters (learner/hyperparameters.py).
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            for frames, rate in expected.items():
                learner.num_env_frames.load(frames, session)
                assert session.run(learner.learning_rate) == pytest.approx(
                    rate, abs=1e-9
                ), frames


# -- episode logging ------------------------------------------------------------


class _RecordingWriter:
    def __init__(self):
        self.values = {}

    def add_summary(self, summary, step):
        for value in summary.value:
            self.values.setdefault(value.tag, []).append((step, value.simple_value))


def test_episode_logger_logs_finished_episodes_and_suite_scores():
    import environments
    from families import atari57

    level_names = environments.expand_level_names("atari57")
    writer = _RecordingWriter()
    logger = progress.EpisodeLogger(writer, "atari57", level_names, 4)
    info_type = environments.StepOutputInfo
    # One batch per game: element 1 finishes an episode at step 2.
    for i, level in enumerate(level_names):
        done = np.zeros([4, 2], bool)
        done[2, 1] = True
        info = info_type(np.full([4, 2], float(i)), np.full([4, 2], 10, np.int32))
        levels = np.array([b"atari/other", level.encode()])
        logger.log(levels, done, info, num_env_frames=100 * (i + 1))
    assert logger.num_episodes == len(level_names)
    assert writer.values["atari/pong/episode_return"] == [
        (
            100 * (level_names.index("atari/pong") + 1),
            float(level_names.index("atari/pong")),
        )
    ]
    assert writer.values["atari/pong/episode_frames"][0][1] == 10 * 4
    # Once every game has an episode, the human-normalised scores follow.
    returns = {level: [float(i)] for i, level in enumerate(level_names)}
    median, mean = atari57.compute_human_normalized_scores(returns)
    for tag, expected in (("median", median), ("mean", mean)):
        ((step, value),) = writer.values[f"atari57/training_{tag}"]
        assert step == 100 * len(level_names)
        assert value == pytest.approx(expected, rel=1e-6)  # float32 summaries


def test_dequeue_many_batch_is_time_major_like_stacked_unrolls():
    """The learner's dequeue_many path gives the same batch as stacking."""
    rng = np.random.default_rng(0)
    steps, batch_size = 3, 4

    def unroll(i: int) -> ActorOutput:
        return ActorOutput(
            level_name=f"level{i}".encode(),
            agent_state=rng.normal(size=[5]).astype(np.float32),
            env_outputs=(
                rng.integers(0, 255, [steps, 2, 2, 1], dtype=np.uint8),
                rng.normal(size=[steps]).astype(np.float32),
            ),
            agent_outputs=rng.integers(0, 6, [steps], dtype=np.int32),
            policy_frames=np.int64(1000 * i),
        )

    unrolls = [unroll(i) for i in range(batch_size)]
    with tf.Graph().as_default():
        flat = tf.nest.flatten(unrolls[0])
        queue = tf.queue.FIFOQueue(
            1,
            [tf.as_dtype(np.asarray(t).dtype) for t in flat],
            [np.shape(t) for t in flat],
        )
        specs = unrolls[0]
        placeholders = [
            tf.compat.v1.placeholder(tf.as_dtype(np.asarray(t).dtype), np.shape(t))
            for t in flat
        ]
        enqueue = queue.enqueue(placeholders)
        batch = pipeline.time_major(
            tf.nest.pack_sequence_as(specs, queue.dequeue_many(batch_size))
        )
        expected = trajectory.stack_unrolls(
            [tf.nest.map_structure(tf.constant, u) for u in unrolls]
        )
        with tf.compat.v1.Session() as session:
            # Capacity 1 < batch_size: dequeue_many collects as enqueues come.
            feeder = threading.Thread(
                target=lambda: [
                    session.run(
                        enqueue,
                        dict(zip(placeholders, tf.nest.flatten(u), strict=True)),
                    )
                    for u in unrolls
                ]
            )
            feeder.start()
            got, want = session.run((batch, expected))
            feeder.join()
    assert got.env_outputs[0].shape == (steps, batch_size, 2, 2, 1)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
        np.testing.assert_array_equal(g, w)
