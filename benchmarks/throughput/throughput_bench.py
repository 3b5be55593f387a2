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
  feed_forward        Atari's defaults with the LSTM and feed-forward
                      (--use_lstm=false), without and with replay 0.75
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

    python3 benchmarks/throughput/throughput_bench.py --part=defaults
    python3 benchmarks/throughput/throughput_bench.py --part=defaults --baseline_code=git:HEAD~1
    python3 benchmarks/throughput/throughput_bench.py --part=profile --py_spy
    python3 benchmarks/throughput/throughput_bench.py --part=torso_dtype_deep --json /tmp/a.json
    python3 benchmarks/throughput/throughput_bench.py --plot     # plots from the JSON files
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
import config as config_lib  # noqa: E402 - common put the repository on the path
from benchmarks.core import common  # noqa: E402
from benchmarks.throughput.throughput_report import (  # noqa: E402
    FRAMES_PER_AGENT_STEP,
    RESULTS_DIR,
    cpu_table,
    plot,
    record_path,
    table,
)


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

# The feed-forward agent (--use_lstm=false, the tuning study's first
# stage-2 arm) against the LSTM at Atari's defaults, without replay and with
# replay 0.75 of each batch at 10,000 unrolls (the learner then does four
# times the work per frame).
_REPLAY075 = {"replay_proportion": 0.75, "replay_capacity": 10_000}
PARTS["feed_forward"] = [
    dict(_family_defaults("shallow"), **replay, **lstm)
    for replay in ({}, _REPLAY075)
    for lstm in ({}, {"use_lstm": "false"})
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
