"""The run's record: what a run was, written to its logdir before the first
update, and read back by a resume and by test mode.

`<logdir>/run_record.json` holds every resolved setting of experiment.py
with where it came from (the declared default, the level's family flag
file, a --flagfile, the command line, TF_CONFIG, or this record on a
resume), the command line, the versions of Python and the libraries, the
code's commit where known, the CPU and the torso dtype chosen for it, and
the seed. A resume appends to `history` each time it starts, with the
settings it changed. `<logdir>/run_flags.cfg` beside it reproduces the run:
`python3 experiment.py --flagfile=<logdir>/run_flags.cfg --logdir=NEW`.

A run started on a logdir with a record takes each setting it is not given
from the record (Sample Factory's cfg.json does the same), so that
`--mode=test --logdir=<run>` alone evaluates the run as it was trained and
a resume continues the same experiment. A given setting that changes the
network or the data a checkpoint holds (FIXED_SETTINGS) is refused; any
other change is allowed and recorded.

No TensorFlow here (the HParams summary imports TensorBoard's plugin when it
is written).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.errors import FlagError

RECORD_FILE = "run_record.json"
FLAGFILE = "run_flags.cfg"
FORMAT = 1

# What a checkpoint's network and its data are: a run resumed, or tested,
# with another value of one of these is another experiment.
FIXED_SETTINGS = (
    "level_name",
    "agent",
    "use_lstm",
    "frame_stack",
    "popart",
    "optimizer",
    "num_action_repeats",
    "unroll_length",
    "width",
    "height",
)

# Settings of this process rather than of the experiment: recorded as they
# were, never taken from a record, never in its flag file.
PROCESS_SETTINGS = (
    "mode",
    "logdir",
    "job_name",
    "task",
    "learner_host",
    "actor_hosts",
    "print_config",
    "test_num_episodes",
    "test_video_dir",
)

# Where a setting's value came from.
DEFAULT = "default"
COMMAND_LINE = "command line"
RECORD = "run record"
TF_CONFIG = "TF_CONFIG"

# The libraries whose versions a record gives (distribution names; the first
# installed of each group).
_LIBRARIES = {
    "tensorflow": ("tensorflow-cpu", "tensorflow", "tensorflow-intel"),
    "dm-sonnet": ("dm-sonnet",),
    "numpy": ("numpy",),
    "ale-py": ("ale-py",),
    "vizdoom": ("vizdoom",),
    "deepmind-lab": ("deepmind-lab", "deepmind_lab"),
}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- reading -----------------------------------------------------------------------


def read(logdir: str) -> dict | None:
    """The record of the run in `logdir`, or None where it has none.

    Raises:
      FlagError: the file is not a whole record (named, with the fix; it is
        left as it is).
    """
    path = os.path.join(logdir, RECORD_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
            raise ValueError("no settings")
    except (ValueError, UnicodeDecodeError) as e:
        raise FlagError(
            f"--logdir={logdir}: {path} is not a whole run record ({e}); restore "
            f"it from a copy, or move it away to run without it (the settings "
            f"then come from the flags alone). Nothing was changed."
        ) from None
    return record


def recorded_value(record: Mapping, name: str) -> Any:
    return record["settings"][name]["value"]


def restore(
    flag_values,
    record: Mapping | None,
    names: Iterable[str],
    own: Iterable[str] = (),
) -> dict[str, Any]:
    """Sets each flag of `names` that was not given and not a process
    setting (PROCESS_SETTINGS, or `own` for this process) to the record's
    value; returns {name: value} of those set.

    Raises:
      FlagError: the record names a setting this version does not declare.
    """
    if record is None:
        return {}
    names = set(names)
    unknown = sorted(set(record["settings"]) - names)
    if unknown:
        raise FlagError(
            f"--logdir: its {RECORD_FILE} names --{unknown[0]}, which this "
            f"version of experiment.py does not declare (from an older or "
            f"newer version); run that version, or remove the setting from "
            f"the record's settings to go on without it."
        )
    own = set(own)
    restored = {}
    for name, entry in record["settings"].items():
        if name in PROCESS_SETTINGS or name in own or flag_values[name].present:
            continue
        if name == "envs_per_process" and _unfit(flag_values, entry["value"]):
            # It depends on --envs_per_actor, given anew: it follows that
            # flag (the family's defaults or the declared default decide).
            continue
        flag_values[name].parse(flag_text(entry["value"]))
        restored[name] = entry["value"]
    return restored


def _unfit(flag_values, envs_per_process: int) -> bool:
    given = flag_values["envs_per_actor"]
    return given.present and given.value % int(envs_per_process) != 0


def fixed_differences(record: Mapping | None, settings: Mapping) -> list[str]:
    """One line for each FIXED_SETTINGS value that differs from the record."""
    if record is None:
        return []
    lines = []
    for name in FIXED_SETTINGS:
        if name not in record["settings"] or name not in settings:
            continue
        old, new = recorded_value(record, name), settings[name]["value"]
        if old != new:
            lines.append(
                f"--{name}={flag_text(new)}: the run in this --logdir was "
                f"trained with --{name}={flag_text(old)} ({RECORD_FILE}), which "
                f"its checkpoint holds; drop the flag to keep the run's, or "
                f"give another --logdir for a new run."
            )
    return lines


# -- resolving ---------------------------------------------------------------------


def flag_text(value: Any) -> str:
    """A value as a flag file writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def flagfile_values(argv: Iterable[str]) -> dict[str, str]:
    """{flag: flag file path} of the flags that the --flagfile files of
    `argv` set (absl's format: a `--name=value` a line)."""
    found = {}
    for arg in argv:
        if arg.startswith("--flagfile="):
            path = arg.split("=", 1)[1]
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        line = line.strip()
                        if line.startswith("--"):
                            found[line[2:].split("=", 1)[0]] = path
            except OSError:
                pass  # absl has already said it cannot read it
    return found


