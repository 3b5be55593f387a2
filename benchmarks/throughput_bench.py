"""Single-machine training throughput against the raw-ALE ceiling.

Runs experiment.py (its own `main`, in a child process per configuration; see
common.run_experiment) on atari/pong and reports environment frames/s over a
steady window that starts `--warmup_s` after the first learner step (start-up
excluded), next to the ceiling measured in the same invocation: every core
stepping `atari.PyProcessAtari` in its own process with the training
preprocessing and random actions, no agent, no TensorFlow (measured at the
start and at the end of the invocation; the ratio uses their mean).

Parts (each one invocation; `--part=all` runs every part in turn), each
named for what it varies:
  layouts             actors x environments per actor over 1-16 actors,
                      shallow and deep (plot: throughput_layouts.png)
  envs_per_process    M environments to a process against one per process
                      (plot: throughput_envs_per_process.png)
  envs_per_process_range  M > 1 over the rest of the actor range
  torso_dtype         float32 against bfloat16 convolutions, deep and
                      shallow (plot: throughput_torso_dtype.png)
  torso_dtype_deep    the deep agent: 8 x 1 float32 against 8 x 4 and
                      8 x 8 bfloat16
  defaults            a run given only --agent (Atari's throughput defaults)
                      against the agent's best documented setting
  avx2_kernels        oneDNN capped at AVX2 (an AVX2-only CPU's kernels):
                      TensorFlow's default there (oneDNN off) against the
                      project's (on), shallow and deep float32 defaults
  deep_threads        the deep agent's defaults with one thread per kernel
                      against one per core (float32 on AVX2 kernels, auto)
  profile             shallow agent at Atari's defaults (4 x 32, 32 per
                      process), the CPU's own kernels and AVX2 kernels: the
                      CPU time of each thread group and process over the
                      window (/proc), optionally `--py_spy` samples
  shallow_batch       the shallow agent at 8 x 8 with batch 8, 16 and 32
  shallow_batch32_layouts  the shallow agent at batch 32 over 32-128
                      environments
  With `--baseline_code=git:REV` (any part) each configuration also runs on
  the code at REV, first (before/after a fix, interleaved); with --alternate
  every other round runs the current code first. A configuration whose
  flags the code at REV lacks fails there (its record says so).

Each configuration's child is a fresh process, so start-up (TensorFlow
import, graph build, children start) costs ~15-25 s per run on an idle
2-core machine and 30-110 s on a loaded one; one run is start-up + warm-up
(8 s) + window (30 s) + shutdown. On an idle machine a part takes 3-10
min (layouts the longest). Figures go to stdout, a JSON file
per part under benchmarks/results/ (which replaces the committed record of
that part; `--json PATH` writes one part's record elsewhere) and, with
--plot, benchmarks/plots/.

    python3 benchmarks/throughput_bench.py --part=defaults
    python3 benchmarks/throughput_bench.py --part=defaults --baseline_code=git:HEAD~1
    python3 benchmarks/throughput_bench.py --part=profile --py_spy
    python3 benchmarks/throughput_bench.py --part=torso_dtype_deep --json /tmp/a.json
    python3 benchmarks/throughput_bench.py --plot     # plots from the JSON files
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import config as config_lib  # noqa: E402 - common put the repository on the path

RESULTS_DIR = os.path.join(common.REPO, "benchmarks", "results")
PLOTS_DIR = os.path.join(common.REPO, "benchmarks", "plots")
FRAMES_PER_AGENT_STEP = 4


def _grid_with_k(agent: str, actors, k: int) -> list[dict]:
    return [
        dict(
            agent=agent,
            num_actors=n,
            batch_size=8,
            unroll_length=20,
            dynamic_batching=True,
            **({"envs_per_actor": k} if k > 1 else {}),
        )
        for n in actors
    ]


PARTS: dict[str, list[dict]] = {}
# Shallow 1-16 actors and deep 4 and 16 actors, one environment per actor
# (batching on) and K environments per actor; then 4 actors at unroll 80.
PARTS["layouts"] = [
    *_grid_with_k("shallow", (1, 2, 4, 8, 16), 1),
    *_grid_with_k("shallow", (1, 2, 4, 8, 16), 4),
    *_grid_with_k("shallow", (8,), 2),
    *_grid_with_k("shallow", (8,), 8),
    *_grid_with_k("deep", (4, 16), 1),
    *_grid_with_k("deep", (4, 16), 4),
    *[dict(c, unroll_length=80) for c in _grid_with_k("shallow", (4,), 1)],
    *[dict(c, unroll_length=80) for c in _grid_with_k("shallow", (4,), 4)],
]


def _shared(agent: str, actors: int, k: int, m: int, unroll: int = 20) -> dict:
    config = _grid_with_k(agent, (actors,), k)[0]
    config["unroll_length"] = unroll
    if m > 1:
        config["envs_per_process"] = m
    return config


# Several environments in one process (--envs_per_process): the best
# layouts with M = 1 against M = 2, 4 and 8.
PARTS["envs_per_process"] = [
    _shared("shallow", 8, 1, 1),
    _shared("shallow", 4, 4, 1),
    _shared("shallow", 4, 4, 2),
    _shared("shallow", 4, 4, 4),
    _shared("shallow", 8, 4, 1),
    _shared("shallow", 8, 4, 4),
    _shared("shallow", 4, 8, 8),
    _shared("shallow", 8, 8, 8),
    _shared("deep", 4, 4, 1),
    _shared("deep", 4, 4, 4),
    _shared("shallow", 4, 4, 4, unroll=80),
]

# The rest of the actor range with M > 1.
PARTS["envs_per_process_range"] = [
    _shared("shallow", 1, 8, 8),
    _shared("shallow", 2, 8, 8),
    _shared("shallow", 16, 4, 4),
    _shared("deep", 16, 4, 4),
]


def _bfloat16(config: dict) -> dict:
    return dict(config, torso_dtype="bfloat16")


# The torso's convolutions in bfloat16 (--torso_dtype): the deep agent at 8
# actors of one environment, the best environment layouts in float32 and
# bfloat16, and the shallow agent's best layout both ways.
PARTS["torso_dtype"] = [
    _shared("deep", 8, 1, 1),
    _shared("deep", 8, 4, 4),
    _bfloat16(_shared("deep", 8, 4, 4)),
    _bfloat16(_shared("deep", 8, 1, 1)),
    _bfloat16(_shared("deep", 4, 4, 4)),
    _bfloat16(_shared("deep", 16, 4, 4)),
    _shared("shallow", 8, 8, 8),
    _bfloat16(_shared("shallow", 8, 8, 8)),
]

# The deep agent's float32 paper layout against its bfloat16 layouts of 4 and
# 8 environments per actor, for repeats (--repeats 2 --alternate).
PARTS["torso_dtype_deep"] = [
    _shared("deep", 8, 1, 1),
    _bfloat16(_shared("deep", 8, 4, 4)),
    _bfloat16(_shared("deep", 8, 8, 8)),
]


def _family_defaults(agent: str, **flags) -> dict:
    """A run given only --agent (and `flags`): no layout flag, so Atari's
    defaults (its flag file for the agent) apply; the layout is recorded for
    the table but not passed (flags_for drops it)."""
    from families import atari

    values = config_lib.family_defaults(atari.FAMILY, agent, 1).values
    layout = {name: int(values[name]) for name in config_lib.LAYOUT_SETTINGS}
    return dict(
        agent=agent, dynamic_batching=True, family_defaults=True, **flags, **layout
    )


# A run with no throughput flags against the best documented setting of its
# agent, in one invocation.
PARTS["defaults"] = [
    _family_defaults("shallow"),
    dict(_shared("shallow", 4, 32, 32, unroll=80), batch_size=8),
    _family_defaults("deep", torso_dtype="auto"),
    dict(_shared("deep", 8, 4, 4), batch_size=32, torso_dtype="auto"),
]

# Atari's default layout alone, with every flag given (code at another
# revision without the family defaults runs the same): for before/after
# comparisons with --baseline_code.
PARTS["atari_default_layout"] = [
    dict(_shared("shallow", 4, 32, 32, unroll=80), batch_size=8),
]

# The kernels an AVX2-only CPU runs, on any x86 CPU: oneDNN capped at AVX2
# (ONEDNN_MAX_CPU_ISA; TensorFlow's pip build compiles its other kernels for
# AVX, which every such CPU has). TensorFlow's own default there (oneDNN off)
# against the project's (experiment.py turns it on), for the shallow agent and
# the deep agent in float32 (what --torso_dtype=auto picks without bfloat16
# instructions), both at Atari's throughput defaults. The numerics are an
# AVX2 CPU's; the speed is the measuring CPU's, so these figures stand in for
# an AVX2 machine's ratios, not its frames/s.
_AVX2_KERNELS = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
_AVX2_TENSORFLOW_DEFAULT = dict(_AVX2_KERNELS, TF_ENABLE_ONEDNN_OPTS="0")
PARTS["avx2_kernels"] = [
    dict(_family_defaults("shallow"), env=_AVX2_TENSORFLOW_DEFAULT),
    dict(_family_defaults("shallow"), env=_AVX2_KERNELS),
    dict(_family_defaults("deep", torso_dtype="float32"), env=_AVX2_TENSORFLOW_DEFAULT),
    dict(_family_defaults("deep", torso_dtype="float32"), env=_AVX2_KERNELS),
]

# The deep agent at Atari's throughput defaults (batch 32) with one thread per
# kernel (single-machine training's default) against one per core, in
# float32 on AVX2 kernels and with --torso_dtype=auto on the measuring CPU.
_ONE_PER_CORE = {"TF_NUM_INTRAOP_THREADS": str(os.cpu_count())}
PARTS["deep_threads"] = [
    dict(_family_defaults("deep", torso_dtype=dtype), env=dict(env, **threads))
    for dtype, env in (("float32", _AVX2_KERNELS), ("auto", {}))
    for threads in ({}, _ONE_PER_CORE)
]

# Where an agent step's CPU goes at the shallow agent's best setting (Atari's
# defaults), on the measuring CPU's own kernels and on AVX2 kernels.
PARTS["profile"] = [
    _family_defaults("shallow"),
    dict(_family_defaults("shallow"), env=_AVX2_KERNELS),
]

# The shallow agent at 8 x 8 (8 per process) with batch 8, 16 and 32: the
# learner's cost per frame falls with its batch.
PARTS["shallow_batch"] = [
    dict(_shared("shallow", 8, 8, 8), batch_size=b) for b in (8, 16, 32)
]

# The shallow agent at batch 32 over layouts of 32-128 environments, M per
# process = K per actor (Atari's defaults are the fastest of them).
PARTS["shallow_batch32_layouts"] = [
    dict(_shared("shallow", n, k, k), batch_size=32)
    for n, k in ((4, 16), (2, 32), (4, 32), (2, 16), (4, 8))
]


def flags_for(config: dict) -> dict:
    flags = dict(config, total_environment_frames=10**12)
    flags.pop("env", None)
    if flags.pop("family_defaults", False):
        for name in config_lib.LAYOUT_SETTINGS:
            flags.pop(name, None)
    flags["dynamic_batching"] = str(flags["dynamic_batching"]).lower()
    return flags


def py_spy_sampler(output: str, seconds: float):
    """on_start callback: py-spy record of the window (Python stacks)."""

    def on_start(pid, window_marker):
        def sample():
            deadline = time.time() + 600
            while not os.path.exists(window_marker) and time.time() < deadline:
                time.sleep(0.2)
            subprocess.run(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(pid),
                    "--subprocesses",
                    "--threads",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "-r",
                    "50",
                    "--duration",
                    str(int(seconds)),
                    "-o",
                    output,
                ],
                capture_output=True,
                timeout=seconds + 60,
            )

        threading.Thread(target=sample, daemon=True).start()

    return on_start


def summarize_py_spy(path: str) -> dict:
    """Sample counts of the raw py-spy file by (process kind, thread, leaf)."""
    import re
    from collections import Counter

    with open(path) as f:
        text = f.read()
    records = re.findall(
        r"(process \d+:.*?) (\d+)\n(?=process \d+:|\Z)", text, flags=re.S
    )
    by_group: Counter = Counter()
    by_leaf: Counter = Counter()
    for stack, count in records:
        count = int(count)
        # With --subprocesses a child's stack starts with its parent's header
        # and then its own: 'process P:"cmd";process C:"cmd";thread ...'.
        headers = []
        rest = stack
        while True:
            m = re.match(r'process \d+:"([^"]*)";', rest)
            if not m:
                break
            headers.append(m.group(1))
            rest = rest[m.end() :]
        kind = (
            "main"
            if len(headers) == 1 and "run_experiment" in headers[0]
            else "environment"
        )
        parts = rest.split(";")
        thread = re.sub(r"\(\d+\)", "", parts[0]).replace("thread :", "").strip()
        frames = [p.split(" (")[0] for p in parts[1:]]
        if kind == "environment":
            group = "environment process"
        elif thread.startswith("actor-"):
            group = "actor threads"
        elif "Batcher" in thread:
            group = "dynamic batching runner"
        elif thread == "MainThread":
            group = "learner loop (main thread)"
        elif thread in ("", "thread"):
            group = "TensorFlow threads running py_func (environment calls)"
        else:
            group = thread
        by_group[group] += count
        leaf = " < ".join(reversed(frames[-3:]))
        by_leaf[f"{group}: {leaf}"] += count
    return {
        "total": sum(by_group.values()),
        "by_group": dict(by_group.most_common()),
        "top_leaves": dict(by_leaf.most_common(25)),
    }


def run_part(part: str, args) -> dict:
    configs = PARTS[part]
    code_dir = args.code or common.snapshot_code()
    common.use_code_dir(code_dir)
    print(common.machine_line(), flush=True)
    print(f"Code snapshot: {code_dir}", flush=True)
    ceilings = [common.measure_ceiling(args.ceiling_s)]
    print(
        f"ceiling (start): {ceilings[0]['frames_per_s']:.0f} frames/s, load {ceilings[0]['load']:.2f}",
        flush=True,
    )
    runs = []
    variants = [("current", code_dir)]
    if args.baseline_code:
        if args.baseline_code.startswith("git:"):
            rev = args.baseline_code.removeprefix("git:")
            base_dir = common.snapshot_code(rev)
        else:
            rev = base_dir = args.baseline_code
        variants = [(f"baseline {rev}", base_dir), ("current", code_dir)]
    repeats = args.repeats or (2 if part == "profile" else 1)
    for repeat in range(repeats):
        for config in configs:
            # --alternate: the code that runs second in a round runs first in
            # the next, so a position effect cancels out over the rounds.
            order = variants[::-1] if args.alternate and repeat % 2 else variants
            for label, directory in order:
                common.use_code_dir(directory)
                on_start = None
                spy_path = None
                if args.py_spy and repeat == 0:
                    slug = "current" if label == "current" else "baseline"
                    spy_path = os.path.join(
                        RESULTS_DIR, f"throughput_{part}_py_spy_{slug}.txt"
                    )
                    on_start = py_spy_sampler(spy_path, args.window_s - 2)
                record = common.run_experiment(
                    flags_for(config),
                    extra_env=config.get("env"),
                    warmup_s=args.warmup_s,
                    window_s=args.window_s,
                    timeout_s=args.timeout_s,
                    on_start=on_start,
                )
                record["config"] = config
                record["code"] = label
                record["repeat"] = repeat
                record.pop("samples", None)
                if "frames_per_s" in record:  # keep the log only of a failed run
                    record.pop("log_tail", None)
                    record.pop("logdir", None)
                if spy_path and os.path.exists(spy_path):
                    record["py_spy"] = summarize_py_spy(spy_path)
                    os.remove(spy_path)  # the summary is kept in the JSON
                runs.append(record)
                if "frames_per_s" in record:
                    print(
                        f"{label:>10} {config} -> {record['frames_per_s']:.0f} frames/s, "
                        f"{record['frames_per_s'] / FRAMES_PER_AGENT_STEP:.0f} agent steps/s, "
                        f"{record['learner_steps_per_s']:.2f} learner steps/s; start-up "
                        f"{record['startup_s']:.0f} s; load {record['load_start']:.1f}-"
                        f"{record['load_end']:.1f}",
                        flush=True,
                    )
                else:
                    print(
                        f"{label} {config} FAILED (rc {record['returncode']}):\n{record['log_tail'][-1500:]}",
                        flush=True,
                    )
    ceilings.append(common.measure_ceiling(args.ceiling_s))
    print(
        f"ceiling (end): {ceilings[1]['frames_per_s']:.0f} frames/s, load {ceilings[1]['load']:.2f}",
        flush=True,
    )
    return {
        "part": part,
        "machine": common.machine_info(),
        "warmup_s": args.warmup_s,
        "window_s": args.window_s,
        "ceilings": ceilings,
        "ceiling_frames_per_s": sum(c["frames_per_s"] for c in ceilings)
        / len(ceilings),
        "runs": runs,
    }


def _env_label(config: dict) -> str:
    env = config.get("env")
    if env is None:
        return ""
    return " " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(default threads)")


def table(result: dict) -> str:
    ceiling = result["ceiling_frames_per_s"]
    ceiling_per_cpu = sum(c["frames_per_cpu_s"] for c in result["ceilings"]) / len(
        result["ceilings"]
    )
    lines = [
        f"Ceiling (raw ALE + preprocessing, {result['machine']['nproc']} processes, no agent): "
        + ", ".join(
            f"{c['frames_per_s']:.0f} (load {c['load']:.1f})"
            for c in result["ceilings"]
        )
        + f" frames/s; mean {ceiling:.0f}. One stepping process: {ceiling_per_cpu:.0f} frames per CPU-second.",
        "",
        "| code, repeat | agent | actors | batch | unroll | dynamic batching | frames/s | agent steps/s "
        "| learner steps/s | fraction of ceiling | batched / unbatched | cores used: learner process + env processes "
        "| frames per CPU-second | CPU-normalised fraction of ceiling | load (start-end) | start-up s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]

    def key(run: dict, dynamic_batching: bool) -> tuple:
        c = run["config"]
        return (
            run["code"],
            run["repeat"],
            c["agent"],
            c["num_actors"],
            c.get("envs_per_actor", 1),
            c.get("envs_per_process", 1),
            c.get("torso_dtype", "float32"),
            c["batch_size"],
            c["unroll_length"],
            dynamic_batching,
            json.dumps(c.get("env")),
        )

    by_key = {
        key(run, run["config"]["dynamic_batching"]): run for run in result["runs"]
    }
    for run in result["runs"]:
        c = run["config"]
        if "frames_per_s" not in run:
            lines.append(
                f"| {run['code']}, {run['repeat'] + 1} | {c['agent']} | {c['num_actors']} | {c['batch_size']} | {c['unroll_length']} | {c['dynamic_batching']} | failed | | | | | | | | | |"
            )
            continue
        fps = run["frames_per_s"]
        k = c.get("envs_per_actor", 1)
        actors = f"{c['num_actors']} x {k} envs" if k > 1 else str(c["num_actors"])
        if c.get("envs_per_process", 1) > 1:
            actors += f", {c['envs_per_process']} per process"
        agent = c["agent"]
        if c.get("torso_dtype", "float32") != "float32":
            agent += f" ({c['torso_dtype']})"
        if c.get("family_defaults"):
            agent += ", no layout flags (Atari's defaults)"
        ratio = ""
        if c["dynamic_batching"]:
            other = by_key.get(key(run, False))
            if other and other.get("frames_per_s"):
                ratio = f"{fps / other['frames_per_s']:.2f}x"
        cpu = run["cpu_s"]
        env_cpu = cpu.get("environment processes", 0.0)
        main_cpu = run["cpu_total_s"] - env_cpu
        per_cpu = fps * run["window_s"] / run["cpu_total_s"]
        lines.append(
            f"| {run['code']}{_env_label(c)}, {run['repeat'] + 1} | {agent} | {actors} | {c['batch_size']} | {c['unroll_length']} "
            f"| {'on' if c['dynamic_batching'] and k == 1 else 'off'} | {fps:.0f} | {fps / FRAMES_PER_AGENT_STEP:.0f} "
            f"| {run['learner_steps_per_s']:.2f} | {fps / ceiling:.1%} | {ratio} "
            f"| {main_cpu / run['window_s']:.2f} + {env_cpu / run['window_s']:.2f} "
            f"| {per_cpu:.0f} | {per_cpu / ceiling_per_cpu:.1%} "
            f"| {run['load_start']:.1f}-{run['load_end']:.1f} | {run['startup_s']:.0f} |"
        )
    return "\n".join(lines)


def cpu_table(result: dict) -> str:
    lines = [
        "| code | repeat | thread group / process | CPU s over window | cores |",
        "|---|---:|---|---:|---:|",
    ]
    for run in result["runs"]:
        if "cpu_s" not in run:
            continue
        cpu = run["cpu_s"]
        for group, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
            if seconds >= 0.05:
                lines.append(
                    f"| {run['code']} | {run['repeat']} | {group} | {seconds:.1f} | {seconds / run['window_s']:.2f} |"
                )
    return "\n".join(lines)


def _actor_axes(axes, xlabel: str) -> None:
    """Log-2 actor counts 1-16 on the x axis of every panel."""
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)


def plot_layouts(result: dict, out: str) -> None:
    """benchmarks/plots/throughput_layouts.png: frames/s and fraction of the
    ceiling against actors, per agent and environments per actor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple, list] = {}
    for run in result["runs"]:
        c = run["config"]
        if "frames_per_s" in run and c["unroll_length"] == 20:
            key = (c["agent"], c.get("envs_per_actor", 1), run["code"])
            series.setdefault(key, []).append(run)
    ceiling = result["ceiling_frames_per_s"]
    for (agent, k, code), runs in sorted(series.items()):
        runs.sort(key=lambda r: r["config"]["num_actors"])
        xs = [r["config"]["num_actors"] for r in runs]
        fps = [r["frames_per_s"] for r in runs]
        label = f"{agent}, {k} env{'s' if k > 1 else ''} per actor" + (
            " (dynamic batching)" if k == 1 else ""
        )
        if code != "current":
            label += f", {code}"
        style = ":^" if code != "current" else ("-o" if k == 1 else "--s")
        axes[0].plot(xs, fps, style, label=label)
        axes[1].plot(xs, [f / ceiling for f in fps], style, label=label)
    axes[0].axhline(ceiling, color="grey", lw=0.8, ls=":")
    axes[0].text(1, ceiling, " raw-ALE ceiling", va="bottom", fontsize=8, color="grey")
    axes[1].axhline(0.30, color="tab:red", lw=0.8, ls=":")
    axes[1].text(1, 0.30, " target 30 % (shallow)", va="bottom", fontsize=8)
    _actor_axes(axes, "actors (threads)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("environment frames/s (steady window)")
    axes[1].set_ylabel("fraction of the raw-ALE ceiling (same invocation)")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "atari/pong, batch 8, unroll 20, 2-core CPU: environments per actor",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"Wrote {out}")


