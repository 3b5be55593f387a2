"""Peak resident memory of single-machine training.

Runs experiment.py (through common.run_experiment: a child process, its own
`main`) on atari/pong at num_actors 4 and 16, batch 8, unroll 20, for each
agent, and reads VmHWM (peak resident set) from /proc of the learner process
(the one process that holds TensorFlow, the learner and the actor threads)
and of each environment process, at the end of a steady window (`--window_s`
after `--warmup_s` of training), just before training is stopped. Baseline
next to it: the same figures for an environment process alone (a
PyProcessAtari child started and stepped without TensorFlow) and for a bare
`import tensorflow` process.

    python3 benchmarks/throughput/memory_bench.py          # ~4-7 min on a loaded 2-core machine
    python3 benchmarks/throughput/memory_bench.py --agents shallow
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402

_BARE_TF = (
    "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'; import tensorflow as tf; "
    "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
)


def baselines(code_dir: str) -> dict:
    """VmHWM (kB) of a bare TensorFlow import and of one env process alone."""
    bare_tf = int(
        subprocess.run(
            [sys.executable, "-c", _BARE_TF],
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout.split()[-1]
    )
    env_alone = subprocess.run(
        [sys.executable, "-c", _ENV_ALONE, code_dir],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    return {
        "bare_tensorflow_vmhwm_kb": bare_tf,
        "env_process_alone_vmhwm_kb": int(env_alone[-1]),
    }


# A PyProcess child running PyProcessAtari, stepped 2,000 times from a parent
# without TensorFlow: the environment process's own footprint.
_ENV_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
import py_process
from families import atari
p = py_process.PyProcess(atari.PyProcessAtari, game='pong', seed=1, episode_life=True)
p.start()
p._call('initial', (), {})
for i in range(2000):
    p._call('step', (i % 6,), {})
import os
kids = [int(x) for t in os.listdir('/proc/self/task') for x in open(f'/proc/self/task/{t}/children').read().split()]
print([l.split()[1] for l in open(f'/proc/{kids[0]}/status') if l.startswith('VmHWM')][0])
p.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", default="shallow,deep")
    parser.add_argument("--actors", default="4,16")
    parser.add_argument("--warmup_s", type=float, default=5.0)
    parser.add_argument("--window_s", type=float, default=10.0)
    parser.add_argument(
        "--json",
        default=os.path.join(common.REPO, "benchmarks", "results", "memory.json"),
    )
    args = parser.parse_args()
    started = time.time()
    code_dir = common.snapshot_code()
    common.use_code_dir(code_dir)
    print(common.machine_line(), flush=True)
    base = baselines(code_dir)
    print(f"baselines: {base}", flush=True)
    rows = []
    for agent in args.agents.split(","):
        for actors in map(int, args.actors.split(",")):
            record = common.run_experiment(
                dict(
                    agent=agent,
                    num_actors=actors,
                    batch_size=8,
                    unroll_length=20,
                    total_environment_frames=10**12,
                ),
                warmup_s=args.warmup_s,
                window_s=args.window_s,
            )
            if "memory" not in record:
                print(
                    f"{agent} {actors}: FAILED\n{record['log_tail'][-1500:]}",
                    flush=True,
                )
                continue
            m = record["memory"]
            envs = [v for v in m["env_vmhwm_kb"] if v]
            row = {
                "agent": agent,
                "num_actors": actors,
                "learner_vmhwm_mib": m["learner_vmhwm_kb"] / 1024,
                "env_count": len(envs),
                "env_vmhwm_mib_min": min(envs) / 1024,
                "env_vmhwm_mib_max": max(envs) / 1024,
                "env_vmhwm_mib_sum": sum(envs) / 1024,
                "total_mib": (m["learner_vmhwm_kb"] + sum(envs)) / 1024,
                "learner_steps": record["learner_steps"],
                "load": record["load_end"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        f"Baselines: bare `import tensorflow` {base['bare_tensorflow_vmhwm_kb'] / 1024:.0f} MiB; "
        f"one environment process alone (PyProcessAtari child, 2,000 steps) "
        f"{base['env_process_alone_vmhwm_kb'] / 1024:.0f} MiB."
    )
    print()
    print(
        "| agent | actors | learner process peak RSS (MiB) | environment processes | each env process peak RSS (MiB) | all processes (MiB) | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['agent']} | {r['num_actors']} | {r['learner_vmhwm_mib']:.0f} | {r['env_count']} "
            f"| {r['env_vmhwm_mib_min']:.1f}-{r['env_vmhwm_mib_max']:.1f} | {r['total_mib']:.0f} | {r['load']:.1f} |"
        )
    duration = time.time() - started
    print(f"\n{duration:.0f} s")
    common.write_json(
        args.json, {"baselines": base, "rows": rows, "duration_s": duration}
    )


if __name__ == "__main__":
    main()
