"""The run's settings, one frozen dataclass per concern.

experiment.py fills them from its flags once (`experiment.config_from_flags`)
and validates the flags first; every other module takes the part it needs
as an argument and never reads a flag. Tests and benchmarks build them
directly. The cluster's addresses are `cluster.ClusterConfig`.

Field names follow the flags they come from (`--unroll_length` ->
`LearnerConfig.unroll_length`) except where noted.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from runtime.errors import FlagError
from runtime.settings import DEFAULTS


@dataclasses.dataclass(frozen=True)
class EnvironmentConfig:
    """The levels and how their environments are made.

    level_name: as run ('atari/pong', 'dmlab30'; the default level already
      resolved to its fallback when DeepMind Lab is missing).
    level_names: the levels it expands to (one, or a suite's 30 or 57).
    num_actions: the agent's action count for these levels.
    timeout_secs: --environment_timeout_secs; 0 waits forever.
    options: the settings of the levels' family (its `options`: e.g.
      dmlab.DeepMindLabOptions, the frame size and level cache), or None for
      the family's defaults.
    """

    level_name: str
    level_names: tuple[str, ...]
    num_actions: int
    num_action_repeats: int = DEFAULTS["num_action_repeats"]
    timeout_secs: float = DEFAULTS["environment_timeout_secs"]
    options: Any = None

    @property
    def is_suite(self) -> bool:
        """A name that expands to other names: 'dmlab30', 'atari57'."""
        return self.level_names != (self.level_name,)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """The network: `torso` is --agent ('deep' or 'shallow'), `torso_dtype`
    --torso_dtype ('float32' or 'bfloat16', what its convolutions compute in),
    `use_lstm` --use_lstm (False: no LSTM core, the heads read its inputs).
    `frame_stack` the frames it stacks (--frame_stack, resolved: the family's
    where 0), each of `frame_shape` [H, W, C] as the environment returns it
    (() without a stack; environments.frame_stack_settings gives both)."""

    torso: str
    num_actions: int
    # Whether any level has language instructions (DeepMind Lab's do, Atari's
    # never): without them the agent leaves out its instruction encoder.
    use_instruction: bool
    torso_dtype: str = DEFAULTS["torso_dtype"]
    use_lstm: bool = DEFAULTS["use_lstm"]
    # PopArt's value head (--popart): one normalised value per level of the
    # run; 0 = the paper's single value.
    num_values: int = 0
    frame_stack: int = 1
    frame_shape: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The V-trace loss and its optimiser (learner/loss.py and update.py: RMSProp, the paper's,
    or Adam), and the frames per update (num_learners x batch_size x
    unroll_length x num_action_repeats). decay and momentum are RMSProp's; epsilon is the
    optimiser's (TensorFlow's RMSProp adds it inside the square root, Adam
    outside)."""

    batch_size: int
    unroll_length: int
    num_action_repeats: int
    total_environment_frames: int
    discounting: float = DEFAULTS["discounting"]
    reward_clipping: str = DEFAULTS["reward_clipping"]
    baseline_cost: float = DEFAULTS["baseline_cost"]
    entropy_cost: float = DEFAULTS["entropy_cost"]
    learning_rate: float = DEFAULTS["learning_rate"]
    decay: float = DEFAULTS["decay"]
    momentum: float = DEFAULTS["momentum"]
    epsilon: float = DEFAULTS["epsilon"]
    max_grad_norm: float = DEFAULTS["max_grad_norm"]
    # --popart: per-level value normalisation (popart.py) over `level_names`
    # (the run's levels, whose order gives the value head's columns).
    popart: bool = DEFAULTS["popart"]
    popart_beta: float = DEFAULTS["popart_beta"]
    level_names: tuple[str, ...] = ()
    optimizer: str = DEFAULTS["optimizer"]
    # The targets' correction (learner/loss.py, OFF_POLICY_CORRECTIONS) and
    # its clipping thresholds.
    off_policy_correction: str = DEFAULTS["off_policy_correction"]
    rho_bar: float = DEFAULTS["rho_bar"]
    c_bar: float = DEFAULTS["c_bar"]
    vtrace_lambda: float = DEFAULTS["vtrace_lambda"]
    # Experience replay (learner/replay.py): the share of each batch replayed
    # and each learner's buffer's capacity in unrolls.
    replay_proportion: float = DEFAULTS["replay_proportion"]
    replay_capacity: int = DEFAULTS["replay_capacity"]
    # One learner's buffer in bytes (replay.unroll_bytes x capacity), for
    # the first line; 0 where not computed.
    replay_buffer_bytes: int = 0
    # Frames over which the learning rate decays linearly to 0; 0 means
    # total_environment_frames (the paper's schedule).
    learning_rate_decay_frames: int = DEFAULTS["learning_rate_decay_frames"]
    # --num_learners: towers, each on its own device with its own queue and
    # batch of batch_size unrolls, whose summed gradients make one update.
    num_learners: int = DEFAULTS["num_learners"]

    @property
    def decay_frames(self) -> int:
        return self.learning_rate_decay_frames or self.total_environment_frames

    @property
    def num_replayed(self) -> int:
        """Replayed unrolls in each learner's batch: round(proportion x B)."""
        return replayed_unrolls(self.replay_proportion, self.batch_size)

    @property
    def num_fresh(self) -> int:
        """Unrolls each learner takes from its queue per update."""
        return self.batch_size - self.num_replayed

    @property
    def frames_per_update(self) -> int:
        """All learners' new environment frames: N x fresh unrolls x unroll
        x action repeats (replayed unrolls were counted when they were
        fresh)."""
        return (
            self.num_learners
            * self.num_fresh
            * self.unroll_length
            * self.num_action_repeats
        )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What a run does around the model: where it writes, how many actors,
    checkpoints, test mode."""

    mode: str = DEFAULTS["mode"]
    logdir: str = DEFAULTS["logdir"]
    num_actors: int = DEFAULTS["num_actors"]
    # --envs_per_actor: environments one actor steps together (K).
    envs_per_actor: int = DEFAULTS["envs_per_actor"]
    # --envs_per_process: of those, how many share one process (M).
    envs_per_process: int = DEFAULTS["envs_per_process"]
    seed: int = DEFAULTS["seed"]
    save_checkpoint_secs: int = DEFAULTS["save_checkpoint_secs"]
    # --progress_secs: seconds between the learner's progress lines (frames,
    # frames/s, ETA, mean return).
    progress_secs: int = DEFAULTS["progress_secs"]
    # --dynamic_batching: batch the actors' inference calls (batcher.cc).
    dynamic_batching: bool = DEFAULTS["dynamic_batching"]
    test_num_episodes: int = DEFAULTS["test_num_episodes"]
    # --test_video_dir: where test mode writes a GIF per level; '' = none.
    test_video_dir: str = DEFAULTS["test_video_dir"]
    # --stalled_learner_warning_secs: how long one learner task's queue may
    # stay empty while the others' are full before the chief says which
    # actor tasks it lacks (cluster/learner_task.py, StallWatch); 0 = never.
    stalled_learner_warning_secs: float = DEFAULTS["stalled_learner_warning_secs"]
    # --finish_wait_secs: how long a cluster's finishing learner waits for a
    # task it cannot reach to confirm the end (cluster/learner_task.py).
    finish_wait_secs: float = DEFAULTS["finish_wait_secs"]
    # --learner_lost_secs: how long a task that had the learner waits for it
    # once it is lost, before exiting (cluster/actor_task.py, LearnerGoneError).
    learner_lost_secs: float = DEFAULTS["learner_lost_secs"]
    # Settings the project chose for this run, each with why (a family's
    # throughput defaults, --torso_dtype=auto): the first log line says them.
    choices: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a single-machine run or a cluster task needs."""

    run: RunConfig
    environment: EnvironmentConfig
    agent: AgentConfig
    learner: LearnerConfig

    def summary(self, num_actors: int | None = None) -> str:
        """The settings that matter, for a run's first log line; `num_actors`
        when it is not --num_actors (a cluster's actor list)."""
        environment, learner = self.environment, self.learner
        levels = len(environment.level_names)
        actors = self.run.num_actors if num_actors is None else num_actors
        envs, shared = self.run.envs_per_actor, self.run.envs_per_process
        per_actor = f" x {envs} environments" if envs > 1 else ""
        if shared > 1:
            per_actor += f" ({shared} per process)"
        return (
            f"{environment.level_name} ({levels} level{'s' if levels > 1 else ''}, "
            f"{environment.num_actions} actions), {self.agent.torso} agent"
            f"{'' if self.agent.use_lstm else ' without LSTM'}"
            f"{' (bfloat16 torso)' if self.agent.torso_dtype == 'bfloat16' else ''}, "
            f"{actors} actor{'s' if actors > 1 else ''}{per_actor}, batch {learner.batch_size}, "
            f"unroll {learner.unroll_length}, "
            f"{'PopArt, ' if learner.popart else ''}"
            f"{self._replay_text()}"
            f"{'unclipped rewards, ' if learner.reward_clipping == 'none' else ''}"
            f"{learner.total_environment_frames:,} frames, logdir {self.run.logdir}"
            + "".join(f"; {choice}" for choice in self.run.choices)
        )

    def _replay_text(self) -> str:
        """'replay 1 of 2 unrolls from 10,000 (5.8 GB a learner), '; '' off."""
        learner = self.learner
        if not learner.num_replayed:
            return ""
        size = (
            f" ({learner.replay_buffer_bytes / 1e9:.1f} GB a learner)"
            if learner.replay_buffer_bytes
            else ""
        )
        return (
            f"replay {learner.num_replayed} of {learner.batch_size} unrolls from "
            f"{learner.replay_capacity:,}{size}, "
        )

    def describe_model(self) -> str:
        """The flags a checkpoint must have been trained with, for messages."""
        return (
            f"--agent={self.agent.torso}, --use_lstm={str(self.agent.use_lstm).lower()}, "
            f"--optimizer={self.learner.optimizer}, "
            f"--level_name={self.environment.level_name}, "
            f"--popart={str(self.learner.popart).lower()}"
        )


