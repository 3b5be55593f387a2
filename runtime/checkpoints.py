"""Checkpoints: written whole, chosen with care, never deleted by mistake.

The learner's MonitoredTrainingSession saves with `checkpoint_saver()`;
before it restores, `resume_checkpoint` picks the newest checkpoint in
--logdir that reads back whole (older ones when the newest is damaged),
points the `checkpoint` state file at it and checks that it fits the graph.
Test mode takes the same choice through `newest_whole_checkpoint`. Nothing
here deletes a file: a damaged checkpoint is named in a warning and left in
place.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile

import numpy as np
import tensorflow as tf
from absl import logging

from runtime.errors import CheckpointError, FlagError, LogdirError, first_line

# Checkpoints kept in --logdir (older ones are deleted as new ones come); at
# least 2, so that a damaged newest checkpoint leaves one to resume from.
CHECKPOINTS_TO_KEEP = 5


def ensure_logdir(logdir: str, flag: str = "logdir") -> None:
    """Creates `logdir` if needed and checks that a file can be written there.

    `flag` names the flag that gave the directory, for the error.

    Raises:
      LogdirError: it cannot be created (a file in its path, no permission)
        or written to.
    """
    try:
        os.makedirs(logdir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_check-", dir=logdir)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise LogdirError(
            f"--{flag}={logdir}: cannot write there ({e.strerror}); choose a "
            f"directory this user can create and write, e.g. --{flag}=/tmp/agent."
        ) from None


class _Saver(tf.compat.v1.train.Saver):
    """A Saver whose failed save (a full disk, lost permissions) is a
    LogdirError naming --logdir and the checkpoint that stays the latest,
    and whose restore leaves variables that already hold values alone.

    Why the restore: a MonitoredSession recreates its session after a task
    of the cluster dies (with several learners, a learner task serving a
    tower), and its SessionManager restores the newest checkpoint every
    time it creates one. The chief's variables live on the chief's own
    server, which did not die: they are intact, and restoring would throw
    away every update since the last checkpoint (up to
    --save_checkpoint_secs of learning). So the restore runs only when some
    variable is not initialised: a fresh process, or a server that lost
    them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Built now: the MonitoredSession finalises the graph before it
        # restores.
        self._uninitialized = tf.compat.v1.report_uninitialized_variables(
            tf.compat.v1.global_variables()
        )
        # Run only when a session is recreated: marked used, so that a run
        # that never recreates one does not end with TensorFlow's
        # error-level "Object was never used" block about it.
        self._uninitialized.mark_used()
        # The learner's global step counts environment frames.
        self._frames = tf.compat.v1.train.get_global_step()

    def restore(self, sess, save_path):
        if len(sess.run(self._uninitialized)):
            return super().restore(sess, save_path)
        frames = -1 if self._frames is None else int(sess.run(self._frames))
        logging.info(
            "Session recreated: the variables on their server are intact at %d "
            "environment frames, so training goes on from them, not from %s.",
            frames,
            save_path,
        )
        return None

    def save(self, sess, save_path, *args, **kwargs):
        try:
            return super().save(sess, save_path, *args, **kwargs)
        except (tf.errors.OpError, OSError) as e:
            logdir = os.path.dirname(save_path)
            latest = tf.train.latest_checkpoint(logdir)
            kept = (
                f"the last complete checkpoint, {latest}, is kept"
                if latest
                else "no complete checkpoint was written before"
            )
            raise LogdirError(
                f"--logdir={logdir}: writing a checkpoint failed "
                f"({first_line(e)}); training "
                f"stopped and {kept}. Free space there (or give the run a copy of "
                f"the logdir elsewhere) and rerun the same command to resume."
            ) from None


def checkpoint_saver() -> tf.compat.v1.train.Saver:
    """The training checkpoints' saver: keeps CHECKPOINTS_TO_KEEP, not sharded.

    Not sharded (the Scaffold's default is): a non-sharded V2 save writes the
    data file, the index and the `checkpoint` state file (and a meta graph,
    which training does not ask for) each to a temporary file renamed into
    place, so a SIGKILL at any moment leaves every file whole and the state
    file naming a complete checkpoint. The sharded saver writes its merged
    index in place (no rename): killed then, it would leave a truncated
    index, and since a resume re-saves the restored step under the same
    name, it could damage the very checkpoint the state file names. (Renames
    are atomic against a killed process, not against a power loss without
    fsync.) How this was checked: docs/running.md, "How checkpoints are written".
    """
    # Relative paths in the `checkpoint` state file: a --logdir that was
    # moved or copied (another disk, another host) still names its files.
    return _Saver(
        sharded=False,
        max_to_keep=CHECKPOINTS_TO_KEEP,
        allow_empty=True,
        save_relative_paths=True,
    )


