#!/usr/bin/env bash
# Sample Factory 2.1.1 (APPO, PyTorch) for a fixed time, for figures beside
# ours in one invocation (benchmarks/peers/sample_factory_bench.py and peer_defaults.py run
# it). Not a project dependency: it installs into its own virtual
# environment under $PEER_DIR (default /tmp/sample_factory_peer) on first
# use, from PyPI, pinned:
#   torch==2.13.0 sample-factory==2.1.1 gymnasium[atari]==0.29.1 vizdoom==1.3.2
# Sample Factory's gymnasium needs ale-py 0.8, which has no ROMs of its own:
# the ROMs of the project's ale-py are imported into it (ale-import-roms).
#
# Usage: benchmarks/peers/sample_factory_peer.sh [SECONDS] [extra args]
# SF_ENV (default atari_pong) picks the environment and with it the example:
# atari_* runs sf_examples.atari.train_atari, doom_* sf_examples.vizdoom.
# train_vizdoom. SF_LAYOUT=small (the default) gives a 2-core machine's
# layout (2 workers x 8 environments, rollout 32); SF_LAYOUT=defaults passes
# nothing but the CPU device, so the example's own defaults apply (Atari: 8
# workers x 1 environment, batch 256, rollout 128, synchronous; ViZDoom: a
# worker per core x 2 environments, batch 1024, rollout 32). Extra args
# override either.
# Prints the "Fps is (10 sec: ...)" lines it logs and, last, the median of
# the 10-second figures after WARMUP_S (default 60) as
#   sample_factory_frames_per_s=<N>
# (environment frames/s: Sample Factory counts frames with the frame skip of
# 4, as ours does), then the last "Avg episode reward" it logged (the mean
# of its last 100 episodes) as sample_factory_return=<R>, and the frames it
# reached as sample_factory_frames=<N>. Exit 1 when it logged no figure
# after the warm-up.
set -eu
# shellcheck source=peer_setup.sh
. "$(dirname "$0")/peer_setup.sh"

SECS="${1:-240}"
if [ $# -gt 0 ]; then shift; fi
PEER="${PEER_DIR:-/tmp/sample_factory_peer}"
WARMUP_S="${WARMUP_S:-60}"
SF_ENV="${SF_ENV:-atari_pong}"
SF_LAYOUT="${SF_LAYOUT:-small}"
PY="$PEER/venv/bin/python"

case "$SF_ENV" in
  atari_*) MODULE=sf_examples.atari.train_atari ;;
  doom_*) MODULE=sf_examples.vizdoom.train_vizdoom ;;
  *) echo "SF_ENV=$SF_ENV: not an atari_* or doom_* environment of Sample Factory's examples; e.g. SF_ENV=atari_pong or SF_ENV=doom_defend_the_center" >&2; exit 2 ;;
esac
case "$SF_LAYOUT" in
  small) LAYOUT=(--num_workers=2 --num_envs_per_worker=8 --rollout=32) ;;
  defaults) LAYOUT=() ;;
  *) echo "SF_LAYOUT=$SF_LAYOUT: use SF_LAYOUT=small (2 workers x 8, rollout 32) or SF_LAYOUT=defaults (the example's own)" >&2; exit 2 ;;
esac

if ! "$PY" -c "import sample_factory, sf_examples, vizdoom" 2>/dev/null; then
  echo "Installing Sample Factory 2.1.1 into $PEER/venv" >&2
  python3 -m venv "$PEER/venv"
  "$PEER/venv/bin/pip" install -q torch==2.13.0
  "$PEER/venv/bin/pip" install -q sample-factory==2.1.1 "gymnasium[atari]==0.29.1" \
    vizdoom==1.3.2 opencv-python-headless
fi
import_roms
new_run_dir
timeout "$SECS" "$PY" -m "$MODULE" --env="$SF_ENV" \
  --experiment=peer --train_dir="$RUN_DIR" --device=cpu "${LAYOUT[@]}" "$@" >"$LOG" 2>&1 || true

python3 - "$LOG" "$WARMUP_S" <<'PYEOF'
import datetime
import re
import statistics
import sys

path, warmup = sys.argv[1], float(sys.argv[2])
stamp = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]\[\d+\] "
fps_line = re.compile(stamp + r"Fps is \(10 sec: ([\d.na]+).*Total num frames: (\d+)")
reward_line = re.compile(r"Avg episode reward: \[\(0, '(-?[\d.]+)'\)\]")
figures, start, frames, reward = [], None, 0, None
with open(path, errors="replace") as f:
    for line in f:
        if match := reward_line.search(line):
            reward = float(match.group(1))
            continue
        match = fps_line.search(line)
        if not match:
            continue
        when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
        start = start or when
        frames = int(match.group(3))
        print(line.strip())
        if (when - start).total_seconds() >= warmup and match.group(2) != "nan":
            figures.append(float(match.group(2)))
if not figures:
    sys.exit(f"no Fps figure after {warmup:.0f} s; see {path}")
print(f"sample_factory_frames_per_s={statistics.median(figures):.0f}")
print(f"sample_factory_return={'nan' if reward is None else reward}")
print(f"sample_factory_frames={frames}")
PYEOF
