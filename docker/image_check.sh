#!/usr/bin/env bash
# The image's own check, run as its last build step (minutes, not the whole
# suite, which is CI's job): the image's default path trains a few updates of the shallow agent and plays
# one test-mode episode: DeepMind Lab's default level where its wheel was
# installed, Atari's Pong where not. A failure fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
logdir="$(mktemp -d)"
common=(--logdir="$logdir" --agent=shallow --dataset_path=/opt/dmlab_data)
python3 experiment.py "${common[@]}" --num_actors=2 --envs_per_actor=1 \
  --envs_per_process=1 --batch_size=2 --unroll_length=20 \
  --total_environment_frames=1600 --save_checkpoint_secs=600
python3 experiment.py "${common[@]}" --mode=test --test_num_episodes=1
test -s "$logdir/test_results.json"
rm -rf "$logdir"
echo "image check passed"
