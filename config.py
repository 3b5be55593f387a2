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
    num_action_repeats: int = 4
    timeout_secs: float = 600
    options: Any = None

    @property
    def is_suite(self) -> bool:
        """A name that expands to other names: 'dmlab30', 'atari57'."""
        return self.level_names != (self.level_name,)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """The network: `torso` is --agent ('deep' or 'shallow'), `torso_dtype`
    --torso_dtype ('float32' or 'bfloat16', what its convolutions compute in),
    `use_lstm` --use_lstm (False: no LSTM core, the heads read its inputs)."""

    torso: str
    num_actions: int
    # Whether any level has language instructions (DeepMind Lab's do, Atari's
    # never): without them the agent leaves out its instruction encoder.
    use_instruction: bool
    torso_dtype: str = "float32"
    use_lstm: bool = True
    # PopArt's value head (--popart): one normalised value per level of the
    # run; 0 = the paper's single value.
    num_values: int = 0


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
    discounting: float = 0.99
    reward_clipping: str = "abs_one"
    baseline_cost: float = 0.5
    entropy_cost: float = 0.00025
    learning_rate: float = 0.00048
    decay: float = 0.99
    momentum: float = 0.0
    epsilon: float = 0.1
    max_grad_norm: float = 0.0
    # --popart: per-level value normalisation (popart.py) over `level_names`
    # (the run's levels, whose order gives the value head's columns).
    popart: bool = False
    popart_beta: float = 3e-4
    level_names: tuple[str, ...] = ()
    optimizer: str = "rmsprop"
    # Frames over which the learning rate decays linearly to 0; 0 means
    # total_environment_frames (the paper's schedule).
    learning_rate_decay_frames: int = 0
    # --num_learners: towers, each on its own device with its own queue and
    # batch of batch_size unrolls, whose summed gradients make one update.
    num_learners: int = 1

    @property
    def decay_frames(self) -> int:
        return self.learning_rate_decay_frames or self.total_environment_frames

    @property
    def frames_per_update(self) -> int:
        """All learners' frames: N x batch x unroll x action repeats."""
        return (
            self.num_learners
            * self.batch_size
            * self.unroll_length
            * self.num_action_repeats
        )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What a run does around the model: where it writes, how many actors,
    checkpoints, test mode."""

    mode: str = "train"
    logdir: str = "/tmp/agent"
    num_actors: int = 4
    # --envs_per_actor: environments one actor steps together (K).
    envs_per_actor: int = 1
    # --envs_per_process: of those, how many share one process (M).
    envs_per_process: int = 1
    seed: int = 1
    save_checkpoint_secs: int = 600
    # --dynamic_batching: batch the actors' inference calls (batcher.cc).
    dynamic_batching: bool = True
    test_num_episodes: int = 10
    # --test_video_dir: where test mode writes a GIF per level; '' = none.
    test_video_dir: str = ""
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
            f"{'unclipped rewards, ' if learner.reward_clipping == 'none' else ''}"
            f"{learner.total_environment_frames:,} frames, logdir {self.run.logdir}"
            + "".join(f"; {choice}" for choice in self.run.choices)
        )

    def describe_model(self) -> str:
        """The flags a checkpoint must have been trained with, for messages."""
        return (
            f"--agent={self.agent.torso}, --use_lstm={str(self.agent.use_lstm).lower()}, "
            f"--optimizer={self.learner.optimizer}, "
            f"--level_name={self.environment.level_name}, "
            f"--popart={str(self.learner.popart).lower()}"
        )


# The flags that lay out actors and batches. A family may bring its own
# values for them (EnvironmentFamily.throughput_defaults), used as a set and
# only when none of them is on the command line.
LAYOUT_SETTINGS = (
    "num_actors",
    "envs_per_actor",
    "envs_per_process",
    "batch_size",
    "unroll_length",
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


def learners_problem(
    num_learners: int, num_actors: int, num_gpus: int | None
) -> str | None:
    """The flag error for --num_learners with `num_actors` actors, or None.
    `num_gpus`: the GPUs single-machine training has for the towers (one
    each); None for a cluster task, whose learners are its learner tasks
    (ClusterConfig.learners_problem checks their number)."""
    if num_learners > num_actors:
        return (
            f"--num_learners={num_learners}: more learners than the "
            f"{num_actors} actors that feed them (actor j feeds learner j mod "
            f"N, so learners {num_actors}..{num_learners - 1} would wait "
            f"forever); use --num_learners={num_actors} or fewer, or more actors."
        )
    if num_gpus is not None and num_learners > 1 and num_gpus < num_learners:
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


def actor_layout(
    values: dict[str, int], family, torso: str, use_family_defaults: bool
) -> tuple[dict[str, int], list[str]]:
    """The LAYOUT_SETTINGS' values for a run, and why, for its first log line.

    `values`: the flags' values. With `use_family_defaults` (single-machine
    training with none of them on the command line) the family's throughput
    defaults for the `torso` agent replace them all (Atari's are its fastest
    measured layout); otherwise, or for a family without defaults, they stay.
    """
    defaults = family.throughput_defaults(torso) if use_family_defaults else None
    if not defaults:
        return dict(values), []
    values = {**values, **defaults}
    shown = ", ".join(f"--{name}={values[name]}" for name in LAYOUT_SETTINGS)
    return values, [
        f"{family.name}'s throughput defaults for the {torso} agent ({shown}; "
        f"no layout flag given, any one given keeps the flags' own defaults)"
    ]
