r"""Runs a distributed IMPALA job on this machine: learner and actor tasks.

    python3 launch.py --num_actors=4 --logdir=/tmp/agent [experiment.py flags]
    python3 launch.py --num_learners=2 --num_actors=4 --logdir=/tmp/agent

starts `experiment.py --job_name=learner --task=k` for k < --num_learners
(task 0 is the chief; with several, the others serve its towers) and, for
i < --num_actors, `experiment.py --job_name=actor --task=i`, each with the
cluster flags (--learner_host, --actor_hosts, --num_actors, --num_learners,
--logdir) and every other argument forwarded unchanged and in order. Each task's stdout and stderr go to
`<logdir>/logs/<job>_<task>.log` (appended to, one header line per start).

Flag handling: launch.py takes its own flags (below) out of the command line
and forwards everything else verbatim, so the program's flags need no
declaration here. Own flags are recognised as `--name=value`, `--name value`
and `-name=value`; --num_actors, --num_learners and --logdir are both used
here and passed on.
--job_name and --task are set per task and are an error here. Put flags for
experiment.py in --flagfile if you like: --flagfile is forwarded, but then keep
--num_actors, --num_learners and --logdir on launch.py's command line.

Addresses: learner task k at localhost:PORT_BASE+k and actor i at
localhost:PORT_BASE+L+i (L learner tasks); --port_base=0 (the default) picks free ports at
start. --learner_host / --actor_hosts override them. All tasks run here, and
each TensorFlow server listens on all interfaces: keep the ports firewalled.
TF_CONFIG, if set, is removed from the tasks' environment (this launcher
defines the cluster).

End: when the chief (learner task 0) exits, the other tasks get
--actor_exit_secs to exit by themselves (they should, once the chief has
ended training), then they are stopped; launch.py exits with the chief's
exit code (128+N if a signal N
ended it). An actor that dies early is reported and the run goes on. Ctrl-C or
SIGTERM stops every task: SIGTERM to each task's process group (children start
in their own sessions, so the group includes their environment processes),
SIGKILL after --kill_grace_secs (at once on a second Ctrl-C); launch.py then
exits 128+signal. Tasks also get SIGTERM if launch.py itself is killed (Linux
parent-death signal), so no task outlives it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import app, flags

from cluster import addresses, hosts, ports
from runtime import child_main, settings

# launch.py's flags live in their own FlagValues, not absl's global FLAGS:
# experiment.py defines flags of the same names (num_actors, logdir, ...), and
# a process (a test run) that imports both modules must not clash.
FLAGS = flags.FlagValues()
# Each flag declared once in runtime/settings.py: launch.py's own
# (LAUNCH_SETTINGS) and the three of experiment.py's it uses and forwards.
_DEFINITIONS = settings.flag_definitions(
    [settings.BY_NAME[name] for name in settings.LAUNCH_FORWARDED],
    help_suffix={
        "num_actors": " launch.py starts that many actor tasks (forwarded).",
        "num_learners": " launch.py starts that many learner tasks (forwarded).",
        "logdir": " Forwarded; launch.py writes each task's output to "
        "<logdir>/logs/<job>_<task>.log.",
    },
) + settings.flag_definitions(settings.LAUNCH_SETTINGS)
for _define, _arguments in _DEFINITIONS:
    getattr(flags, _define)(**_arguments, flag_values=FLAGS)

_OWN_FLAGS = frozenset(
    [*settings.LAUNCH_FORWARDED, *(s.name for s in settings.LAUNCH_SETTINGS)]
)
_HELP_FLAGS = frozenset(["help", "helpshort", "helpfull", "helpxml", "?", "h"])
_PER_TASK_FLAGS = frozenset(["job_name", "task"])

_POLL_SECS = 0.1


def _flag_name(arg: str) -> str | None:
    """'--name=value' / '-name' -> 'name'; None for non-flags and '--'."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.lstrip("-").split("=", 1)[0]


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits argv into (launch.py's own args with argv[0], forwarded args)."""
    own, forwarded = [argv[0]], []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # Everything after '--' belongs to the program.
            forwarded.extend(argv[i:])
            break
        name = _flag_name(arg)
        if name in _OWN_FLAGS:
            own.append(arg)
            if "=" not in arg and i + 1 < len(argv):  # '--name value'
                own.append(argv[i + 1])
                i += 1
        elif name in _HELP_FLAGS:
            own.append(arg)
        else:
            forwarded.append(arg)
        i += 1
    return own, forwarded


def _parse_flags(argv: list[str]) -> list[str]:
    """app.run's flags_parser: parses launch.py's flags, returns the rest."""
    own, forwarded = split_argv(argv)
    if any(_flag_name(arg) in _HELP_FLAGS for arg in own[1:]):
        print(__doc__)
        print(
            f"launch.py's flags (all others go to the program):\n"
            f"{FLAGS.main_module_help()}"
        )
        sys.exit(0)
    try:
        FLAGS(own)
    except flags.Error as e:
        print(f"launch.py: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    flags.FLAGS([argv[0]])  # absl's own flags (logging): defaults.
    return [argv[0], *forwarded]


def _live_groups(pgids: list[int]) -> set[int]:
    """The process groups among `pgids` that still have a non-zombie member."""
    live = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        live.add(pgid)
    if not live or not os.path.isdir("/proc"):
        return live
    # Orphaned zombies (never reaped where PID 1 does not reap) still count
    # for killpg, but they are dead: keep groups with a non-zombie member.
    running = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, pgrp = fields[0], int(fields[2])  # After the command name.
        except (OSError, IndexError, ValueError):
            continue
        if state != "Z":
            running.add(pgrp)
    return live & running


class _Task:
    def __init__(self, job: str, index: int, process: subprocess.Popen, log_path: str):
        self.job = job
        self.index = index
        self.process = process
        self.log_path = log_path
        self.reported = False

    @property
    def name(self) -> str:
        return f"{self.job}_{self.index}"

    @property
    def pgid(self) -> int:
        # start_new_session makes the child a group leader: pgid == pid.
        return self.process.pid


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _say(message: str) -> None:
    print(f"launch.py: {message}", flush=True)


class Launcher:
    """Starts, watches and stops the tasks; see the module docstring."""

    def __init__(self, forwarded: list[str]):
        self.forwarded = forwarded
        self.tasks: list[_Task] = []
        self.signals: list[int] = []

    def _on_signal(self, signum, frame) -> None:
        del frame
        self.signals.append(signum)

    def _addresses(self) -> tuple[str, str]:
        learner, actors = ports.local_cluster_hosts(
            FLAGS.num_actors, FLAGS.port_base, num_learners=FLAGS.num_learners
        )
        learner_host = FLAGS.learner_host or learner
        actor_hosts = FLAGS.actor_hosts or ",".join(actors)
        # The tasks would fail the same way; fail here, before starting any.
        config = addresses.cluster_from_flags(
            learner_host, actor_hosts, FLAGS.num_actors, "learner", 0
        )
        if config.num_learners != FLAGS.num_learners:
            raise ValueError(
                f"--learner_host lists {config.num_learners} address(es) but "
                f"--num_learners={FLAGS.num_learners}; list one address per "
                f"learner task"
            )
        for job, index, address in [
            ("learner", k, a) for k, a in enumerate(config.learner_hosts)
        ] + [("actor", i, a) for i, a in enumerate(config.actor_hosts)]:
            _, port = hosts.parse_host_port(address)
            if (err := ports.port_in_use(port)) is not None:
                flag = "--learner_host" if job == "learner" else "--actor_hosts"
                raise ValueError(
                    f"port {port} for {job} task {index} ({address}) is in use: "
                    f"{err.strerror}; stop the process holding it, or pick other "
                    f"ports with --port_base=0 (free ports) or {flag}"
                )
        return ",".join(config.learner_hosts), ",".join(config.actor_hosts)

    def _start(self, job: str, index: int, cluster_args: list[str], env) -> _Task:
        log_path = os.path.join(FLAGS.logdir, "logs", f"{job}_{index}.log")
        cmd = [
            FLAGS.python,
            FLAGS.program,
            f"--job_name={job}",
            f"--task={index}",
            *cluster_args,
            *self.forwarded,
        ]
        log = open(log_path, "ab", buffering=0)
        try:
            log.write(
                f"=== launch.py {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{shlex.join(cmd)}\n".encode()
            )
            process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # SIGTERM to the task when launch.py dies (Linux).
                preexec_fn=child_main.parent_death_signal_setter(
                    signal.SIGTERM, os.getpid()
                ),
            )
        except OSError as e:
            raise ValueError(
                f"--python={FLAGS.python!r} cannot run {FLAGS.program!r}: "
                f"{e.strerror}; point --python at a Python 3 interpreter"
            ) from None
        finally:
            log.close()  # The child holds its own copy.
        task = _Task(job, index, process, log_path)
        self.tasks.append(task)
        return task

    def _interrupted(self) -> bool:
        return bool(self.signals)

    def _reap(self) -> None:
        for task in self.tasks:
            rc = task.process.poll()
            if rc is not None and not task.reported:
                task.reported = True
                _say(
                    f"{task.name} exited with code {_exit_code(rc)} (log: {task.log_path})"
                )

    def stop(self, tasks: list[_Task], grace_secs: float) -> None:
        """SIGTERM the tasks' process groups, SIGKILL what is left after grace."""

        def alive(candidates: list[_Task]) -> list[_Task]:
            groups = _live_groups([t.pgid for t in candidates])
            return [t for t in candidates if t.pgid in groups]

        live = alive(tasks)
        if not live:
            return
        _say(f"stopping {', '.join(t.name for t in live)}")
        signals_before = len(self.signals)
        for task in live:
            _kill_group(task.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_secs
        # A further Ctrl-C skips the grace period.
        while time.monotonic() < deadline and len(self.signals) <= signals_before:
            self._reap()
            live = alive(live)
            if not live:
                return
            time.sleep(_POLL_SECS)
        for task in alive(live):
            _say(f"{task.name} still running; sending SIGKILL")
            _kill_group(task.pgid, signal.SIGKILL)
        for task in live:
            try:
                task.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _say(f"{task.name} (pid {task.process.pid}) did not die after SIGKILL")
        self._reap()

    def cluster_args(self) -> list[str]:
        learner_host, actor_hosts = self._addresses()
        return [
            f"--learner_host={learner_host}",
            f"--actor_hosts={actor_hosts}",
            f"--num_actors={FLAGS.num_actors}",
            f"--num_learners={FLAGS.num_learners}",
            f"--logdir={FLAGS.logdir}",
        ]

    def print_config(self) -> int:
        """--print_config: the chief's resolved settings (every task of the
        cluster resolves the same), printed by its command in the
        foreground; no task starts and nothing is written."""
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        command = [FLAGS.python, FLAGS.program, "--job_name=learner", "--task=0"]
        return subprocess.run(
            [*command, *self.cluster_args(), *self.forwarded], env=env
        ).returncode

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        cluster_args = self.cluster_args()
        os.makedirs(os.path.join(FLAGS.logdir, "logs"), exist_ok=True)
        env = dict(os.environ)
        if env.pop("TF_CONFIG", None):
            _say(
                "TF_CONFIG is set; not passing it to the tasks (launch.py sets "
                "their cluster with flags)"
            )
        env["PYTHONUNBUFFERED"] = "1"
        try:
            learner = self._start("learner", 0, cluster_args, env)
            for k in range(1, FLAGS.num_learners):
                self._start("learner", k, cluster_args, env)
            for i in range(FLAGS.num_actors):
                if self._interrupted():
                    break
                self._start("actor", i, cluster_args, env)
            learners = "learner_0" + (
                f"..learner_{FLAGS.num_learners - 1}" if FLAGS.num_learners > 1 else ""
            )
            _say(
                f"learner at {cluster_args[0].split('=', 1)[1]}, {FLAGS.num_actors} "
                f"actor(s) at {cluster_args[1].split('=', 1)[1]}; program {FLAGS.program}"
            )
            _say(
                f"logs: {os.path.join(FLAGS.logdir, 'logs')}/"
                f"{{{learners},actor_0..actor_{FLAGS.num_actors - 1}}}.log"
            )
            while learner.process.poll() is None and not self._interrupted():
                self._reap()
                time.sleep(_POLL_SECS)
            if self._interrupted():
                name = signal.Signals(self.signals[0]).name
                _say(f"got {name}; stopping all tasks")
                return 128 + self.signals[0]
            self._reap()
            code = _exit_code(learner.process.returncode)
            if code != 0:
                _say(f"last lines of {learner.log_path}:\n{_tail(learner.log_path)}")
            actors = [t for t in self.tasks if t is not learner]
            deadline = time.monotonic() + FLAGS.actor_exit_secs
            while (
                any(t.process.poll() is None for t in actors)
                and time.monotonic() < deadline
                and not self._interrupted()
            ):
                self._reap()
                time.sleep(_POLL_SECS)
            self._reap()
            if any(t.process.poll() is None for t in actors):
                _say(
                    f"tasks still running {FLAGS.actor_exit_secs:g} s after the "
                    f"chief learner ended"
                )
            return code
        finally:
            # Every group, also of tasks that exited: their environment
            # processes may have outlived them.
            self.stop(self.tasks, FLAGS.kill_grace_secs)


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(cannot read: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def _kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _check_args(forwarded: list[str]) -> None:
    for arg in forwarded:
        if arg == "--":
            break
        if _flag_name(arg) in _PER_TASK_FLAGS:
            raise ValueError(
                f"{arg}: launch.py sets --job_name and --task for each task it "
                f"starts; remove it (to run one task by hand, call "
                f"{os.path.basename(FLAGS.program)} directly)"
            )
    if FLAGS.num_actors < 1:
        raise ValueError(
            f"--num_actors={FLAGS.num_actors}: launch at least one actor; set "
            f"--num_actors >= 1"
        )
    if FLAGS.num_learners < 1:
        raise ValueError(
            f"--num_learners={FLAGS.num_learners}: launch at least one learner; "
            f"set --num_learners >= 1"
        )
    if not os.path.isfile(FLAGS.program):
        raise ValueError(
            f"--program={FLAGS.program!r} does not exist; point it at experiment.py"
        )


def main(argv: list[str]) -> None:
    forwarded = argv[1:]
    try:
        _check_args(forwarded)
        launcher = Launcher(forwarded)
        if {"--print_config", "--print_config=true"} & set(forwarded):
            code = launcher.print_config()
        else:
            code = launcher.run()
    except ValueError as e:  # Bad flags or addresses, port in use: one line.
        print(f"launch.py: error: {e}", file=sys.stderr, flush=True)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
