"""DeepMind Lab: the raw ceiling, training frames/s and memory.

In one invocation, on explore_goal_locations_small (96x72, software
renderer, 4 action repeats):

- the ceiling: one process per core stepping `dmlab.PyProcessDmLab`
  (the training environment class) with uniformly random actions, no agent,
  no TensorFlow, no pipe; measured at the start and at the end;
- training (experiment.py's own main through common.run_experiment, a steady
  30 s window after 8 s of warm-up): the shallow and the deep agent with 2
  and 4 actors, batch 8, unroll 20, next to that ceiling; and the peak RSS
  (VmHWM) of the learner process and of each DeepMind Lab process.

    python3 benchmarks/dmlab_bench.py [--actors 2,4] [--agents shallow,deep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

LEVEL = "explore_goal_locations_small"
FULL_LEVEL = "contributed/dmlab30/" + LEVEL


def _dmlab_worker(level, seed, seconds, start_at, result_queue):
    import numpy as np

    import dmlab

    config = {"width": 96, "height": 72, "datasetPath": "", "logLevel": "WARN"}
    env = dmlab.PyProcessDmLab(level, config, 4, seed=seed)
    env.initial()
    rng = np.random.RandomState(seed)
    actions = rng.randint(len(dmlab.DEFAULT_ACTION_SET), size=4096)
    while time.time() < start_at:  # All workers start together.
        time.sleep(0.005)
    steps, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps & 4095])  # Episode ends (map compiles) count too.
        steps += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    env.close()
    frames = steps * 4
    result_queue.put((frames / elapsed, frames / cpu))


def ceiling(seconds: float) -> dict:
    return common.measure_ceiling(
        seconds, game=FULL_LEVEL, worker=_dmlab_worker, start_delay_s=12.0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="shallow,deep")
    parser.add_argument("--actors", default="2,4")
    parser.add_argument("--ceiling_s", type=float, default=20.0)
    parser.add_argument("--window_s", type=float, default=30.0)
    parser.add_argument(
        "--json",
        default=os.path.join(common.REPO, "benchmarks", "results", "dmlab.json"),
    )
    args = parser.parse_args()
    print(common.machine_line(), flush=True)
    common.use_code_dir(common.snapshot_repo())
    ceilings = [ceiling(args.ceiling_s)]
    print(f"ceiling (start): {ceilings[0]}", flush=True)
    runs = []
    for agent in args.agents.split(","):
        for actors in map(int, args.actors.split(",")):
            flags = dict(
                level_name=LEVEL,
                agent=agent,
                num_actors=actors,
                batch_size=8,
                unroll_length=20,
                level_cache_dir="",
            )
            record = common.run_experiment(flags, warmup_s=8, window_s=args.window_s)
            memory = record.get("memory", {})
            summary = {
                "agent": agent,
                "num_actors": actors,
                "frames_per_s": record.get("frames_per_s"),
                "cpu_total_s": record.get("cpu_total_s"),
                "window_s": record.get("window_s"),
                "learner_vmhwm_mb": memory.get("learner_vmhwm_kb", 0) / 1024,
                "env_vmhwm_mb": [kb / 1024 for kb in memory.get("env_vmhwm_kb", [])],
                "load": [record.get("load_start"), record.get("load_end")],
                "returncode": record.get("returncode"),
            }
            if summary["frames_per_s"] is None:
                summary["log_tail"] = record.get("log_tail")
            runs.append(summary)
            print(json.dumps({k: v for k, v in summary.items() if k != "log_tail"}))
    ceilings.append(ceiling(args.ceiling_s))
    print(f"ceiling (end): {ceilings[1]}", flush=True)
    mean_ceiling = sum(c["frames_per_s"] for c in ceilings) / 2
    with open(args.json, "w") as f:
        json.dump({"ceilings": ceilings, "runs": runs}, f, indent=1)
    print()
    print(
        "| agent | actors | frames/s | fraction of ceiling | frames per CPU-s | "
        "learner peak RSS (MB) | DeepMind Lab peak RSS per process (MB) | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for r in runs:
        fps = r["frames_per_s"] or 0.0
        per_cpu = fps * r["window_s"] / r["cpu_total_s"] if r["cpu_total_s"] else 0
        envs = ", ".join(f"{m:.0f}" for m in r["env_vmhwm_mb"])
        load = "-".join(f"{x:.1f}" for x in r["load"] if x is not None)
        print(
            f"| {r['agent']} | {r['num_actors']} | {fps:.0f} | "
            f"{100 * fps / mean_ceiling:.1f} % | {per_cpu:.0f} | "
            f"{r['learner_vmhwm_mb']:.0f} | {envs} | {load} |"
        )
    print(
        f"\nCeiling: {ceilings[0]['frames_per_s']:.0f} (start), "
        f"{ceilings[1]['frames_per_s']:.0f} (end) frames/s; one process "
        f"{ceilings[0]['frames_per_cpu_s']:.0f} frames per CPU-second."
    )


if __name__ == "__main__":
    main()