def plot_cpu_breakdown(result: dict, out: str, targets=None, title=None) -> None:
    """benchmarks/plots/throughput_envs_per_process.png: each configuration's frames/s
    as a fraction of the ceiling, and its CPU-ms per agent step by thread
    group, one process per environment against M to a process (and bfloat16
    torsos, the torso_dtype part's plot). `targets`: (fraction, label) lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ceiling = result["ceiling_frames_per_s"]
    runs = [r for r in result["runs"] if "frames_per_s" in r]
    labels, fractions, colors, parts = [], [], [], []
    groups = (
        ("environment processes", "environment processes"),
        ("TensorFlow inter-op threads", "inter-op (executor, py_func)"),
        ("TensorFlow intra-op threads", "intra-op (kernels)"),
    )
    for run in runs:
        c = run["config"]
        k, m = c.get("envs_per_actor", 1), c.get("envs_per_process", 1)
        code = "before" if run["code"] != "current" else "after"
        label = f"{code}: {c['agent']} {c['num_actors']}x{k}"
        label += f", {m}/proc" if m > 1 else ""
        label += f", T={c['unroll_length']}" if c["unroll_length"] != 20 else ""
        bfloat16 = c.get("torso_dtype") == "bfloat16"
        label += ", bfloat16" if bfloat16 else ""
        labels.append(label)
        fractions.append(run["frames_per_s"] / ceiling)
        colors.append(
            "tab:olive"
            if bfloat16
            else "tab:green"
            if m > 1
            else "tab:grey"
            if code == "before"
            else "tab:blue"
        )
        steps = run["frames_per_s"] / FRAMES_PER_AGENT_STEP * run["window_s"]
        cpu = run["cpu_s"]
        parts.append(
            [
                sum(v for g, v in cpu.items() if g.startswith(prefix)) / steps * 1e3
                for prefix, _ in groups
            ]
        )
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    ys = range(len(labels))
    axes[0].barh(ys, fractions, color=colors)
    for (fraction, name), ls in zip(
        targets or [(0.30, "target: 30 %")], ("--", ":"), strict=False
    ):
        axes[0].axvline(fraction, color="tab:red", ls=ls, lw=1, label=name)
    axes[0].set_xlabel(f"fraction of the raw-ALE ceiling ({ceiling:,.0f} frames/s)")
    axes[0].legend(fontsize=8, loc="lower right")
    left = [0.0] * len(labels)
    for i, (_, name) in enumerate(groups):
        widths = [p[i] for p in parts]
        color = ("tab:brown", "tab:orange", "tab:purple")[i]
        axes[1].barh(ys, widths, left=left, label=name, color=color)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes[1].set_xlabel("CPU-ms per agent step, by thread group")
    axes[1].legend(fontsize=8, loc="lower right")
    axes[0].set_yticks(list(ys), labels, fontsize=8)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        title
        or "atari/pong training, batch 8: grey = code before, blue = after with one "
        "process per environment, green = M environments per process (2 cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_torso_dtype(result: dict, out: str) -> None:
    """benchmarks/plots/throughput_torso_dtype.png: the torso_dtype part,
    with 1.5x the baseline's deep agent at 8 actors (when the record has a
    baseline) and 30 % of the ceiling for the shallow agent."""
    ceiling = result["ceiling_frames_per_s"]
    before = [
        r["frames_per_s"]
        for r in result["runs"]
        if r["code"] != "current" and r["config"]["agent"] == "deep"
    ]
    targets = [(0.30, "shallow target: 30 %")]
    if before:
        targets.insert(
            0,
            (1.5 * before[0] / ceiling, "1.5x the baseline's deep agent, 8 actors"),
        )
    plot_cpu_breakdown(
        result,
        out,
        targets,
        "atari/pong training, batch 8: grey = baseline code, blue/green = "
        "float32 torso, olive = bfloat16 torso (2 cores)",
    )


def record_path(part: str, json_path: str | None) -> str:
    """Where a part's record goes: `json_path` if given, else the default."""
    if json_path is not None:
        return os.path.abspath(json_path)
    return os.path.join(RESULTS_DIR, f"throughput_{part}.json")


