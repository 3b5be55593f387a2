"""The run's record (runtime/run_record.py): every resolved setting with its
source, written to --logdir before the first update with a flag file that
reproduces the run and TensorBoard's HParams summary; read back by a resume
(what it is not given, a change of network or data refused, any other change
kept in the history) and by test mode (--logdir alone). Real training runs,
in this process, at a tiny budget."""

import json
import os
import re
import subprocess

import pytest
from run_helpers import REPO_ROOT, command, run_command_line
from run_helpers import experiment_values as values
from run_helpers import resolved_settings as resolved

from runtime import run_record

TINY = (
    "--level_name=atari/pong",
    "--num_actors=1",
    "--envs_per_actor=2",
    "--batch_size=1",
    "--unroll_length=20",
    "--progress_secs=1",
)
FRAMES = 3000


def record_of(logdir) -> dict:
    with open(os.path.join(logdir, run_record.RECORD_FILE)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def shallow_run(tmp_path_factory):
    """A shallow run with a learning rate given on the command line and an
    entropy cost from a --flagfile."""
    root = tmp_path_factory.mktemp("record")
    flagfile = root / "mine.cfg"
    flagfile.write_text("--entropy_cost=0.02\n")
    logdir = str(root / "run")
    code = run_command_line(
        *TINY,
        f"--flagfile={flagfile}",
        "--learning_rate=0.001",
        f"--total_environment_frames={FRAMES}",
        f"--logdir={logdir}",
    )
    assert code == 0
    return logdir, str(flagfile)


@pytest.mark.slow
def test_the_record_gives_each_setting_its_source_and_the_runs_facts(shallow_run):
    logdir, flagfile = shallow_run
    record = record_of(logdir)
    sources = {name: entry["source"] for name, entry in record["settings"].items()}
    family = "family defaults (flagfiles/pong_shallow_unroll80.cfg)"
    assert sources["level_name"] == sources["learning_rate"] == "command line"
    assert sources["entropy_cost"] == f"--flagfile {flagfile}"
    assert sources["agent"] == sources["epsilon"] == family
    # A default that follows a given flag: --envs_per_actor=2, so 2 a
    # process, and the record says it came from that flag.
    assert record["settings"]["envs_per_process"] == {
        "value": 2,
        "source": "--envs_per_actor=2 (the most that divides it; "
        "flagfiles/pong_shallow_unroll80.cfg has 32)",
    }
    assert sources["discounting"] == "default"
    assert record["settings"]["learning_rate"]["value"] == 0.001
    assert record["settings"]["entropy_cost"]["value"] == 0.02
    assert record["command_line"][1:] == [
        *TINY,
        f"--flagfile={flagfile}",
        "--learning_rate=0.001",
        f"--total_environment_frames={FRAMES}",
        f"--logdir={logdir}",
    ]
    versions = record["versions"]
    assert versions["tensorflow"] == "2.21.0" and versions["numpy"]
    assert versions["ale-py"] and "deepmind-lab" in versions
    assert record["seed"] == 1 and record["torso_dtype"] in ("float32", "bfloat16")
    assert record["cpu"] and record["history"] == []
    assert record["commit"] is None or len(record["commit"].split("+")[0]) == 40
    # Written before the first update: before the start's checkpoint.
    assert os.path.getmtime(os.path.join(logdir, run_record.RECORD_FILE)) <= (
        os.path.getmtime(os.path.join(logdir, "model.ckpt-0.index"))
    )


@pytest.mark.slow
def test_the_flag_file_reproduces_the_settings(shallow_run, tmp_path):
    logdir, _ = shallow_run
    again = resolved(
        f"--flagfile={os.path.join(logdir, run_record.FLAGFILE)}",
        f"--logdir={tmp_path / 'new'}",
    )
    assert values(again) == values(record_of(logdir)["settings"])


@pytest.mark.slow
def test_tensorboard_reads_the_settings_as_hparams(shallow_run):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import metadata

    logdir, _ = shallow_run
    accumulator = event_accumulator.EventAccumulator(logdir)
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(
        content[metadata.SESSION_START_INFO_TAG]
    )
    assert start.hparams["learning_rate"].number_value == pytest.approx(0.001)
    assert start.hparams["agent"].string_value == "shallow"
    assert start.hparams["use_lstm"].bool_value is True
    assert "logdir" not in start.hparams
    # The graph too, for TensorBoard's graph tab; not as graph.pbtxt nor as a
    # .meta file beside each checkpoint (nothing reads them).
    assert accumulator.Tags()["graph"] is True
    assert any(
        n.op == "RMSProp" or "RMSProp" in n.name for n in accumulator.Graph().node
    )
    assert not [f for f in os.listdir(logdir) if f.endswith((".pbtxt", ".meta"))]


@pytest.mark.slow
def test_test_mode_with_the_logdir_alone_evaluates_the_run(shallow_run, capsys):
    logdir, _ = shallow_run
    assert (
        run_command_line("--mode=test", f"--logdir={logdir}", "--test_num_episodes=1")
        == 0
    )
    with open(os.path.join(logdir, "test_results.json")) as f:
        results = json.load(f)
    assert list(results["levels"]) == ["atari/pong"]
    assert "run_record.json" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_deep_lstm_run_is_tested_from_its_logdir_alone(tmp_path):
    """Breakout: a game with a poor policy ends in a few hundred steps, which
    keeps the deep agent's test episode short."""
    logdir = str(tmp_path / "deep")
    deep = [f for f in TINY if not f.startswith("--level_name")]
    code = run_command_line(
        "--level_name=atari/breakout",
        *deep,
        "--agent=deep",
        # A few updates: without oneDNN (conftest.py) the deep torso is slow.
        "--total_environment_frames=400",
        f"--logdir={logdir}",
    )
    assert code == 0
    settings = record_of(logdir)["settings"]
    assert (settings["agent"]["value"], settings["use_lstm"]["value"]) == ("deep", True)
    # Not the family's shallow agent nor Pong: the record's.
    code = run_command_line(
        "--mode=test", f"--logdir={logdir}", "--test_num_episodes=1"
    )
    assert code == 0
    with open(os.path.join(logdir, "test_results.json")) as f:
        assert list(json.load(f)["levels"]) == ["atari/breakout"]


@pytest.mark.slow
def test_a_resume_keeps_the_record_refuses_a_new_network_and_records_a_new_target(
    shallow_run, capsys
):
    logdir, _ = shallow_run
    before = (
        open(os.path.join(logdir, run_record.RECORD_FILE)).read(),
        sorted(os.listdir(logdir)),
    )
    # Another agent and another level: a line each, exit 2, nothing written.
    code = run_command_line(
        f"--logdir={logdir}", "--agent=deep", "--level_name=atari/breakout"
    )
    assert code == 2
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("experiment.py: error:")
    ]
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        "experiment.py: error: --level_name=atari/breakout: the run in this "
        "--logdir was trained with --level_name=atari/pong"
    )
    assert (
        "--agent=deep: the run in this --logdir was trained with --agent=shallow"
        in lines[1]
    )
    after = (
        open(os.path.join(logdir, run_record.RECORD_FILE)).read(),
        sorted(os.listdir(logdir)),
    )
    assert after == before
    # A higher target alone: the rest from the record (the learning rate
    # given to the first run, not the family's), the change in its history.
    code = run_command_line(
        f"--logdir={logdir}", f"--total_environment_frames={2 * FRAMES}"
    )
    assert code == 0
    record = record_of(logdir)
    assert record["settings"]["learning_rate"] == {
        "value": 0.001,
        "source": "command line",
    }
    assert record["settings"]["total_environment_frames"]["value"] == 2 * FRAMES
    (start,) = record["history"]
    assert start["changes"] == {"total_environment_frames": [FRAMES, 2 * FRAMES]}
    assert start["command_line"][1:] == [
        f"--logdir={logdir}",
        f"--total_environment_frames={2 * FRAMES}",
    ]