def replayed_unrolls(proportion: float, batch_size: int) -> int:
    """round(proportion x batch_size), halves rounded up (0.5 x 1 is 1, not
    Python's banker's 0)."""
    return int(proportion * batch_size + 0.5)


# The flags that lay out actors and batches.
LAYOUT_SETTINGS = (
    "num_actors",
    "envs_per_actor",
    "envs_per_process",
    "batch_size",
    "unroll_length",
)

# A family's flag file gives these for one level; a run of N levels (a list
# or a suite) gets N times as many.
PER_LEVEL_SETTINGS = ("total_environment_frames", "learning_rate_decay_frames")


def validate_flags(
    f, family_flags: tuple = (), family_defaults: FamilyDefaults | None = None
) -> None:
    """Checks flag values (experiment.py's parsed flags, or any object with their
    names) before anything is built. `family_flags`: every family's
    FamilyFlag, checked whatever the level; `family_defaults`: the values a
    family's flag file set, whose file the message of such a value names.

    Raises:
      FlagError: with a one-line message naming the flag, the value and a fix.
    """

    def require(ok: bool, flag: str, fix: str) -> None:
        if not ok:
            given = (
                f" (from {family_defaults.flagfile}, the level's family default)"
                if family_defaults and flag in family_defaults.values
                else ""
            )
            raise FlagError(f"--{flag}={getattr(f, flag)}{given}: {fix}")

    require(f.batch_size > 0, "batch_size", "must be >= 1 (unrolls per update).")
    require(f.num_learners > 0, "num_learners", "must be >= 1 (1: one learner).")
    require(f.unroll_length > 0, "unroll_length", "must be >= 1.")
    require(
        f.frame_stack >= 0,
        "frame_stack",
        "must be >= 0 (0: the level's family's; 1: no stack).",
    )
    require(f.num_action_repeats > 0, "num_action_repeats", "must be >= 1.")
    require(0.0 <= f.discounting <= 1.0, "discounting", "must be in [0, 1].")
    require(f.learning_rate >= 0.0, "learning_rate", "must be >= 0.")
    require(f.max_grad_norm >= 0.0, "max_grad_norm", "must be >= 0 (0 turns it off).")
    require(f.epsilon > 0.0, "epsilon", "must be > 0.")
    require(f.entropy_cost >= 0.0, "entropy_cost", "must be >= 0.")
    require(f.rho_bar > 0.0, "rho_bar", "must be > 0 (the paper's 1).")
    require(f.c_bar > 0.0, "c_bar", "must be > 0 (the paper's 1).")
    require(
        0.0 <= f.vtrace_lambda <= 1.0,
        "vtrace_lambda",
        "must be in [0, 1] (1: the paper's V-trace).",
    )
    require(f.baseline_cost >= 0.0, "baseline_cost", "must be >= 0.")
    require(
        0.0 <= f.replay_proportion < 1.0,
        "replay_proportion",
        "must be in [0, 1): the share of each batch replayed (0 = no replay, "
        "the paper's 0.5); every batch needs a fresh unroll.",
    )
    if f.replay_proportion > 0.0:
        replayed = replayed_unrolls(f.replay_proportion, f.batch_size)
        if not 0 < replayed < f.batch_size:
            raise FlagError(
                f"--replay_proportion={f.replay_proportion} with "
                f"--batch_size={f.batch_size}: round(proportion x batch size) = "
                f"{replayed} replayed unrolls, but a batch needs at least one "
                f"replayed and one fresh; raise --batch_size (at 2 or more, "
                f"0.5 replays half) or change --replay_proportion."
            )
        require(
            f.replay_capacity >= f.batch_size,
            "replay_capacity",
            f"must be at least --batch_size={f.batch_size} unrolls (the "
            f"paper's 10000).",
        )
    require(
        0.0 < f.popart_beta <= 1.0,
        "popart_beta",
        "must be in (0, 1] (the paper's 3e-4 per learner step).",
    )
    require(f.save_checkpoint_secs > 0, "save_checkpoint_secs", "must be >= 1.")
    require(
        f.finish_wait_secs > 0,
        "finish_wait_secs",
        "must be > 0 (seconds the finishing learner waits for a task it cannot "
        "reach; the default is 120).",
    )
    require(
        f.learner_lost_secs > 0,
        "learner_lost_secs",
        "must be > 0 (seconds a task waits for a learner it lost before it "
        "exits; the default is 900).",
    )
    require(f.progress_secs > 0, "progress_secs", "must be >= 1.")
    for flag in family_flags:
        if flag.check is not None:
            problem = flag.check(getattr(f, flag.name))
            require(problem is None, flag.name, problem)
    require(
        f.environment_timeout_secs >= 0,
        "environment_timeout_secs",
        "must be >= 0 (0: wait for an environment forever).",
    )
    if f.mode == "test":
        require(f.test_num_episodes > 0, "test_num_episodes", "must be >= 1.")
        require(
            f.task < 0,
            "task",
            "test mode runs in one process; drop --job_name and --task.",
        )
        return
    require(
        f.total_environment_frames > 0,
        "total_environment_frames",
        "training needs a positive frame target, e.g. "
        "--total_environment_frames=1000000000.",
    )
    require(
        f.learning_rate_decay_frames >= 0,
        "learning_rate_decay_frames",
        "use a positive number of frames, or 0 to decay over "
        "--total_environment_frames.",
    )
    # The learner takes batch_size unrolls per update from a queue the actors
    # fill one unroll at a time, so any number of actors >= 1 fills any batch
    # (an actor contributes several consecutive unrolls when batch_size >
    # num_actors); with no actor the learner would wait forever.
    require(
        f.num_actors >= 1,
        "num_actors",
        f"the learner needs at least one actor to fill its batches of "
        f"{f.batch_size} unrolls; use --num_actors=1 or more.",
    )
    require(f.envs_per_actor >= 1, "envs_per_actor", "must be >= 1.")
    require(
        f.envs_per_process >= 1 and f.envs_per_actor % f.envs_per_process == 0,
        "envs_per_process",
        f"must divide --envs_per_actor={f.envs_per_actor} (each of an actor's "
        f"processes runs the same number of environments); use 1 or a divisor.",
    )


