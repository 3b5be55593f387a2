"""IMPALA: the flags, and the wiring of training, test mode and cluster tasks.

Reads top to bottom: the flags; `apply_family_defaults`, `validate_flags` and
`config_from_flags`, which turn them into one frozen `config.Config` (the only
place a flag is read); `run_training`, which starts single-machine training
(single_machine/training.py: the actors are threads of this process, no
network port) or this process's cluster task (cluster/, --job_name and
--task >= 0); `run_mode` and `main`. Test mode is evaluation/test_mode.py.
"""

import dataclasses
import functools
import os
import platform
import sys

from runtime import cpu_features, tf_logging

# TensorFlow reads TF_ENABLE_ONEDNN_OPTS at import: turn its oneDNN kernels on
# where it would leave them off (AVX2-only x86 CPUs), unless the user chose.
ONEDNN_CHOICE = cpu_features.default_onednn(os.environ, platform.machine())

# Before anything imports TensorFlow: hide the C++ runtime's INFO and WARNING
# lines (start-up banners, "enqueue cancelled" at every shutdown) so that what
# this script prints stays readable; errors still show. This script logs the
# device choice itself. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything.
tf_logging.import_tensorflow_quietly()

from absl import app, flags, logging

import agent as agent_lib
import config as config_lib
import environments
import py_process
from actor.unroll import actor_output_specs
from cluster import actor_task, addresses, learner_task, ports, servers, spec
from cluster.state import exit_cluster_task
from config import (
    AgentConfig,
    Config,
    EnvironmentConfig,
    LearnerConfig,
    RunConfig,
)
from evaluation import checkpoint_agent, test_mode
from families.contract import FamilyFlag
from learner import replay
from learner.loss import OFF_POLICY_CORRECTIONS, REWARD_CLIPPINGS
from learner.update import OPTIMIZERS
from pbt import member as pbt_member
from runtime import checkpoints, run_record, sessions, settings
from runtime.errors import FlagError, LogdirError, TrainingError
from runtime.shutdown import ShutdownRequest
from single_machine import training

# -- flags ---------------------------------------------------------------------

# Every flag is a setting declared once in runtime/settings.py (its default, help
# and section); the choices of these come from the modules that own them.
CHOICES = {
    "agent": list(agent_lib.TORSOS),
    "torso_dtype": [*agent_lib.TORSO_DTYPES, cpu_features.TORSO_DTYPE_AUTO],
    "reward_clipping": list(REWARD_CLIPPINGS),
    "off_policy_correction": list(OFF_POLICY_CORRECTIONS),
    "optimizer": list(OPTIMIZERS),
}
for _define, _arguments in settings.flag_definitions(settings.SETTINGS, CHOICES):
    getattr(flags, _define)(**_arguments)

FLAGS = flags.FLAGS
# The command line of this run (argv[0] first), for its record's sources.
_ARGV: list[str] = list(sys.argv)

# Each family's own flags (DeepMind Lab's --width, --height, --dataset_path,
# --level_cache_dir, ...): declared by the family, defined here.
_family_flags: dict[str, FamilyFlag] = {}


def define_family_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the flags of each registered family not defined yet (a family
    that replaces another shares its flags); ValueError for a name taken."""
    for family in environments.families():
        for flag in family.flags:
            if _family_flags.get(flag.name) == flag:
                continue
            if flag.name in flag_values:
                raise ValueError(
                    f"{family.name} declares --{flag.name}, a flag already"
                )
            # Defined as a declared setting is (its type from its default).
            declared = settings.Setting(flag.name, flag.default, flag.help, "family")
            ((define, arguments),) = settings.flag_definitions([declared])
            getattr(flags, define)(**arguments, flag_values=flag_values)
            _family_flags[flag.name] = flag


define_family_flags()


# -- from flags to a config ------------------------------------------------------


def validate_flags(f, family_defaults: config_lib.FamilyDefaults | None = None) -> None:
    """config.validate_flags with every family's flags; `family_defaults`:
    what apply_family_defaults set, which its messages name."""
    config_lib.validate_flags(f, tuple(_family_flags.values()), family_defaults)


def apply_family_defaults(f: flags.FlagValues) -> config_lib.FamilyDefaults | None:
    """Training, on one machine or as a cluster's task: the values of the
    level's family's tested flag file (config.family_defaults) fill the
    flags not given, so that a level is the same experiment whichever way
    it starts; returns those it set, or None (test mode, which reads the
    run's record or checkpoint instead; a family without a file; a level
    name that config_from_flags will reject). A cluster's number of actors
    is its own (its actor tasks), not the file's."""
    if f.mode != "train":
        return None
    try:
        level_name, level_names, _ = environments.resolve_levels(
            f.level_name, not f["level_name"].present
        )
    except ValueError:
        return None
    agent = f.agent if f["agent"].present else None
    family = environments.family_of(level_name)
    defaults = config_lib.family_defaults(family, agent, len(level_names))
    if defaults and is_cluster_task(f):
        values = {k: v for k, v in defaults.values.items() if k != "num_actors"}
        defaults = dataclasses.replace(defaults, values=values)
    return defaults and config_lib.fill_family_defaults(f, defaults)


