"""DeepMind Lab's level start and episode-boundary stall, with and without
the level cache (--level_cache_dir).

A maze level (explore_goal_locations_small) compiles a new map at every
reset, one per maze seed. For each of --repeats rounds, in a fresh process
each (as an actor's environment is): start the level with seed S and play
one episode (1,350 agent steps at 4 action repeats) with no cache, then the
same with an empty cache directory, then again with that (now filled) cache:
the second start of the same mazes. Reports the level start (construction
and the first observation) and the step that crosses the episode boundary
(the reset to the next maze, seeded from S as well).

    python3 benchmarks/components/dmlab_level_cache_bench.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402

LEVEL = "contributed/dmlab30/explore_goal_locations_small"
EPISODE_STEPS = 1350  # 5,400 frames at 4 action repeats

_CHILD = """
import json, sys, time
from families import dmlab
import environments
config = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}
started = time.monotonic()
env = dmlab.PyProcessDmLab(sys.argv[1], config, 4, seed=int(sys.argv[2]),
                                   level_cache_dir=sys.argv[3])
env.initial()
start_s = time.monotonic() - started
stall_s, steps_s, steps = None, 0.0, 0
while stall_s is None:
    t = time.monotonic()
    _, done, _ = env.step(0)
    elapsed = time.monotonic() - t
    if done:
        stall_s = elapsed
    else:
        steps_s += elapsed
        steps += 1
env.close()
print("OUT=" + json.dumps({"start_s": start_s, "boundary_step_s": stall_s,
                            "step_ms": 1000 * steps_s / steps}))
"""


def one_start(seed: int, cache_dir: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, LEVEL, str(seed), cache_dir],
        cwd=common.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("OUT=")]
    return json.loads(line[len("OUT=") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--json",
        default=os.path.join(
            common.REPO, "benchmarks", "results", "dmlab_level_cache.json"
        ),
    )
    args = parser.parse_args()
    print(common.machine_line(), flush=True)
    rows = []
    for repeat in range(args.repeats):
        seed = 100 + repeat
        cache = tempfile.mkdtemp(prefix="level_cache_bench_")
        for case, cache_dir in (
            ("no cache", ""),
            ("empty cache (first start)", cache),
            ("filled cache (same mazes again)", cache),
        ):
            record = one_start(seed, cache_dir)
            record.update(case=case, seed=seed, load=common.loadavg())
            rows.append(record)
            print(
                f"seed {seed} {case}: start {record['start_s']:.2f} s, episode "
                f"boundary step {record['boundary_step_s']:.2f} s, other steps "
                f"{record['step_ms']:.2f} ms (load {record['load']:.2f})",
                flush=True,
            )
    common.write_json(args.json, {"rows": rows})
    print()
    print("| case | level start (s) | episode-boundary step (s) | other steps (ms) |")
    print("|---|---:|---:|---:|")
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        cells = [
            " / ".join(f"{r[key] * scale:.2f}" for r in mine)
            for key, scale in (("start_s", 1), ("boundary_step_s", 1), ("step_ms", 1))
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
