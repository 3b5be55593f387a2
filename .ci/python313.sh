#!/usr/bin/env bash
# The project on Python 3.13, proven: Debian 13 (trixie) ships Python 3.13,
# so a root file system made from Debian's own packages (mmdebstrap) gets
# this checkout, a fresh venv, the README's install command and the fast
# tests (`-m "not slow"`), within a time limit.
#
#   .ci/python313.sh                    # make the root file system, run
#   ROOTFS=/var/tmp/trixie .ci/python313.sh   # keep and reuse it there
#
# PY313_LIMIT_SECS (default 2400) bounds the install and the tests together.
# Needs root (chroot and bind mounts) and mmdebstrap (installed with apt-get
# when missing). Exit: the tests' exit code (0 all passed); 124 past the
# limit; 2 when the root file system cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT="${PY313_LIMIT_SECS:-2400}"
[ "$(id -u)" = 0 ] || { echo "python313.sh: needs root (chroot)" >&2; exit 2; }
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap \
    || { echo "python313.sh: cannot install mmdebstrap" >&2; exit 2; }
fi
root="${ROOTFS:-}"
if [ -z "$root" ]; then
  root="$(mktemp -d /var/tmp/python313.XXXXXX)"
  cleanup_root=1
else
  cleanup_root=0
fi
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" || true; done
  if [ "$cleanup_root" = 1 ]; then rm -rf "$root"; fi
}
trap cleanup EXIT
if [ ! -x "$root/usr/bin/python3" ]; then
  start=$SECONDS
  # g++ for batcher.cc; iproute2 for the network-namespace tests (which
  # the fast subset leaves out, as it leaves out every slow test).
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,g++,ca-certificates,iproute2,git \
    trixie "$root" \
    || { echo "python313.sh: mmdebstrap trixie failed (above)" >&2; exit 2; }
  echo "python313.sh: Debian 13 root file system in $((SECONDS - start)) s"
fi
# pip there trusts the host's certificate authorities, and resolves names
# as the host does.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This checkout's files (tracked, and new ones not ignored), as CI has them.
rm -rf "$root/src" && mkdir -p "$root/src"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do [ -e "$path" ] && printf '%s\0' "$path"; done \
  | tar --null -T - -cf - | tar -xf - -C "$root/src"
for fs in proc sys dev dev/pts; do
  mkdir -p "$root/$fs"
  mount --bind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
done
mount -t tmpfs tmpfs "$root/tmp"
mounted+=("$root/tmp")
start=$SECONDS
set +e
timeout --kill-after=30 "$LIMIT" chroot "$root" /usr/bin/env -i \
  HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 /bin/bash -c '
    set -e
    cd /src
    python3 -c "import sys; print(\"python313.sh: Python\", sys.version.split()[0])"
    python3 -m venv /venv
    /venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
    /venv/bin/python -m pytest -q -m "not slow" tests'
code=$?
set -e
if [ "$code" = 124 ] || [ "$code" = 137 ]; then
  echo "python313.sh: over ${LIMIT} s; stopped" >&2
  exit 124
fi
echo "python313.sh: install and fast tests on Python 3.13 in $((SECONDS - start)) s, exit $code"
exit "$code"