def is_cluster_task(f: flags.FlagValues) -> bool:
    return "TF_CONFIG" in os.environ or any(
        f[name].present for name in ("job_name", "learner_host", "actor_hosts")
    )


def experiment_flag_names(f: flags.FlagValues = FLAGS) -> list[str]:
    """The settings a run records: this script's flags and those of the
    families registered now (a family's flags stay defined in this process
    after it is gone from the registry, as a test's toy family is)."""
    family_flags = {
        flag.name for family in environments.families() for flag in family.flags
    }
    names = family_flags | set(settings.DEFAULTS)
    return sorted(name for name in names if name in f)


def restore_from_record(f: flags.FlagValues) -> tuple[dict | None, dict]:
    """The logdir's run record (None without one) and the settings taken
    from it: every flag not given, except this process's own. A cluster's
    number of actors is its own (its actor tasks), not the record's: an
    actor task that took the chief's would contradict a TF_CONFIG or an
    --actor_hosts that lists another number."""
    record = run_record.read(f.logdir)
    own = ("num_actors",) if is_cluster_task(f) else ()
    return record, run_record.restore(f, record, experiment_flag_names(f), own)


def resolved_settings(
    f: flags.FlagValues,
    config: Config,
    family_defaults: config_lib.FamilyDefaults | None,
    restored: dict,
    cluster: spec.ClusterConfig | None = None,
) -> dict[str, dict]:
    """Every setting with its source (run_record.resolve_settings); the
    level as resolved (the default's fallback where DeepMind Lab is absent)
    and, in a cluster task, the number of actors its cluster has."""
    tf_config = ("job_name", "task") if "TF_CONFIG" in os.environ else ()
    settings = run_record.resolve_settings(
        f,
        experiment_flag_names(f),
        _ARGV,
        family_defaults.values if family_defaults else {},
        family_defaults.flagfile if family_defaults else "",
        restored,
        tf_config,
        family_defaults.derived if family_defaults else None,
    )
    settings["level_name"]["value"] = config.environment.level_name
    if cluster is not None and spec.from_tf_config(cluster.source):
        settings["num_actors"] = {
            "value": cluster.num_actors,
            "source": run_record.TF_CONFIG,
        }
    return settings


