"""Shared helpers of the training benchmarks (throughput, memory, profile).

Two roles:

* Imported by the benchmark scripts (no TensorFlow at import): machine
  facts, the load average, the JSON record (`write_json`), `run_experiment`
  (experiment.py in a child process, timed from inside), `measure_ceiling`
  (raw ALE with the training preprocessing, one process per core, no
  agent), the code snapshot (`snapshot_code`), /proc readers, and the
  TensorBoard events reader and rolling mean of the learning tools.
* Run as `python3 benchmarks/core/common.py run_experiment --bench_result=R.json
  --bench_warmup_s=W --bench_window_s=S <experiment.py flags>`: experiment.py's
  own `main`, unchanged, plus a session hook that records (time, frames)
  after every learner step, measures frames/s over a steady window that
  starts W seconds after the first learner step (start-up excluded), reads
  CPU time per thread group and peak memory (VmHWM) of the process and its
  environment children at the window's end, and then stops training through
  the normal path (hooks' `end`, queue closed, children closed).
"""

from __future__ import annotations

import datetime
import functools
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- machine and load -------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), as a run's record gives it."""
    from runtime.run_record import cpu_model as recorded_cpu_model

    return recorded_cpu_model()


def machine_info() -> dict:
    """nproc, CPU model, memory, Python version, date (UTC)."""
    model = cpu_model()
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def add_json_argument(parser) -> None:
    """--json PATH: where a benchmark writes its record (machine included)."""
    parser.add_argument(
        "--json", default=None, help="also write the figures to this JSON file"
    )


def write_json(path: str | None, record: dict) -> None:
    """Writes `record` with this machine's facts to `path` (None: nothing)."""
    if path is None:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine_info(), **record}, f, indent=1, default=str)
    print(f"Wrote {path}")


def loadavg() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def machine_line() -> str:
    m = machine_info()
    return (
        f"Machine: nproc={m['nproc']}, CPU model {m['cpu_model']!r}, "
        f"{m['memory_gib']} GiB, Python {m['python']}, {m['date']}; "
        f"load average (1 min) now {loadavg():.2f}"
    )


# -- /proc readers -----------------------------------------------------------------