def read_flag_file(path: str) -> dict[str, str]:
    """{flag name: value} of a flag file's `--name=value` lines (absl's
    --flagfile format; comments and blank lines are skipped); a relative
    `path` is the repository's (flagfiles/...)."""
    values = {}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), path)
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("--"):
                name, _, value = line[2:].partition("=")
                values[name] = value
    return values


def learners_problem(num_learners: int, num_actors: int, num_gpus: int) -> str | None:
    """The flag error for single-machine training's --num_learners with
    `num_actors` actors and `num_gpus` GPUs for the towers (one each), or
    None. A cluster's learner tasks are checked against its own task lists
    (cluster.ClusterConfig.task_counts_problem)."""
    if num_learners > num_actors:
        return (
            f"--num_learners={num_learners}: more learners than the "
            f"{num_actors} actors that feed them (actor j feeds learner j mod "
            f"N, so learners {num_actors}..{num_learners - 1} would wait "
            f"forever); use --num_learners={num_actors} or fewer, or more actors."
        )
    if num_learners > 1 and num_gpus < num_learners:
        return (
            f"--num_learners={num_learners}: single-machine training puts each "
            f"learner on a GPU of its own and TensorFlow sees {num_gpus} GPU(s) "
            f"here; use --num_learners=1 (or at most the GPUs there are), or "
            f"learner tasks on several hosts (docs/distributed.md)."
        )
    return None