def _checkpoint_step(prefix: str) -> int:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def find_checkpoints(logdir: str) -> list[str]:
    """Checkpoint prefixes in `logdir` (absolute), newest (highest step) first:
    every `<prefix>.index` file and whatever the `checkpoint` file names."""
    logdir = os.path.abspath(logdir)
    prefixes = {
        path[: -len(".index")]
        for path in glob.glob(os.path.join(glob.escape(logdir), "*.index"))
    }
    try:
        state = tf.train.get_checkpoint_state(logdir)
    except ValueError:  # A state file naming no checkpoint.
        state = None
    if state is not None:
        named = [state.model_checkpoint_path, *state.all_model_checkpoint_paths]
        prefixes.update(os.path.join(logdir, p) for p in named)
    return sorted(prefixes, key=lambda p: (_checkpoint_step(p), p), reverse=True)


def checkpoint_problem(prefix: str) -> str | None:
    """None when checkpoint `prefix` reads back whole, else what is wrong.

    Reads every tensor: TensorFlow checks each one's CRC32C on read, so a
    truncated, partly overwritten or missing file shows up here and not
    half-way through a restore. A checkpoint holding NaN/Inf values counts
    as damaged too.
    """
    if not os.path.exists(prefix + ".index"):
        return f"its index file {prefix}.index is missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name, dtype in reader.get_variable_to_dtype_map().items():
            value = reader.get_tensor(name)
            if dtype.is_floating and not np.all(np.isfinite(value)):
                return f"variable {name} holds NaN or infinite values"
    except Exception as e:  # noqa: BLE001 - OpError, IndexError on short files...
        lines = (getattr(e, "message", None) or str(e)).strip().splitlines()
        return f"{type(e).__name__}: {lines[0] if lines else ''}"
    return None


def newest_whole_checkpoint(logdir: str, candidates: list[str], use: str) -> str:
    """The first of `candidates` (newest first) that reads back whole.

    Logs a warning naming each newer, damaged one (left in place: nothing is
    ever deleted here); `use` says what is done with the chosen one, e.g.
    'resuming from'.

    Raises:
      CheckpointError: none of them reads back whole.
    """
    damaged = []
    for prefix in candidates:
        problem = checkpoint_problem(prefix)
        if problem is None:
            break
        damaged.append(f"{prefix} ({problem})")
    else:
        raise CheckpointError(
            f"--logdir={logdir} holds a training run, but none of its "
            f"checkpoints can be restored: {'; '.join(damaged)}. Nothing was "
            f"deleted and training did not start from scratch. Restore the files "
            f"from a backup, or use another --logdir for a new run."
        )
    for problem in damaged:
        logging.warning(
            "Checkpoint %s cannot be restored: %s the previous checkpoint %s "
            "instead. The damaged files are left in place.",
            problem,
            use,
            prefix,
        )
    return prefix


def resume_checkpoint(logdir: str, model: str) -> str | None:
    """Chooses the checkpoint training resumes from; None for a new run.

    Tries the checkpoints of `logdir` newest first (checkpoint_problem) and
    takes the first that reads back whole, with a warning naming each newer,
    damaged one; damaged files are left in place (nothing is ever deleted
    here). When the `checkpoint` state file names another one, it is pointed
    at the chosen checkpoint: the MonitoredTrainingSession restores what the
    state file names. Also checks the checkpoint fits the model
    (check_checkpoint_fits; `model` names its flags).

    Raises:
      CheckpointError: checkpoint files exist but none restores; training
        does not start from scratch over an existing run.
      FlagError: the checkpoint is of another agent or level.
    """
    candidates = find_checkpoints(logdir)
    state_file = os.path.join(logdir, "checkpoint")
    if not candidates:
        if os.path.exists(state_file):
            raise CheckpointError(
                f"--logdir={logdir}: its checkpoint state file {state_file} "
                f"names no checkpoint that exists. Nothing was deleted; move "
                f"the file away to start a new run there, or use another --logdir."
            )
        return None
    prefix = newest_whole_checkpoint(logdir, candidates, "resuming from")
    check_checkpoint_fits(prefix, logdir, model)
    try:
        state = tf.train.get_checkpoint_state(logdir)
    except ValueError:
        state = None
    if state is None or os.path.join(logdir, state.model_checkpoint_path) != prefix:
        # Older checkpoints the saver tracked stay tracked (so they rotate out
        # as usual); the damaged ones drop out of its list and stay on disk.
        tracked = set(state.all_model_checkpoint_paths) if state else set()
        older = [
            p
            for p in reversed(candidates)
            if p in tracked and _checkpoint_step(p) < _checkpoint_step(prefix)
        ]
        tf.compat.v1.train.update_checkpoint_state(
            logdir, prefix, all_model_checkpoint_paths=[*older, prefix]
        )
        logging.info("Pointed %s at %s.", state_file, prefix)
    return prefix