def proc_status(pid: int | str, field: str) -> int | None:
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS), or None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/<pid>/task/*/children)."""
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        pass
    return sorted(set(kids))


def cpu_seconds(stat_path: str) -> float:
    """utime + stime of a /proc/.../stat file, in seconds (0 if gone)."""
    try:
        with open(stat_path) as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{tid: (comm, cpu seconds)} of every thread of `pid`."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except FileNotFoundError:
            continue
        out[int(tid)] = (comm, cpu_seconds(f"/proc/{pid}/task/{tid}/stat"))
    return out


# -- TensorBoard events and rolling means (the learning tools) ------------------------


def read_scalar_events(
    logdir: str, keep
) -> tuple[list[tuple[float, int, str, float]], float | None]:
    """(wall time, step, tag, value) of every scalar summary whose tag
    `keep(tag)` accepts, from every events file under `logdir`, sorted; and
    the earliest event's wall time. Only reads: safe on a run in progress
    (a record still being written is skipped)."""
    import glob

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python.util import deprecation

    deprecation._PRINT_DEPRECATION_WARNINGS = False  # summary_iterator's notice
    rows, start = [], None
    pattern = os.path.join(logdir, "**", "events.out.tfevents.*")
    for path in sorted(glob.glob(pattern, recursive=True)):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                start = (
                    event.wall_time if start is None else min(start, event.wall_time)
                )
                rows += [
                    (event.wall_time, int(event.step), v.tag, float(v.simple_value))
                    for v in event.summary.value
                    if keep(v.tag)
                ]
        except tf.errors.DataLossError:
            pass  # The file's last record is still being written.
    return sorted(rows), start


def rolling_mean(values, window: int):
    """The mean of the last `window` values (fewer at the start), each."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    low = np.maximum(0, np.arange(1, len(values) + 1) - window)
    return (cumulative[1:] - cumulative[low]) / (np.arange(1, len(values) + 1) - low)


# -- the ceiling: raw ALE with the training preprocessing, no agent -----------------


def _ceiling_worker(level, seed, seconds, start_at, result_queue):
    import numpy as np

    import environments
    from config import EnvironmentConfig

    # The environment class and options of a training actor's child (for
    # Atari: the paper's preprocessing, an episode per life), stepped in this
    # process with uniformly random actions: no pipe, no TensorFlow.
    options = environments.run_options(level, EnvironmentConfig(level, (level,), 0))
    env_type, kwargs = environments.environment_class(level, seed, **options)
    env = env_type(**kwargs)
    env.initial()
    rng = np.random.RandomState(seed)
    actions = rng.randint(environments.num_actions([level]), size=4096)
    while time.time() < start_at:  # All workers start together.
        time.sleep(0.005)
    steps, i, start, cpu_start = 0, 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            env.step(actions[i & 4095])  # Episode ends count too.
            i += 1
        steps += 50
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    getattr(env, "close", lambda: None)()
    frames = steps * env_frames_per_step()
    result_queue.put((frames / elapsed, frames / cpu))


def env_frames_per_step() -> int:
    return 4  # num_action_repeats, experiment.py's default


def measure_ceiling(
    seconds: float = 10.0,
    processes: int | None = None,
    level: str = "atari/pong",
    start_delay_s: float = 3.0,
) -> dict:
    """Frames/s of `processes` (default: all cores) processes each stepping
    `level`'s training environment with random actions (the raw ceiling:
    ALE for Atari), started `start_delay_s` from now, together.

    Returns {'frames_per_s': total, 'per_process': [...], 'frames_per_cpu_s':
    mean frames per CPU-second of a process, 'load': load average before}.
    """
    processes = processes or os.cpu_count()
    load = loadavg()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    # Time for the children to import and reset before they start together.
    start_at = time.time() + start_delay_s
    workers = [
        context.Process(
            target=_ceiling_worker, args=(level, 100 + i, seconds, start_at, results)
        )
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    rates = [results.get(timeout=seconds + 60) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    return {
        "frames_per_s": sum(r[0] for r in rates),
        "per_process": [r[0] for r in rates],
        # Frames per CPU-second of one stepping process: what the ceiling
        # would be per core with the core to itself (load-independent).
        "frames_per_cpu_s": sum(r[1] for r in rates) / len(rates),
        "load": load,
    }


# -- experiment.py in a child process, measured from inside --------------------------


def _is_code(path: str) -> bool:
    """The files a run imports, builds or reads: Python modules at the root
    and in the packages (not the tests' or the benchmarks'), batcher.cc, and
    the flag files (a family's defaults are read from its file at start)."""
    top = path.split("/")[0]
    return (
        path == "batcher.cc"
        or (top == "flagfiles" and path.endswith(".cfg"))
        or (path.endswith(".py") and top not in ("tests", "benchmarks"))
    )


def snapshot_code(revision: str | None = None) -> str:
    """Copies the code (`_is_code`) of the working tree, or of the git
    `revision`, to a temporary directory, its layout kept; returns it.

    Every run of one benchmark invocation then uses the same code, even
    while the working tree is edited, and a baseline (--baseline_code) runs
    the code of another commit beside it.
    """
    import shutil

    target = tempfile.mkdtemp(prefix="bench_code_")
    if revision is None:
        listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    else:
        listing = ["git", "ls-tree", "-r", "--name-only", revision]
    names = subprocess.run(
        listing, cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    for name in filter(_is_code, names):
        path = os.path.join(target, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if revision is None:
            if os.path.exists(os.path.join(REPO, name)):
                shutil.copy2(os.path.join(REPO, name), path)
            continue
        content = subprocess.run(
            ["git", "show", f"{revision}:{name}"],
            cwd=REPO,
            check=True,
            capture_output=True,
        ).stdout
        with open(path, "wb") as f:
            f.write(content)
    return target


_code_dir = REPO


def use_code_dir(path: str) -> None:
    """Runs later experiments from `path` (a snapshot_code() copy)."""
    global _code_dir
    _code_dir = path


def run_experiment(
    flags: dict,
    warmup_s: float = 10.0,
    window_s: float = 30.0,
    timeout_s: float = 240.0,
    extra_env: dict | None = None,
    wrap: list[str] | None = None,
    on_start=None,
) -> dict:
    """Runs experiment.py with `flags` in a child process; returns its record.

    The record: frames_per_s / learner_steps_per_s over the steady window,
    startup_s (process start to the first learner step), samples, cpu
    (seconds per thread group over the window), memory (VmHWM kB), load
    averages, returncode and the log's tail. `wrap` prefixes the command
    (e.g. py-spy); `on_start(pid, window_marker=path)` is called once the
    child runs; the file `path` appears when the steady window begins.
    """
    logdir = tempfile.mkdtemp(prefix="bench_run_")
    result_path = os.path.join(logdir, "bench_result.json")
    if on_start:
        on_start = functools.partial(on_start, window_marker=result_path + ".window")
    args = {"logdir": logdir, "level_name": "atari/pong", **flags}
    command = (wrap or []) + [
        sys.executable,
        os.path.abspath(__file__),
        "run_experiment",
        _code_dir,
        f"--bench_result={result_path}",
        f"--bench_warmup_s={warmup_s}",
        f"--bench_window_s={window_s}",
    ]
    command += [f"--{k}={v}" for k, v in args.items()]
    env = dict(os.environ, **(extra_env or {}))
    started = time.time()
    with open(os.path.join(logdir, "log.txt"), "w") as log:
        process = subprocess.Popen(
            command, cwd=_code_dir, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        if on_start:
            on_start(process.pid)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
    with open(os.path.join(logdir, "log.txt")) as f:
        log_tail = f.read()[-3000:]
    record = {"flags": flags, "returncode": returncode, "wall_s": time.time() - started}
    if os.path.exists(result_path):
        with open(result_path) as f:
            record.update(json.load(f))
    else:
        record["error"] = "no result (see log_tail)"
    record["log_tail"] = log_tail
    record["logdir"] = logdir
    return record


INTER_OP = "TensorFlow inter-op threads (executor, small ops, py_func env calls)"
INTRA_OP = "TensorFlow intra-op threads (kernels: convolutions, matmuls)"


class _Recorder:
    """Records learner steps; ends training after the steady window."""

    def __init__(self, warmup_s: float, window_s: float, result_path: str):
        self.warmup_s = warmup_s
        self.window_s = window_s
        self.result_path = result_path
        self.process_start = _process_start_time()
        self.samples: list[tuple[float, int]] = []
        self.first_step_time: float | None = None
        self.window_start: dict | None = None
        self.window_end: dict | None = None
        self.done = False

    def _snapshot(self) -> dict:
        pid = os.getpid()
        named = {t.native_id: t.name for t in threading.enumerate()}
        with open("/proc/self/comm") as f:
            own_comm = f.read().strip()
        groups: dict[str, float] = {}
        for tid, (comm, seconds) in thread_cpu(pid).items():
            name = named.get(tid)
            if tid == pid:
                group = "learner loop (main thread)"
            elif name and name.startswith("actor-"):
                group = "actor threads (Python)"
            elif name and "QueueRunner" in name:
                group = "queue runner threads (dynamic batching)"
            elif name is not None:
                group = "other Python threads"
            elif comm == "tf_Compute":
                group = INTER_OP
            elif comm == own_comm:
                # TensorFlow's intra-op (Eigen) pool leaves its threads
                # unnamed: they run the kernels (convolutions, matmuls).
                group = INTRA_OP
            else:
                group = f"other native threads ({comm})"
            groups[group] = groups.get(group, 0.0) + seconds
        kids = children(pid)
        groups["environment processes"] = sum(
            cpu_seconds(f"/proc/{k}/stat") for k in kids
        )
        return {
            "time": time.time(),
            "cpu": groups,
            "load": loadavg(),
            "threads": {k: v[0] for k, v in thread_cpu(pid).items()},
        }

    def step(self, num_env_frames: int) -> None:
        now = time.time()
        if self.first_step_time is None:
            self.first_step_time = now
        self.samples.append((now, int(num_env_frames)))
        if self.window_start is None and now >= self.first_step_time + self.warmup_s:
            self.window_start = self._snapshot()
            self.window_start["frames"] = int(num_env_frames)
            self.window_start["index"] = len(self.samples) - 1
            # Tells an outside observer (a profiler) the window has begun.
            with open(self.result_path + ".window", "w") as f:
                f.write(str(self.window_start["time"]))
        elif (
            self.window_start is not None
            and self.window_end is None
            and now >= self.window_start["time"] + self.window_s
        ):
            self.window_end = self._snapshot()
            self.window_end["frames"] = int(num_env_frames)
            self.window_end["index"] = len(self.samples) - 1
            self.window_end["memory"] = self._memory()
            self.done = True
            self.write()

    def _memory(self) -> dict:
        pid = os.getpid()
        kids = children(pid)
        return {
            "learner_vmhwm_kb": proc_status(pid, "VmHWM"),
            "learner_vmrss_kb": proc_status(pid, "VmRSS"),
            "env_vmhwm_kb": [proc_status(k, "VmHWM") for k in kids],
            "env_vmrss_kb": [proc_status(k, "VmRSS") for k in kids],
        }

    def write(self) -> None:
        start, end = self.window_start, self.window_end
        elapsed = end["time"] - start["time"]
        steps = end["index"] - start["index"]
        cpu = {k: end["cpu"].get(k, 0.0) - start["cpu"].get(k, 0.0) for k in end["cpu"]}
        result = {
            "startup_s": self.first_step_time - self.process_start,
            "window_s": elapsed,
            "frames_per_s": (end["frames"] - start["frames"]) / elapsed,
            "learner_steps_per_s": steps / elapsed,
            "learner_steps": steps,
            "cpu_s": cpu,
            "cpu_total_s": sum(cpu.values()),
            "load_start": start["load"],
            "load_end": end["load"],
            "memory": end["memory"],
            "thread_comms": sorted(set(end["threads"].values())),
            "num_threads": len(end["threads"]),
            "samples": self.samples,
        }
        with open(self.result_path, "w") as f:
            json.dump(result, f)


def _process_start_time() -> float:
    """This process's start (wall clock), from /proc."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - uptime + start_ticks / CLK_TCK


def _run_experiment_main() -> None:
    """`common.py run_experiment ...`: experiment.py's main with a recorder."""
    code_dir = sys.argv[2]
    sys.path[:] = [code_dir] + [
        p for p in sys.path if os.path.abspath(p or ".") != REPO
    ]
    import tensorflow as tf
    from absl import app, flags

    import experiment

    assert os.path.dirname(os.path.abspath(experiment.__file__)) == code_dir

    flags.DEFINE_string("bench_result", None, "Where to write the JSON record.")
    flags.DEFINE_float("bench_warmup_s", 10.0, "Seconds after the first step.")
    flags.DEFINE_float("bench_window_s", 30.0, "Seconds measured.")
    recorder_box = {}

    class StopAfterWindow(tf.compat.v1.train.SessionRunHook):
        """Asks the training session to stop once the window is measured."""

        def after_run(self, run_context, run_values):
            recorder = recorder_box.get("recorder")
            if recorder is not None and recorder.done:
                run_context.request_stop()

    # The code's own modules, in its packages or (the code of a commit from
    # before them, with --baseline_code) at its root.
    def loaded(*names):
        return next(sys.modules[name] for name in names if name in sys.modules)

    progress = loaded("learner.progress", "progress")
    sessions = loaded("runtime.sessions", "sessions")

    original_create = sessions.create_training_session

    def create_training_session(hooks, logdir, *args, **kwargs):
        f = flags.FLAGS
        recorder_box["recorder"] = _Recorder(
            f.bench_warmup_s, f.bench_window_s, f.bench_result
        )
        return original_create(hooks + [StopAfterWindow()], logdir, *args, **kwargs)

    sessions.create_training_session = create_training_session
    original_step = progress.ProgressLogger.step

    def step(self, num_env_frames, recent_returns, queue_size, *args, **kwargs):
        recorder_box["recorder"].step(num_env_frames)
        original_step(self, num_env_frames, recent_returns, queue_size, *args, **kwargs)

    progress.ProgressLogger.step = step
    sys.argv = [sys.argv[0]] + sys.argv[3:]
    app.run(experiment.main)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run_experiment":
        _run_experiment_main()
    else:
        print(machine_line())
        print(
            json.dumps(measure_ceiling(float(sys.argv[1]) if len(sys.argv) > 1 else 5))
        )