def config_from_flags(
    f: flags.FlagValues, family_defaults: config_lib.FamilyDefaults | None = None
) -> Config:
    """The run's Config from validated flags (it may warn of the level);
    `family_defaults`: what apply_family_defaults set, for the first line.

    Raises:
      FlagError: an unknown level, a level whose family is not installed,
        more environments to a process than the family allows, or a family
        option that cannot be used (an unwritable level cache directory).
    """
    try:
        level_name, level_names, warning = environments.resolve_levels(
            f.level_name, not f["level_name"].present, is_test=f.mode == "test"
        )
        stack = environments.frame_stack_settings(level_names, f.frame_stack)
    except ValueError as e:
        raise FlagError(str(e)) from None
    if warning:  # the default level's fallback
        logging.warning(warning)
    family = environments.family_of(level_name)
    torso, use_lstm, num_values = agent_settings(f, len(level_names))
    cluster_task = is_cluster_task(f)
    choices = [family_defaults.describe()] if family_defaults else []
    if problem := family.envs_per_process_problem(f.envs_per_process, level_name):
        raise FlagError(problem)
    num_actions = environments.num_actions(level_names)
    torso_dtype, why, warning = cpu_features.torso_dtype_for_this_cpu(f.torso_dtype)
    choices += [note for note in (why, ONEDNN_CHOICE) if note]
    if warning:
        logging.warning(warning)
    if f.mode == "train" and not cluster_task:
        # One GPU a learner on one machine; a cluster's learner tasks and
        # actor tasks are checked against its own (cluster_config_from_flags).
        gpus = sessions.num_gpus() if f.task < 0 else None
        if gpus is not None and (
            problem := config_lib.learners_problem(f.num_learners, f.num_actors, gpus)
        ):
            raise FlagError(problem)
        if warning := config_lib.unplayed_levels_warning(
            level_name, len(level_names), f.num_actors
        ):
            logging.warning(warning)
    options = family.options({flag.name: f[flag.name].value for flag in family.flags})
    return Config(
        run=from_flags(f, RunConfig, choices=tuple(choices)),
        environment=EnvironmentConfig(
            level_name=level_name,
            level_names=tuple(level_names),
            num_actions=num_actions,
            num_action_repeats=f.num_action_repeats,
            timeout_secs=f.environment_timeout_secs,
            options=options,
        ),
        agent=AgentConfig(
            torso=torso,
            num_actions=num_actions,
            use_instruction=environments.has_instructions(level_names),
            torso_dtype=torso_dtype,
            use_lstm=use_lstm,
            num_values=num_values,
            **stack,
        ),
        learner=from_flags(
            f,
            LearnerConfig,
            popart=bool(num_values) and f.mode == "train",
            level_names=tuple(level_names),
        ),
    )


def from_flags(f: flags.FlagValues, kind: type, **others):
    """The dataclass `kind` with each field named as a flag from that flag,
    the rest from `others`."""
    fields = (field.name for field in dataclasses.fields(kind))
    return kind(
        **{n: f[n].value for n in fields if n in f and n not in others}, **others
    )


def agent_settings(f: flags.FlagValues, num_levels: int) -> tuple[str, bool, int]:
    """(--agent, --use_lstm, the value head's width: 0, or one per level with
    --popart); test mode reads those not given from the checkpoint."""
    if f.mode != "test":
        return f.agent, f.use_lstm, num_levels if f.popart else 0
    torso, use_lstm = checkpoint_agent.agent_settings(
        f.logdir,
        f.agent,
        f.use_lstm,
        torso_given=f["agent"].present,
        lstm_given=f["use_lstm"].present,
    )
    num_values = checkpoint_agent.num_values(
        f.logdir, f.popart, popart_given=f["popart"].present, num_levels=num_levels
    )
    return torso, use_lstm, num_values


def cluster_config_from_flags(f: flags.FlagValues) -> spec.ClusterConfig | None:
    """The cluster from the address flags or TF_CONFIG; None = single machine.

    Raises:
      FlagError: a malformed address, flags that contradict TF_CONFIG, or
        a --num_learners that is not the number of learner tasks.
    """
    # resolve_cluster's arguments, in its order, and which of them were given.
    names = ("learner_host", "actor_hosts", "num_actors", "job_name", "task")
    try:
        cluster = addresses.resolve_cluster(
            *(f[name].value for name in names),
            explicit_flags={name for name in names if f[name].present},
        )
    except ValueError as e:
        raise FlagError(str(e)) from None
    if cluster and (problem := cluster.task_counts_problem(f.num_learners)):
        raise FlagError(problem)
    return cluster


# -- the mode, and main --------------------------------------------------------------