def unplayed_levels_warning(
    level_name: str, num_levels: int, num_actors: int
) -> str | None:
    """The warning for a single-machine run whose actors cannot cover its
    levels (actor i plays level i mod num_levels, actor/envs.py's
    actor_level_and_seeds),
    or None when every level has an actor."""
    if num_actors >= num_levels:
        return None
    return (
        f"--num_actors={num_actors}: {num_levels - num_actors} of the "
        f"{num_levels} levels of {level_name} get no actor and are never "
        f"trained on (actor i plays level i mod {num_levels}); use "
        f"--num_actors={num_levels} or more to train on all of them."
    )


@dataclasses.dataclass(frozen=True)
class FamilyDefaults:
    """A family's run defaults (EnvironmentFamily.default_flagfiles): the
    values of its tested command's flag file for the flags a single-machine
    run does not set, as strings to parse.

    flagfile: the file they come from.
    values: flag name -> value (--level_name left out: the run's own).
    num_levels: the levels of the run; PER_LEVEL_SETTINGS are multiplied by it.
    derived: flag name -> where its value came from instead, for a value
      that follows a flag the user gave rather than the file
      (`fill_family_defaults`).
    """

    family: str
    flagfile: str
    values: dict[str, str]
    num_levels: int = 1
    derived: dict[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """The first log line's sentence for these defaults."""
        shown = ", ".join(f"--{name}={value}" for name, value in self.values.items())
        levels = self.num_levels
        per_level = (
            f" ({int(self.values['total_environment_frames']) // levels:,} frames a "
            f"level x {levels} levels)"
            if levels > 1 and "total_environment_frames" in self.values
            else ""
        )
        return (
            f"{self.family}'s defaults from {self.flagfile}, its tested command, "
            f"for the flags not given{per_level}: {shown}"
        )


def family_defaults(
    family, agent: str | None, num_levels: int
) -> FamilyDefaults | None:
    """The `family`'s run defaults for a run of `num_levels` levels, or None
    for a family without a flag file (DeepMind Lab: the flags' own defaults,
    the reference's).

    `agent`: --agent when given; the family's flag file with that --agent is
    chosen (else its first, the family's default, with the given agent). A
    run of more levels than the file has actors gets one actor a level (actor
    i plays level i mod N) and as many environments in all as the file, or
    one an actor.
    """
    files = {path: read_flag_file(path) for path in family.default_flagfiles}
    if not files:
        return None
    chosen = next(iter(files))
    for path, file_values in files.items():
        if agent is not None and file_values.get("agent") == agent:
            chosen = path
            break
    values = files[chosen]
    values.pop("level_name", None)
    for name in PER_LEVEL_SETTINGS:
        if name in values and int(values[name]) > 0:
            values[name] = str(int(values[name]) * num_levels)
    actors = int(values.get("num_actors", "0"))
    if 0 < actors < num_levels:
        environments = actors * int(values.get("envs_per_actor", "1"))
        per_actor = max(1, environments // num_levels)
        values.update(
            num_actors=str(num_levels),
            envs_per_actor=str(per_actor),
            envs_per_process=str(per_actor),
        )
    return FamilyDefaults(family.name, chosen, values, num_levels)


def fill_family_defaults(f, defaults: FamilyDefaults) -> FamilyDefaults:
    """Parses each of `defaults.values` into the flag of `f` (absl's
    FlagValues) that was not given; returns `defaults` with the values it
    set, which is what the first line names."""
    applied, derived = {}, {}
    for name, value in defaults.values.items():
        if f[name].present:
            continue
        if (
            name == "envs_per_process"
            and f["envs_per_actor"].present
            and f.envs_per_actor % int(value)
        ):
            # A default that depends on a flag the user gave follows it: the
            # most environments a process that divides --envs_per_actor.
            derived[name] = (
                f"--envs_per_actor={f.envs_per_actor} (the most that divides it; "
                f"{defaults.flagfile} has {value})"
            )
            value = str(
                max(d for d in range(1, int(value) + 1) if f.envs_per_actor % d == 0)
            )
        f[name].parse(value)
        applied[name] = value
    return dataclasses.replace(defaults, values=applied, derived=derived)