def command_line_names(argv: Iterable[str]) -> set[str]:
    """The flags `argv` names itself (not through a --flagfile)."""
    names = set()
    for arg in argv:
        if arg.startswith("--") and arg != "--":
            name = arg[2:].split("=", 1)[0]
            names.add(name[2:] if name.startswith("no") and "=" not in arg else name)
            names.add(name)
    return names


def resolve_settings(
    flag_values,
    names: Iterable[str],
    argv: Iterable[str],
    family_values: Mapping[str, str],
    family_flagfile: str,
    restored: Mapping[str, Any],
    tf_config_names: Iterable[str] = (),
    derived: Mapping[str, str] | None = None,
) -> dict[str, dict]:
    """{name: {"value", "source"}} of every setting of `names`, as parsed
    now, with where each came from. `derived`: name -> the setting a family
    default's value followed instead of the file (its source)."""
    derived = derived or {}
    argv = list(argv)
    given = command_line_names(argv[1:])
    from_files = flagfile_values(argv[1:])
    tf_config_names = set(tf_config_names)
    settings = {}
    for name in sorted(names):
        flag = flag_values[name]
        if name in restored:
            source = RECORD
        elif name in derived:
            source = derived[name]
        elif name in family_values:
            source = f"family defaults ({family_flagfile})"
        elif name in given:
            source = COMMAND_LINE
        elif name in from_files:
            source = f"--flagfile {from_files[name]}"
        elif name in tf_config_names:
            source = TF_CONFIG
        elif flag.present:
            source = COMMAND_LINE
        else:
            source = DEFAULT
        value = flag.value
        if isinstance(value, tuple):
            value = list(value)
        settings[name] = {"value": value, "source": source}
    return settings


# -- the environment of the run ----------------------------------------------------


