#!/usr/bin/env bash
# Builds the image and runs it end to end with whichever container engine
# answers here (docker, else podman: docker/engine.sh), within a time limit.
#
#   docker/check.sh                  # the plain image (Atari)
#   docker/check.sh --standin-wheel  # with the DeepMind Lab stand-in packed
#                                    # as a wheel in wheels/ (removed after)
#
# Environment: PYTHON_IMAGE, a base image with Python 3.11 (default: the
# Dockerfile's; where the registry cannot be reached, one made by
# docker/local_base.sh); DMLAB_DATASET (fetch, or skip where the stimuli's
# download cannot be reached); CHECK_TIMEOUT_S (default 1800) for the build
# and the run together; IMAGE (default scalable_agent-check).
# It prints each step's timing, the image's size and the default command's
# test-mode table. Exit 0: the image built (its own check passed) and its
# default command trained and evaluated on the expected level; 1: a step
# failed (its output above, then one line naming it); 2: bad usage or no
# engine; 124: the time limit.
set -uo pipefail
cd "$(dirname "$0")/.."

standin=0
case "${1:-}" in
  "") ;;
  --standin-wheel) standin=1 ;;
  *) echo "usage: docker/check.sh [--standin-wheel]" >&2; exit 2 ;;
esac
engine="$(docker/engine.sh)" || exit 2
image="${IMAGE:-scalable_agent-check}"
deadline=$(( $(date +%s) + ${CHECK_TIMEOUT_S:-1800} ))
build_args=(--build-arg "DMLAB_DATASET=${DMLAB_DATASET:-fetch}")
if [ -n "${PYTHON_IMAGE:-}" ]; then
  build_args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
fi
format=()
[ "$engine" = podman ] && format=(--format docker)  # the SHELL line applies

fail() { echo "docker/check.sh: $1" >&2; exit "${2:-1}"; }
left() { local s=$(( deadline - $(date +%s) )); [ "$s" -gt 0 ] || fail "time limit reached" 124; echo "$s"; }

if [ "$standin" = 1 ]; then
  ls wheels/deepmind_lab-*.whl >/dev/null 2>&1 \
    && fail "wheels/ already holds a DeepMind Lab wheel; move it away first" 2
  wheel="$(python3 tests/standin_wheel.py wheels)" || fail "could not pack the stand-in"
  trap 'rm -f "$wheel"' EXIT
  expected_level="explore_goal_locations_small"
else
  expected_level="atari/pong"
fi

start=$(date +%s)
timeout "$(left)" "$engine" build "${format[@]}" "${build_args[@]}" -t "$image" . \
  || fail "the build failed or ran out of time (engine $engine)"
built=$(date +%s)
echo "docker/check.sh: built $image with $engine in $(( built - start )) s;" \
  "size $("$engine" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1 / 1e9}')"
log="$(mktemp)"
timeout "$(left)" "$engine" run --rm "$image" >"$log" 2>&1
code=$?
ran=$(date +%s)
cat "$log"
[ "$code" = 0 ] || fail "the image's default command exited $code"
grep -qE "^(contributed/dmlab30/)?$expected_level +[0-9]" "$log" \
  || fail "test mode's table has no row for $expected_level"
echo "docker/check.sh: the default command trained and evaluated $expected_level in $(( ran - built )) s"
echo "docker/check.sh: passed"
