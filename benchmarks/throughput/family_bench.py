"""An environment family's level: the raw ceiling, training frames/s and
memory, in one invocation, for any level of any registered family
(DeepMind Lab, Atari, ViZDoom, ...).

- the ceiling: one process per core stepping the level's environment class
  (what `environments.environment_class` gives a training actor) with
  uniformly random actions, no agent, no TensorFlow, no pipe; measured at
  the start and at the end;
- training (experiment.py's own main through common.run_experiment, a
  steady window after 8 s of warm-up): each agent at each actor layout,
  unroll 20, next to that ceiling, with the peak RSS (VmHWM) of the learner
  process and of each environment process.

Layouts are ACTORSxENVS_PER_ACTORxENVS_PER_PROCESS (`8x4x4`), or just
ACTORS (one environment each), with /BATCH (`8x4x4/16`; batch 8 without);
`defaults` is a run given no layout flag, which the family's default flag
file then sets (compare it with the best layout in the same invocation).

    python3 benchmarks/throughput/family_bench.py --level explore_goal_locations_small \\
        --json benchmarks/results/dmlab.json
    python3 benchmarks/throughput/family_bench.py --level vizdoom/my_way_home \\
        --layouts 2,8,8x4x4 --json benchmarks/results/vizdoom.json
    python3 benchmarks/throughput/family_bench.py --level vizdoom/defend_the_center \\
        --agents shallow --layouts defaults,8x4x4/16 --json /tmp/defaults.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402


def ceiling(level: str, seconds: float) -> dict:
    return common.measure_ceiling(seconds, level=level, start_delay_s=12.0)


LAYOUT_FLAGS = ("num_actors", "envs_per_actor", "envs_per_process", "batch_size")


def parse_layout(text: str) -> dict[str, int]:
    """'8x4x4/16' -> the layout flags (actors, environments per actor and per
    process, batch); '8' -> 8 actors of one environment, batch 8; 'defaults'
    -> {} (no layout flag: the family's defaults, its flag file's)."""
    if text == "defaults":
        return {}
    shape, _, batch = text.partition("/")
    parts = [int(p) for p in shape.split("x")]
    values = [*parts, *[1] * (3 - len(parts)), int(batch or 8)]
    return dict(zip(LAYOUT_FLAGS, values, strict=True)) | {"unroll_length": 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="explore_goal_locations_small")
    parser.add_argument("--agents", default="shallow,deep")
    parser.add_argument("--layouts", default="2,4")
    parser.add_argument("--ceiling_s", type=float, default=20.0)
    parser.add_argument("--window_s", type=float, default=30.0)
    parser.add_argument("--json", required=True, help="where the record goes")
    args = parser.parse_args()
    print(common.machine_line(), flush=True)
    common.use_code_dir(common.snapshot_code())
    ceilings = [ceiling(args.level, args.ceiling_s)]
    print(f"ceiling (start): {ceilings[0]}", flush=True)
    runs = []
    for agent in args.agents.split(","):
        for layout in args.layouts.split(","):
            flags = dict(
                level_name=args.level,
                agent=agent,
                level_cache_dir="",
                **parse_layout(layout),
            )
            record = common.run_experiment(flags, warmup_s=8, window_s=args.window_s)
            memory = record.get("memory", {})
            summary = {
                "agent": agent,
                "layout": layout,
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
    ceilings.append(ceiling(args.level, args.ceiling_s))
    print(f"ceiling (end): {ceilings[1]}", flush=True)
    mean_ceiling = sum(c["frames_per_s"] for c in ceilings) / 2
    common.write_json(
        args.json, {"level": args.level, "ceilings": ceilings, "runs": runs}
    )
    print()
    print(
        "| agent | actors x envs (per process) | frames/s | fraction of ceiling | "
        "frames per CPU-s | learner peak RSS (MB) | environment peak RSS per "
        "process (MB) | load |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|")
    for r in runs:
        fps = r["frames_per_s"] or 0.0
        per_cpu = fps * r["window_s"] / r["cpu_total_s"] if r["cpu_total_s"] else 0
        envs = sorted({round(m) for m in r["env_vmhwm_mb"]})
        load = "-".join(f"{x:.1f}" for x in r["load"] if x is not None)
        print(
            f"| {r['agent']} | {r['layout']} | {fps:.0f} | "
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