def plot() -> None:
    for part, draw in (
        ("torso_dtype", plot_torso_dtype),
        ("envs_per_process", plot_cpu_breakdown),
        ("layouts", plot_layouts),
    ):
        path = record_path(part, None)
        if os.path.exists(path):
            with open(path) as f:
                os.makedirs(PLOTS_DIR, exist_ok=True)
                draw(json.load(f), os.path.join(PLOTS_DIR, f"throughput_{part}.png"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--part",
        choices=[*PARTS, "all"],
        default=None,
        help="all = every part, in turn",
    )
    parser.add_argument("--warmup_s", type=float, default=8.0)
    parser.add_argument("--window_s", type=float, default=30.0)
    parser.add_argument("--ceiling_s", type=float, default=10.0)
    parser.add_argument("--timeout_s", type=float, default=300.0, help="per run")
    parser.add_argument(
        "--repeats",
        type=int,
        default=0,
        help="rounds over the part's configurations (default: 2 for profile, else 1)",
    )
    parser.add_argument(
        "--baseline_code",
        default="",
        help="git:REV or a directory of the code to compare against",
    )
    parser.add_argument(
        "--code",
        default="",
        help="directory of the code to measure (default: a snapshot of the working tree)",
    )
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="with --baseline_code: odd rounds run the current code first",
    )
    parser.add_argument(
        "--py_spy", action="store_true", help="profile part: py-spy record the window"
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="draw the plots of benchmarks/plots/ from the committed records",
    )
    parser.add_argument(
        "--json",
        default=None,
        help="where to write the part's record (one --part only); by default "
        "benchmarks/results/throughput_<part>.json, which replaces the "
        "committed record of that part",
    )
    args = parser.parse_args()
    parts = list(PARTS) if args.part == "all" else ([args.part] if args.part else [])
    if args.json is not None and len(parts) != 1:
        parser.error(
            f"--json={args.json} names one record, but --part={args.part} runs "
            f"{len(parts)} parts; pass a single --part with --json"
        )
    os.makedirs(RESULTS_DIR, exist_ok=True)
    for part in parts:
        started = time.time()
        result = run_part(part, args)
        result["duration_s"] = time.time() - started
        path = record_path(part, args.json)
        common.write_json(path, result)
        print()
        print(table(result))
        print()
        print(cpu_table(result))
        for run in result["runs"]:
            if "py_spy" in run:
                spy = run["py_spy"]
                print(
                    f"\npy-spy ({run['code']}): {spy['total']} samples; by thread group:",
                    json.dumps(spy["by_group"], indent=1),
                )
                print("top leaves:", json.dumps(spy["top_leaves"], indent=1))
        print(f"\n{part}: {result['duration_s']:.0f} s")
    if args.plot:
        plot()


if __name__ == "__main__":
    main()
