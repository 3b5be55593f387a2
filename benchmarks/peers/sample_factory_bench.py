"""Ours beside Sample Factory 2.1.1 on Pong, in one invocation.

Measures, in turn: the raw-ALE ceiling (common.measure_ceiling), ours at
the shallow agent's fastest layout (Atari's default flag file's), ours with
the deep feed-forward agent (a network closer in size to Sample Factory's
Nature CNN than the shallow one: three residual stages and a 256-unit layer
against three convolutions and a 512-unit layer), Sample Factory's Atari
example (benchmarks/peers/sample_factory_peer.sh: APPO, Nature CNN, feed-forward,
2 workers x 8 environments, batch 256, rollout 32, CPU), and the ceiling
again. Environment frames/s for all (frame skip 4 for both projects).

    python3 benchmarks/peers/sample_factory_bench.py --peer_s 240
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # a script: the repository first on the path
    sys.path[0] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
from benchmarks.core import common  # noqa: E402
from benchmarks.peers import peers  # noqa: E402

RECORD = os.path.join(common.REPO, "benchmarks", "results", "peer_sample_factory.json")
OURS = {
    "ours, shallow agent, no layout flags (4 x 32, 32 per process, batch 32)": dict(
        agent="shallow"
    ),
    "ours, deep agent without LSTM, 8 x 4 (4 per process), batch 32": dict(
        agent="deep",
        use_lstm="false",
        num_actors=8,
        envs_per_actor=4,
        envs_per_process=4,
        batch_size=32,
        unroll_length=20,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window_s", type=float, default=30.0)
    parser.add_argument("--peer_s", type=int, default=240)
    args = parser.parse_args()
    print(common.machine_line(), flush=True)
    record = {"machine": common.machine_info(), "ceilings": [], "runs": {}}
    record["ceilings"].append(common.measure_ceiling(10.0))
    for label, flags in OURS.items():
        run = common.run_experiment(
            dict(flags, total_environment_frames=10**12), window_s=args.window_s
        )
        record["runs"][label] = {
            k: run.get(k) for k in ("frames_per_s", "load_start", "load_end", "flags")
        }
        print(f"{label}: {run.get('frames_per_s', 0):.0f} frames/s", flush=True)
    label = f"{peers.SAMPLE_FACTORY.label}, Atari example (2 workers x 8, rollout 32)"
    record["runs"][label] = peers.run(peers.SAMPLE_FACTORY, args.peer_s)
    fps = record["runs"][label]["frames_per_s"]
    print(f"{label}: {fps or 'no'} frames/s", flush=True)
    record["ceilings"].append(common.measure_ceiling(10.0))
    ceiling = sum(c["frames_per_s"] for c in record["ceilings"]) / 2
    record["ceiling_frames_per_s"] = ceiling
    common.write_json(RECORD, record)
    peer_fps = record["runs"][label]["frames_per_s"]
    print(f"\nceiling {ceiling:.0f} frames/s\n")
    print("| run | frames/s | of the ceiling | x Sample Factory |")
    print("| --- | ---: | ---: | ---: |")
    for name, run in record["runs"].items():
        fps = run["frames_per_s"] or 0.0
        ratio = f"{fps / peer_fps:.2f}x" if peer_fps else ""
        print(f"| {name} | {fps:,.0f} | {fps / ceiling:.1%} | {ratio} |")
    print(f"\nWrote {RECORD}")


if __name__ == "__main__":
    main()
