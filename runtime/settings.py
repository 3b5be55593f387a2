"""Every setting of a run, declared once: name, default, help, the config
section it belongs to and its choices. experiment.py defines its flags from
SETTINGS and launch.py from LAUNCH_SETTINGS and the SETTINGS it forwards
(flag_definitions), and config.py's dataclasses take their defaults from DEFAULTS,
so a
default is written in one place; a family's flag file overrides some of them
for its levels (config.family_defaults). No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a run, declared once.

    name: experiment.py's flag (--name) and the config field of that name
      (`EnvironmentConfig.timeout_secs` is --environment_timeout_secs).
    default: its declared default (a family's flag file may override it for
      that family's levels: `family_defaults`); its type is the flag's.
    help: the flag's help.
    section: the config it belongs to ("run", "environment", "agent",
      "learner"), "cluster" (cluster.ClusterConfig), "population"
      (pbt.member.PopulationConfig) or "process" (what this
      process does, not the run: --print_config).
    choices: for a choice among names, the names; () where experiment.py
      gives them from the module that owns them (the agent's torsos, the
      optimisers, the reward clippings); None for any value of the type.
    """

    name: str
    default: bool | int | float | str
    help: str
    section: str
    choices: tuple[str, ...] | None = None


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "logdir",
        "/tmp/agent",
        "Directory for checkpoints and logs.",
        "run",
    ),
    Setting(
        "mode",
        "train",
        "Training or test mode.",
        "run",
        choices=("train", "test"),
    ),
    Setting(
        "test_num_episodes",
        10,
        "Number of episodes per level (test).",
        "run",
    ),
    Setting(
        "test_video_dir",
        "",
        "Test mode: write the first episode of each level there as an "
        "animated GIF named <level>_return<return>.gif; empty writes none.",
        "run",
    ),
    Setting(
        "job_name",
        "learner",
        "Job name.",
        "cluster",
        choices=("learner", "actor"),
    ),
    Setting(
        "task",
        -1,
        "Task id; -1 for single-machine training.",
        "cluster",
    ),
    Setting(
        "learner_host",
        "localhost:8000",
        "Learner task host:port(s).",
        "cluster",
    ),
    Setting(
        "actor_hosts",
        "",
        "Comma-separated actor addresses; default localhost:8001+i.",
        "cluster",
    ),
    Setting(
        "total_environment_frames",
        1000000000,
        "Total environment frames to train for.",
        "learner",
    ),
    Setting(
        "num_actors",
        4,
        "Number of actors.",
        "run",
    ),
    Setting(
        "envs_per_actor",
        1,
        "Environments each actor steps together (each in its own process), "
        "with one inference call for all of them; 1 is the paper's actor.",
        "run",
    ),
    Setting(
        "envs_per_process",
        1,
        "How many of an actor's --envs_per_actor environments share one "
        "process, stepped in turn in one call (a divisor of "
        "--envs_per_actor); 1 gives each environment its own process.",
        "run",
    ),
    Setting(
        "batch_size",
        2,
        "Batch size (unrolls per learner step).",
        "learner",
    ),
    Setting(
        "finish_wait_secs",
        120,
        "A cluster's learner at the end of training: seconds it waits for an "
        "actor or learner task it cannot reach (no answer, no route: a "
        "partition, a host restarting its network) to come back and confirm "
        "the end; a task whose host refuses the connection is gone and not "
        "waited for.",
        "run",
    ),
    Setting(
        "learner_lost_secs",
        900,
        "A cluster's actor task, or learner task other than the chief, that "
        "has had a session with the learner: seconds it waits for the "
        "learner once it cannot reach it before it stops its environments "
        "and exits with code 3 (long enough for a learner restarted from "
        "its checkpoint). A task that never reached a learner waits for one.",
        "run",
    ),
    Setting(
        "stalled_learner_warning_secs",
        60,
        "A cluster of learner tasks: seconds one may wait for unrolls while "
        "the others' queues are full before the chief names its actor tasks; "
        "0 = never.",
        "run",
    ),
    Setting(
        "num_learners",
        1,
        "Learners updating synchronously, each with its own queue, batch of "
        "--batch_size unrolls and tower (a GPU each on one machine); their "
        "summed gradients make one update. Actor j feeds learner j mod N.",
        "learner",
    ),
    Setting(
        "unroll_length",
        100,
        "Unroll length in agent steps.",
        "learner",
    ),
    Setting(
        "num_action_repeats",
        4,
        "Environment frames per agent step.",
        "environment",
    ),
    Setting(
        "seed",
        1,
        "Random seed.",
        "run",
    ),
    Setting(
        "agent",
        "deep",
        "Agent network torso.",
        "agent",
        choices=(),
    ),
    Setting(
        "use_lstm",
        True,
        "The agent's LSTM core; false: the heads read its inputs.",
        "agent",
    ),
    Setting(
        "frame_stack",
        0,
        "How many of the latest frames the agent stacks into one observation,"
        " built in the graph so that each frame leaves the environment once;"
        " 0: the level's family's (Atari: 4; DeepMind Lab and ViZDoom stack"
        " none).",
        "agent",
    ),
    Setting(
        "torso_dtype",
        "float32",
        "<float32|bfloat16|auto>: What the torso's convolutions compute in "
        "(its weights stay float32); auto: bfloat16 where the CPU computes it"
        " natively, else float32.",
        "agent",
        choices=(),
    ),
    Setting(
        "dynamic_batching",
        True,
        "Batch the actors' inference calls into one forward pass (the dynamic"
        " batching op); false runs the agent once per actor step, unbatched.",
        "run",
    ),
    Setting(
        "entropy_cost",
        0.00025,
        "Entropy cost/multiplier.",
        "learner",
    ),
    Setting(
        "baseline_cost",
        0.5,
        "Baseline cost/multiplier.",
        "learner",
    ),
    Setting(
        "discounting",
        0.99,
        "Discounting factor.",
        "learner",
    ),
    Setting(
        "reward_clipping",
        "abs_one",
        "Reward clipping (none: rewards as they are, what --popart is for).",
        "learner",
        choices=(),
    ),
    Setting(
        "off_policy_correction",
        "vtrace",
        "The targets' off-policy correction (the paper's section 5.2.2): "
        "vtrace, no_correction, epsilon_correction (log(pi + 1e-6) in the "
        "policy gradient) or one_step_is (1-step importance sampling); "
        "learner/loss.py has each formula.",
        "learner",
        choices=(),
    ),
    Setting(
        "rho_bar",
        1.0,
        "rho-bar: the clip of the importance weights in the value targets "
        "and the policy-gradient advantages (the paper's 1; it also tried 10 "
        "and 100).",
        "learner",
    ),
    Setting(
        "c_bar",
        1.0,
        "c-bar: the clip of V-trace's trace coefficients c_s (the paper's 1).",
        "learner",
    ),
    Setting(
        "vtrace_lambda",
        1.0,
        "lambda in [0, 1] that scales V-trace's trace coefficients, c_s = "
        "lambda min(c-bar, rho_s) (the paper's remark on mixing 1-step and "
        "n-step targets, as GAE's lambda); 1 = the paper's V-trace.",
        "learner",
    ),
    Setting(
        "replay_proportion",
        0.0,
        "Experience replay on the learner: the share of each batch replayed "
        "from its buffer (round(proportion x --batch_size) unrolls, the rest "
        "fresh from the actors); 0 = off, the paper's study used 0.5. The "
        "buffer starts empty with each training session.",
        "learner",
    ),
    Setting(
        "replay_capacity",
        10000,
        "Unrolls each learner's replay buffer holds (first in, first out; "
        "sampled uniformly); the paper's 10,000. Its memory is stated at "
        "start and must fit the memory available.",
        "learner",
    ),
    Setting(
        "popart",
        False,
        "PopArt value normalisation per level (popart.py).",
        "learner",
    ),
    Setting(
        "popart_beta",
        0.0003,
        "PopArt statistics' decay per learner step.",
        "learner",
    ),
    Setting(
        "level_name",
        "explore_goal_locations_small",
        "Level: a DeepMind Lab level, 'dmlab30', 'atari/<game>', 'atari57', "
        "'vizdoom/<scenario>' or 'vizdoom' (single-machine training of an "
        "Atari or ViZDoom level takes its family's tested flag file for the "
        "flags not given, docs/flags.md). The default falls back to "
        "atari/pong without DeepMind Lab.",
        "environment",
    ),
    Setting(
        "learning_rate",
        0.00048,
        "Learning rate.",
        "learner",
    ),
    Setting(
        "learning_rate_decay_frames",
        0,
        "Environment frames over which the learning rate decays linearly to 0"
        " (and stays 0 after); 0 means --total_environment_frames.",
        "learner",
    ),
    Setting(
        "optimizer",
        "rmsprop",
        "Optimizer.",
        "learner",
        choices=(),
    ),
    Setting(
        "decay",
        0.99,
        "RMSProp optimizer decay.",
        "learner",
    ),
    Setting(
        "momentum",
        0.0,
        "RMSProp momentum.",
        "learner",
    ),
    Setting(
        "epsilon",
        0.1,
        "Epsilon (in RMSProp's square root).",
        "learner",
    ),
    Setting(
        "max_grad_norm",
        0.0,
        "Clip gradients to this global norm; 0 turns clipping off (the "
        "paper's Atari runs used 40).",
        "learner",
    ),
    Setting(
        "save_checkpoint_secs",
        600,
        "Seconds between checkpoints; one is also written when training "
        "starts, when it ends and on SIGINT/SIGTERM.",
        "run",
    ),
    Setting(
        "progress_secs",
        10,
        "Seconds between progress lines.",
        "run",
    ),
    Setting(
        "print_config",
        False,
        "Print the resolved settings with where each comes from (default, the"
        " family's flag file, --flagfile, command line, TF_CONFIG, the "
        "logdir's run record) and exit, writing nothing.",
        "process",
    ),
    Setting(
        "population_dir",
        "",
        "Population Based Training (docs/pbt.md): the population's shared "
        "directory (a local path, NFS or a bucket, read and written through "
        "tf.io.gfile); each member is a run of its own with its own "
        "--logdir and --population_member. Empty: no population.",
        "population",
    ),
    Setting(
        "population_member",
        -1,
        "This run's index in the population (0 to --population_size - 1).",
        "population",
    ),
    Setting(
        "population_size",
        24,
        "Members of the population (the paper's 24).",
        "population",
    ),
    Setting(
        "pbt_hyperparameters",
        "learning_rate,entropy_cost,epsilon",
        "The hyperparameters that evolve (the paper's; its Atari agent also "
        "evolved max_grad_norm), each drawn from its prior at the start.",
        "population",
    ),
    Setting(
        "pbt_learning_rate_prior",
        "5e-6,5e-3",
        "low,high of the learning rate's log-uniform prior (the paper's).",
        "population",
    ),
    Setting(
        "pbt_entropy_cost_prior",
        "5e-5,1e-2",
        "low,high of the entropy cost's log-uniform prior (the paper's).",
        "population",
    ),
    Setting(
        "pbt_epsilon_choices",
        "0.1,0.001,1e-05,1e-07",
        "The choices of RMSProp's epsilon (the paper's).",
        "population",
    ),
    Setting(
        "pbt_max_grad_norm_prior",
        "10,100",
        "low,high of the gradient clip's log-uniform prior (not given by the "
        "paper; around Atari's 40).",
        "population",
    ),
    Setting(
        "pbt_burn_in_frames",
        20_000_000,
        "No evolution before a member has trained this many frames (the paper's 20 M).",
        "population",
    ),
    Setting(
        "pbt_ready_episodes",
        5000,
        "Episodes a member plays between two evolutions (the paper's 5,000).",
        "population",
    ),
    Setting(
        "pbt_copy_threshold",
        5.0,
        "A member copies the one it is compared with when that one's fitness "
        "is higher by more than this: percentage points of the capped "
        "human-normalised score (the paper's 5), or return where the levels "
        "have no published scores.",
        "population",
    ),
    Setting(
        "pbt_perturb_probability",
        0.33,
        "Each evolving hyperparameter is perturbed with this probability at "
        "each evolution (the paper's 0.33).",
        "population",
    ),
    Setting(
        "pbt_perturb_factor",
        1.2,
        "A perturbation multiplies or divides by this (the paper's 1.2).",
        "population",
    ),
    Setting(
        "environment_timeout_secs",
        600,
        "Seconds an environment process may take to answer one call (a step, "
        "or the first observation of a level, which DeepMind Lab may need "
        "minutes to compile) before it is taken for hung, killed and "
        "restarted; 0 = no limit.",
        "environment",
    ),
)

