#!/usr/bin/env bash
# Sample Factory 2.1.1 (APPO, PyTorch) on Pong for a fixed time, for figures
# beside ours in one invocation (benchmarks/peer_bench.py runs it). Not a
# project dependency: it installs into its own virtual environment under
# $PEER_DIR (default /tmp/sample_factory_peer) on first use, from PyPI, pinned:
#   torch==2.13.0 sample-factory==2.1.1 gymnasium[atari]==0.29.1
# Sample Factory's gymnasium needs ale-py 0.8, which has no ROMs of its own:
# the ROMs of the project's ale-py are imported into it (ale-import-roms).
#
# Usage: benchmarks/sample_factory_peer.sh [SECONDS] [extra train_atari args]
# Settings: its Atari example (sf_examples.atari.train_atari: Nature CNN,
# feed-forward, batch 256) on the CPU with 2 workers x 8 environments and
# rollout 32 (a 2-core machine's layout); extra args override them.
# Prints the "Fps is (10 sec: ...)" lines it logs and, last, the median of
# the 10-second figures after WARMUP_S (default 60) as
#   sample_factory_frames_per_s=<N>
# (environment frames/s: Sample Factory counts frames with the frame skip of
# 4, as ours does). Exit 1 when it logged no figure after the warm-up.
set -eu

SECS="${1:-240}"
if [ $# -gt 0 ]; then shift; fi
PEER="${PEER_DIR:-/tmp/sample_factory_peer}"
WARMUP_S="${WARMUP_S:-60}"
PY="$PEER/venv/bin/python"

if ! "$PY" -c "import sample_factory, sf_examples" 2>/dev/null; then
  echo "Installing Sample Factory 2.1.1 into $PEER/venv" >&2
  python3 -m venv "$PEER/venv"
  "$PEER/venv/bin/pip" install -q torch==2.13.0
  "$PEER/venv/bin/pip" install -q sample-factory==2.1.1 "gymnasium[atari]==0.29.1" \
    opencv-python-headless
  ROMS="$(python3 -c 'import ale_py, os; print(os.path.join(os.path.dirname(ale_py.__file__), "roms"))')"
  "$PEER/venv/bin/ale-import-roms" "$ROMS" >/dev/null
fi

RUN_DIR="$(mktemp -d "$PEER/run.XXXXXX")"
LOG="$RUN_DIR/log.txt"
timeout "$SECS" "$PY" -m sf_examples.atari.train_atari --env=atari_pong \
  --experiment=peer --train_dir="$RUN_DIR" --device=cpu --num_workers=2 \
  --num_envs_per_worker=8 --rollout=32 "$@" >"$LOG" 2>&1 || true

python3 - "$LOG" "$WARMUP_S" <<'EOF'
import datetime
import re
import statistics
import sys

path, warmup = sys.argv[1], float(sys.argv[2])
pattern = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]\[\d+\] Fps is \(10 sec: ([\d.na]+)")
figures, start = [], None
with open(path, errors="replace") as f:
    for line in f:
        match = pattern.search(line)
        if not match:
            continue
        when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
        start = start or when
        print(line.strip())
        if (when - start).total_seconds() >= warmup and match.group(2) != "nan":
            figures.append(float(match.group(2)))
if not figures:
    sys.exit(f"no Fps figure after {warmup:.0f} s; see {path}")
print(f"sample_factory_frames_per_s={statistics.median(figures):.0f}")
EOF