def library_versions() -> dict[str, str | None]:
    """Python's and each library's version (None where not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for label, distributions in _LIBRARIES.items():
        versions[label] = None
        for distribution in distributions:
            try:
                versions[label] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def git_state(
    root: str | None = None, untracked: bool = False
) -> tuple[str | None, list[str]]:
    """The commit of the git checkout at `root` (this code's by default) and
    the paths that differ from it (untracked ones too with `untracked`);
    (None, []) outside a checkout."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
        )
        if head.returncode:
            return None, []
        status = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                f"--untracked-files={'all' if untracked else 'no'}",
            ],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout
    except OSError:
        return None, []
    return head.stdout.strip(), [line[3:].strip() for line in status.splitlines()]


def code_commit() -> str | None:
    """The commit of this code's git checkout, with '+changes' where its
    tracked files differ from it; None outside a checkout."""
    commit, changed = git_state()
    return commit and commit + ("+changes" if changed else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- writing -----------------------------------------------------------------------


def new_record(
    settings: Mapping[str, dict], argv: Iterable[str], torso_dtype: str
) -> dict:
    return {
        "format": FORMAT,
        "started": _now(),
        "command_line": list(argv),
        "settings": dict(settings),
        "seed": settings["seed"]["value"],
        "torso_dtype": torso_dtype,
        "cpu": cpu_model(),
        "versions": library_versions(),
        "commit": code_commit(),
        "history": [],
    }


def resumed_record(
    record: dict, settings: Mapping[str, dict], argv: Iterable[str]
) -> dict:
    """`record` with this start appended to its history: the command line
    and each setting that changed ({name: [before, after]})."""
    changes = {
        name: [record["settings"].get(name, {}).get("value"), entry["value"]]
        for name, entry in settings.items()
        if name not in PROCESS_SETTINGS
        and record["settings"].get(name, {}).get("value") != entry["value"]
    }
    record = dict(record)
    record["history"] = [
        *record.get("history", []),
        {
            "started": _now(),
            "command_line": list(argv),
            "changes": changes,
            "versions": library_versions(),
            "commit": code_commit(),
        },
    ]
    # A setting taken from the record keeps the source it had there.
    record["settings"] = {
        name: record["settings"][name] if entry["source"] == RECORD else entry
        for name, entry in settings.items()
    }
    return record


def flagfile_text(settings: Mapping[str, dict]) -> str:
    lines = [
        "# The settings of this run, as resolved when it started (run_record.json",
        "# says where each came from). To run it again in a new directory:",
        "#   python3 experiment.py --flagfile=<this file> --logdir=NEW",
    ]
    for name, entry in sorted(settings.items()):
        if name not in PROCESS_SETTINGS:
            lines.append(f"--{name}={flag_text(entry['value'])}")
    return "\n".join(lines) + "\n"


def write(logdir: str, record: Mapping) -> None:
    """Writes the record and its flag file whole (a temporary file renamed
    over each), so a kill never leaves half of one."""
    for name, text in (
        (RECORD_FILE, json.dumps(record, indent=1) + "\n"),
        (FLAGFILE, flagfile_text(record["settings"])),
    ):
        path = os.path.join(logdir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def write_hparams(logdir: str, settings: Mapping[str, dict]) -> None:
    """The settings as TensorBoard's HParams summary (its own table compares
    runs), in an events file of the logdir."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import summary as hparams_summary

    hparams = {
        name: entry["value"]
        for name, entry in settings.items()
        if name not in PROCESS_SETTINGS
        and isinstance(entry["value"], bool | int | float | str)
    }
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriter(logdir)
        try:
            writer.add_summary(hparams_summary.session_start_pb(hparams=hparams))
        finally:
            writer.close()


def describe(settings: Mapping[str, dict]) -> str:
    """The settings as a table: name, value, source."""
    width = max(len(name) for name in settings) + 2
    rows = [
        f"--{name:<{width}} {flag_text(entry['value']):<24} {entry['source']}"
        for name, entry in sorted(settings.items())
    ]
    return "\n".join(rows)