def test_print_config_names_each_source_and_writes_nothing(tmp_path, capsys):
    flagfile = tmp_path / "mine.cfg"
    flagfile.write_text("--entropy_cost=0.02\n")
    logdir = tmp_path / "run"
    code = run_command_line(
        "--level_name=atari/breakout",
        f"--flagfile={flagfile}",
        "--batch_size=4",
        "--print_config",
        f"--logdir={logdir}",
    )
    assert code == 0
    rows = {
        line.split()[0]: line.split(None, 2)[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("--")
    }
    assert rows["--level_name"] == ["atari/breakout", "command line"]
    assert rows["--batch_size"] == ["4", "command line"]
    assert rows["--entropy_cost"] == ["0.02", f"--flagfile {flagfile}"]
    assert rows["--agent"] == [
        "shallow",
        "family defaults (flagfiles/pong_shallow_unroll80.cfg)",
    ]
    assert rows["--discounting"] == ["0.99", "default"]
    assert not logdir.exists()

    # README's quick start says how many lines its command prints (in a
    # process of its own: a family registered by another test here would
    # add its flags).
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        (shown,) = re.findall(r"\(4 of its (\d+) lines\)", f.read())
    printed = subprocess.run(
        command("--level_name=atari/breakout", "--print_config"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert int(shown) == len(printed.splitlines())


TWO_ACTORS = (
    '{"cluster": {"learner": ["localhost:1"], "actor": ["localhost:2", '
    '"localhost:3"]}, "task": {"type": "%s", "index": 0}}'
)


def test_a_cluster_task_resolves_the_same_settings_as_one_machine(monkeypatch):
    single = values(resolved("--level_name=atari/breakout"))
    monkeypatch.setenv("TF_CONFIG", TWO_ACTORS % "learner")
    chief = resolved("--level_name=atari/breakout")
    # Only the setting the cluster decides itself differs: its actors, as
    # many as TF_CONFIG lists, recorded as from there.
    assert {k: v for k, v in values(chief).items() if v != single[k]} == {
        "num_actors": 2
    }
    assert chief["num_actors"]["source"] == run_record.TF_CONFIG
    assert chief["agent"]["value"] == "shallow"


def test_an_actor_task_takes_its_number_of_actors_from_its_cluster_not_a_record(
    monkeypatch, tmp_path
):
    """The chief writes the record before the actor tasks start, or a run
    resumes with a cluster of another size: the record's number of actors
    is not the actor task's, and taking it would contradict TF_CONFIG."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    chief = resolved("--level_name=atari/breakout", "--num_actors=4")
    run_record.write(str(logdir), run_record.new_record(chief, ["x"], "float32"))
    monkeypatch.setenv("TF_CONFIG", TWO_ACTORS % "actor")
    actor = resolved(f"--logdir={logdir}")
    assert actor["level_name"] == {
        "value": "atari/breakout",
        "source": run_record.RECORD,
    }
    assert actor["num_actors"] == {"value": 2, "source": run_record.TF_CONFIG}


@pytest.mark.parametrize(
    "text,expected",
    [
        ('{"settings": {"agent": {"val', "is not a whole run record"),
        ("[1, 2]", "is not a whole run record"),
    ],
)
def test_a_broken_record_is_one_line_naming_it_and_is_kept(
    tmp_path, capsys, text, expected
):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / run_record.RECORD_FILE).write_text(text)
    code = run_command_line(*TINY, f"--logdir={logdir}")
    assert code == 2
    (line,) = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("experiment.py: error:")
    ]
    assert f"{logdir / run_record.RECORD_FILE} {expected}" in line
    assert (logdir / run_record.RECORD_FILE).read_text() == text
    assert sorted(os.listdir(logdir)) == [run_record.RECORD_FILE]


def test_a_record_naming_an_undeclared_setting_is_one_line_naming_it(tmp_path, capsys):
    logdir = tmp_path / "run"
    logdir.mkdir()
    record = {"settings": {"agent": {"value": "shallow", "source": "default"}}}
    record["settings"]["frame_stacking"] = {"value": 4, "source": "default"}
    (logdir / run_record.RECORD_FILE).write_text(json.dumps(record))
    assert run_command_line(*TINY, f"--logdir={logdir}") == 2
    err = capsys.readouterr().err
    assert (
        "names --frame_stacking, which this version of experiment.py does not declare"
        in err
    )


def test_the_committed_agent_has_its_record():
    logdir = os.path.join(REPO_ROOT, "pretrained", "atari_pong")
    record = record_of(logdir)
    settings = record["settings"]
    assert settings["agent"]["value"] == "shallow"
    assert settings["level_name"]["value"] == "atari/pong"
    assert settings["use_lstm"]["value"] is True
    assert "before runs kept a record" in record["reconstructed"]
    # Its flag file and the tested command it names resolve alike.
    assert values(
        resolved(f"--flagfile={os.path.join(logdir, run_record.FLAGFILE)}")
    ) == values(resolved(f"--flagfile={REPO_ROOT}/flagfiles/pong_shallow.cfg"))


def test_a_resume_that_gives_a_layout_flag_anew_has_the_settings_follow_it(
    tmp_path,
):
    """The run had 2 environments an actor, 2 to a process; a resume given
    --envs_per_actor=1 alone gets 1 to a process, not the record's 2."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    record = {
        "settings": {
            "envs_per_actor": {"value": 2, "source": "command line"},
            "envs_per_process": {"value": 2, "source": "family defaults (x)"},
            "learning_rate": {"value": 0.001, "source": "command line"},
        }
    }
    (logdir / run_record.RECORD_FILE).write_text(json.dumps(record))
    settings = resolved(
        "--level_name=atari/pong", "--envs_per_actor=1", f"--logdir={logdir}"
    )
    assert (
        settings["envs_per_actor"]["value"]
        == settings["envs_per_process"]["value"]
        == 1
    )
    assert settings["learning_rate"] == {"value": 0.001, "source": "run record"}