# name -> declared default; the config dataclasses' defaults read it.
DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}

# name -> its declaration.
BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}

# launch.py's settings: how it starts a cluster's tasks on this machine. Its
# --num_actors, --num_learners and --logdir are experiment.py's (SETTINGS),
# used there and forwarded to every task (LAUNCH_FORWARDED).
LAUNCH_FORWARDED: tuple[str, ...] = ("num_actors", "num_learners", "logdir")
LAUNCH_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "learner_host",
        "",
        "HOST:PORT of the learner task (comma-separated, one per learner "
        "task); empty = localhost with ports from --port_base.",
        "launch",
    ),
    Setting(
        "actor_hosts",
        "",
        "Comma-separated HOST:PORT of the actors; empty = localhost with "
        "ports from --port_base.",
        "launch",
    ),
    Setting(
        "port_base",
        0,
        "Learner task k's port is port_base+k, actor i's port_base+L+i "
        "(L = --num_learners). 0 = pick free ports.",
        "launch",
    ),
    Setting(
        "program",
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiment.py"
        ),
        "The script every task runs.",
        "launch",
    ),
    Setting(
        "python",
        sys.executable,
        "Python interpreter for the tasks.",
        "launch",
    ),
    Setting(
        "actor_exit_secs",
        60.0,
        "After the learner exits, seconds the actors get to exit by "
        "themselves before being stopped.",
        "launch",
    ),
    Setting(
        "kill_grace_secs",
        10.0,
        "Seconds between SIGTERM and SIGKILL when stopping tasks.",
        "launch",
    ),
)

_DEFINE = {bool: "bool", int: "integer", float: "float", str: "string"}


def flag_definitions(
    declared: Iterable[Setting],
    choices: Mapping[str, Sequence[str]] | None = None,
    help_suffix: Mapping[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """How a script defines its absl flags from declared settings (this module
    reads no flags): per setting, the name of absl.flags' DEFINE function and
    its arguments. Its type follows the default's; an enum where the setting
    has choices (`choices[name]` where the declaration leaves them to the
    module that owns them); `help_suffix[name]` follows the declared help."""
    definitions = []
    for setting in declared:
        arguments = {
            "name": setting.name,
            "default": setting.default,
            "help": setting.help + (help_suffix or {}).get(setting.name, ""),
        }
        if setting.choices is not None:
            names = setting.choices or (choices or {})[setting.name]
            definitions.append(
                ("DEFINE_enum", arguments | {"enum_values": list(names)})
            )
        else:
            definitions.append((f"DEFINE_{_DEFINE[type(setting.default)]}", arguments))
    return definitions