def run_training(
    config: Config,
    cluster_config: spec.ClusterConfig | None,
    shutdown: ShutdownRequest,
    record: dict | None = None,
    member: pbt_member.Member | None = None,
) -> None:
    """--mode=train: single-machine training, or this task of a cluster.
    `record`: the run record that single-machine training and the chief
    write to --logdir before the first update (run_record); `member`: this
    run's place in a population (PBT), or None."""
    if cluster_config is None or cluster_config.is_chief:
        # Only the chief writes to --logdir: fail now, not at the first save.
        checkpoints.ensure_logdir(config.run.logdir)
        if record is not None:
            try:
                run_record.write(config.run.logdir, record)
                run_record.write_hparams(config.run.logdir, record["settings"])
            except OSError as e:
                raise LogdirError(
                    f"--logdir={config.run.logdir}: writing the run's record "
                    f"failed: {e.strerror or e}; free space there or give "
                    f"another --logdir."
                ) from None
    if cluster_config is None:
        training.train(config, shutdown, member)
        return
    proto = servers.server_config(cluster_config, base=sessions.session_config())
    try:
        server = servers.start_server(cluster_config, proto)
    except ports.PortInUseError as e:
        raise FlagError(str(e)) from None
    chief = functools.partial(learner_task.run, evolver=member)
    run_task = dict(chief=chief, learner=learner_task.serve)
    run_task.get(cluster_config.role, actor_task.run)(
        config, cluster_config, server, proto, shutdown
    )


def run_mode(f: flags.FlagValues = FLAGS) -> int:
    """Runs --mode with the parsed flags `f`; returns the exit code."""
    shutdown = ShutdownRequest()
    try:
        # Given > the logdir's run record > the family's flag file > the
        # declared default.
        old_record, restored = restore_from_record(f)
        family_defaults = apply_family_defaults(f)
        validate_flags(f, family_defaults)
        config = config_from_flags(f, family_defaults)
        cluster_config = (
            cluster_config_from_flags(f) if config.run.mode == "train" else None
        )
        settings = resolved_settings(
            f, config, family_defaults, restored, cluster_config
        )
        if differences := run_record.fixed_differences(old_record, settings):
            raise FlagError("\n".join(differences))
        if f.print_config:
            print(run_record.describe(settings))
            return 0
        if config.run.mode == "test":
            test_mode.test(config)
        else:
            role = cluster_config.role if cluster_config else "single"
            if config.learner.num_replayed:  # the buffers this process holds
                held = dict(single=config.learner.num_learners, actor=0).get(role, 1)
                specs = actor_output_specs(
                    config.environment, config.agent, config.learner.unroll_length
                )
                config = replay.checked_config(config, specs, held)
            config, member = pbt_member.join_population(
                FLAGS.flag_values_dict(), config, role
            )
            record = (
                run_record.resumed_record(old_record, settings, _ARGV)
                if old_record
                else run_record.new_record(settings, _ARGV, config.agent.torso_dtype)
            )
            with shutdown.handling_signals():
                run_training(config, cluster_config, shutdown, record, member)
    except (FlagError, TrainingError) as e:
        # One line, no traceback, and the error's exit code: 2 for the
        # command line; 1 when training cannot go on (an environment given
        # up on, a NaN/Inf update, checkpoints that do not restore).
        # Several problems (a resume's differences from its record): a
        # line each.
        for line in str(e).splitlines():
            print(f"experiment.py: error: {line}", file=sys.stderr)
        return e.exit_code
    except py_process.PyProcessError as e:
        # An environment that cannot even start (e.g. a bad level or path):
        # the first line of the error (its child traceback is left out).
        cause = str(e).strip().splitlines()[0]
        print(
            f"experiment.py: error: --level_name={f.level_name}: an environment "
            f"failed to start: {cause}",
            file=sys.stderr,
        )
        return 1
    # Stopped by SIGINT/SIGTERM after a final checkpoint: 128 + signal
    # number, as a shell reports a process ended by that signal.
    return shutdown.exit_code if shutdown.requested else 0


def parse_flags(argv: list[str]) -> flags.FlagValues:
    """Parses `argv` (argv[0] the program) into FLAGS afresh (every flag it
    does not name at its default), for a command line run in-process."""
    define_family_flags()
    FLAGS.unparse_flags()
    FLAGS(argv)
    _ARGV[:] = argv
    return FLAGS


def main(argv) -> None:
    del argv
    tf_logging.quiet_tensorflow_logging()
    code = run_mode(FLAGS)
    if servers.server_started():
        exit_cluster_task(code)
    if code:
        sys.exit(code)


def parse_command_line(argv: list[str]) -> list[str]:
    define_family_flags()  # also those of families registered since import
    _ARGV[:] = argv
    return app.parse_flags_with_usage(argv)


def run() -> None:
    app.run(main, flags_parser=parse_command_line)


if __name__ == "__main__":
    run()