def check_checkpoint_fits(checkpoint: str | None, logdir: str, model: str) -> None:
    """Raises FlagError when `checkpoint` cannot restore this graph's variables.

    A --logdir holding a run of another agent or level would otherwise fail
    late: TensorFlow restores resource variables without checking shapes.
    `model` names the flags that shape the graph (Config.describe_model).
    """
    if checkpoint is None:
        return
    saved = dict(tf.train.list_variables(checkpoint))
    graph_names = {v.op.name for v in tf.compat.v1.global_variables()}
    if all(map(is_weight, saved)) and not all(map(is_weight, graph_names)):
        raise FlagError(
            f"--logdir={logdir}: its checkpoint holds the agent's weights only "
            f"(export_weights.py), no optimiser state or frame count, so training "
            f"cannot resume from it. Evaluate it with --mode=test, or train with "
            f"another --logdir."
        )
    training = not all(map(is_weight, graph_names))  # test mode has weights only
    if (
        training
        and any(n.startswith("popart/") for n in saved)
        and not any(n.startswith("popart/") for n in graph_names)
    ):
        raise FlagError(
            f"--logdir={logdir}: its checkpoint was trained with --popart (it "
            f"holds PopArt's statistics), this run is not ({model}). Add "
            f"--popart to resume it, or train with another --logdir."
        )
    for variable in tf.compat.v1.global_variables():
        name, shape = variable.op.name, variable.shape.as_list()
        problem = None
        if name not in saved:
            problem = f"it has no variable {name}"
        elif list(saved[name]) != shape:
            problem = f"{name} has shape {list(saved[name])} there, {shape} here"
        if problem:
            raise FlagError(
                f"--logdir={logdir}: its checkpoint does not fit this model "
                f"({model}): "
                f"{problem}. Use the flags it was trained with, or another --logdir."
            )


def _saved_shapes(logdir: str) -> dict[str, list[int]] | None:
    """The variable names and shapes of the newest readable checkpoint in
    `logdir`; None when there is none."""
    for prefix in find_checkpoints(logdir):
        try:
            return dict(tf.train.list_variables(prefix))
        except Exception:  # noqa: BLE001 - a damaged one: try the next.
            continue
    return None


def _saved_names(logdir: str) -> list[str] | None:
    shapes = _saved_shapes(logdir)
    return None if shapes is None else list(shapes)


def saved_num_values(logdir: str) -> int | None:
    """The value head's width in the newest readable checkpoint of `logdir`
    (agent/baseline/w [H, L]): L > 1 is a PopArt agent of L levels; None
    when there is no readable checkpoint or no such variable."""
    shape = (_saved_shapes(logdir) or {}).get("agent/baseline/w")
    return shape[-1] if shape else None


def saved_agent(logdir: str, torsos: tuple[str, ...]) -> tuple[str | None, bool | None]:
    """(torso, use_lstm) of the agent the newest readable checkpoint in
    `logdir` holds, from one read of its variable names: which of `torsos`
    (agent/<torso>_torso/...) and whether it has the LSTM core
    (agent/core_lstm/...); each None when there is no readable checkpoint or
    it cannot tell."""
    names = [name for name in _saved_names(logdir) or [] if is_weight(name)]
    torso = next(
        (t for t in torsos if any(n.startswith(f"agent/{t}_torso/") for n in names)),
        None,
    )
    use_lstm = any(n.startswith("agent/core_lstm/") for n in names) if names else None
    return torso, use_lstm


def is_weight(name: str) -> bool:
    """Whether checkpoint variable `name` is one of the agent's weights (not
    an optimiser slot such as agent/.../w/RMSProp or .../w/Adam_1, not the
    frame counter or Adam's beta powers)."""
    return name.startswith("agent/") and not re.search(r"/(RMSProp|Adam)(_\d+)?$", name)


def export_weights(logdir: str, out_dir: str) -> str:
    """Writes the agent's weights from `logdir`'s newest whole checkpoint to a
    new checkpoint in `out_dir` (with the frame counter, for its name).

    Returns the new checkpoint's prefix.

    Raises:
      FlagError: `logdir` has no checkpoint or `out_dir` already has one.
      LogdirError: `out_dir` cannot be written.
      CheckpointError: no checkpoint of `logdir` reads back whole.
    """
    candidates = find_checkpoints(logdir)
    if not candidates:
        raise FlagError(f"--logdir={logdir}: no checkpoint there; train first.")
    if find_checkpoints(out_dir):
        raise FlagError(
            f"--out={out_dir} already holds a checkpoint; nothing was written. "
            f"Choose an empty directory or move its files away."
        )
    ensure_logdir(out_dir, flag="out")
    source = newest_whole_checkpoint(logdir, candidates, "exporting")
    reader = tf.train.load_checkpoint(source)
    names = sorted(n for n in reader.get_variable_to_shape_map() if is_weight(n))
    step = int(reader.get_tensor("global_step"))
    with tf.Graph().as_default():
        # Saved under their original names (the dict's keys), whatever the
        # graph calls these copies, so the agent's graph restores them.
        variables = {n: tf.compat.v1.Variable(reader.get_tensor(n)) for n in names}
        saver = tf.compat.v1.train.Saver(variables, save_relative_paths=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(
                session,
                os.path.join(os.path.abspath(out_dir), "model.ckpt"),
                global_step=step,
                write_meta_graph=False,
            )
