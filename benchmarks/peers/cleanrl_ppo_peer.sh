#!/usr/bin/env bash
# CleanRL's PPO on Atari (ppo_atari.py: 8 environments, 128 steps, 4 epochs
# of 4 minibatches, the Nature CNN) for a fixed time on the CPU, for the
# learning-per-hour comparison beside ours (benchmarks/peers/per_hour.py runs
# it). Not a project dependency and never committed: the script and its
# wrappers module are fetched at a pinned commit of github.com/vwxyzjn/cleanrl
# (or taken from CLEANRL_DIR, a checkout of it) into $PEER_DIR (default
# /tmp/cleanrl_ppo_peer), and its packages installed into a virtual
# environment there, from PyPI, pinned as CleanRL's requirements-atari.txt
# pins them:
#   torch==2.4.1 gymnasium==0.29.1 ale-py==0.8.1 shimmy==1.1.0 numpy==1.24.4
#   tensorboard==2.11.2 tyro==0.5.10 opencv-python-headless
# ale-py 0.8 has no ROMs of its own: the project's ale-py's are imported.
# What changes on 2 cores, and nothing else: --no-cuda (no GPU); its other
# settings (10 M agent steps for the learning rate's annealing) are its own.
#
# Usage: benchmarks/peers/cleanrl_ppo_peer.sh [SECONDS] [extra args]
# CLEANRL_ENV (default PhoenixNoFrameskip-v4) is the game. The extra args go
# to ppo_atari.py (e.g. --seed 2).
# Prints each line CleanRL logs with the seconds since its start in front
# (`t=<s> global_step=<n>, episodic_return=<r>`, `t=<s> SPS: <n>`), each
# game as cleanrl_ppo_episode=<s>,<frames>,<return>, then
#   cleanrl_ppo_frames_per_s=<N>   (agent steps/s x the frame skip of 4, the
#                                   last SPS it logged: steps over its time)
#   cleanrl_ppo_frames=<N>         (the last global_step x 4)
#   cleanrl_ppo_return=<R>         (mean of its last 100 episodic returns:
#                                   whole games, unclipped)
# Exit 1 when it logged no SPS line.
set -eu
# shellcheck source=peer_setup.sh
. "$(dirname "$0")/peer_setup.sh"

SECS="${1:-600}"
if [ $# -gt 0 ]; then shift; fi
PEER="${PEER_DIR:-/tmp/cleanrl_ppo_peer}"
CLEANRL_ENV="${CLEANRL_ENV:-PhoenixNoFrameskip-v4}"
COMMIT=fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
PY="$PEER/venv/bin/python"
mkdir -p "$PEER/cleanrl_utils"

for file in cleanrl/ppo_atari.py cleanrl_utils/atari_wrappers.py; do
  target="$PEER/$(basename "$(dirname "$file")")/$(basename "$file")"
  [ "$file" = cleanrl/ppo_atari.py ] && target="$PEER/ppo_atari.py"
  if [ -s "$target" ]; then continue; fi
  if [ -n "${CLEANRL_DIR:-}" ]; then
    git -C "$CLEANRL_DIR" show "$COMMIT:$file" >"$target"
  else
    curl -fsSL "https://raw.githubusercontent.com/vwxyzjn/cleanrl/$COMMIT/$file" -o "$target"
  fi
done
touch "$PEER/cleanrl_utils/__init__.py"

if ! "$PY" -c "import torch, gymnasium, tyro, cv2, tensorboard" 2>/dev/null; then
  echo "Installing CleanRL's PPO requirements into $PEER/venv" >&2
  python3 -m venv "$PEER/venv"
  "$PEER/venv/bin/pip" install -q torch==2.4.1 gymnasium==0.29.1 ale-py==0.8.1 \
    shimmy==1.1.0 numpy==1.24.4 tensorboard==2.11.2 tyro==0.5.10 \
    opencv-python-headless==4.8.1.78
fi
import_roms
new_run_dir
start=${EPOCHREALTIME/./}
(cd "$RUN_DIR" && timeout "$SECS" "$PY" -u "$PEER/ppo_atari.py" --env-id "$CLEANRL_ENV" \
  --no-cuda "$@" 2>"$RUN_DIR/stderr.txt" || true) |
  while IFS= read -r line; do
    tenths=$(((${EPOCHREALTIME/./} - start) / 100000))
    printf 't=%d.%d %s\n' $((tenths / 10)) $((tenths % 10)) "$line"
  done >"$LOG"

"$PY" - "$LOG" <<'PYEOF'
import re
import sys

returns, sps, step = [], None, 0
episode = re.compile(r"^t=([\d.]+) global_step=(\d+), episodic_return=\[?(-?[\d.]+)")
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        print(line.rstrip())
        if m := episode.search(line):
            step = int(m.group(2))
            returns.append(float(m.group(3)))
            print(f"cleanrl_ppo_episode={m.group(1)},{step * 4},{m.group(3)}")
        elif m := re.search(r"SPS: (\d+)", line):
            sps = int(m.group(1))
if sps is None:
    sys.exit(f"no SPS line; see {sys.argv[1]} and its stderr.txt")
last = returns[-100:]
print(f"cleanrl_ppo_frames_per_s={sps * 4}")
print(f"cleanrl_ppo_frames={step * 4}")
print(f"cleanrl_ppo_return={sum(last) / len(last) if last else 'nan'}")
PYEOF
