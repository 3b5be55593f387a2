#!/usr/bin/env bash
# A Python base image made on this host, for building the project's image
# where the registry's python:3.11-slim-bookworm cannot be pulled:
#
#   docker/local_base.sh [NAME [RELEASE]]
#   docker build --build-arg PYTHON_IMAGE=NAME -t scalable_agent .
#
# RELEASE: bookworm (Debian 12, Python 3.11; the default, NAME then
# localhost/python311-bookworm) or trixie (Debian 13, Python 3.13; NAME
# then localhost/python313-trixie). The release's root file system from
# Debian's own packages (mmdebstrap), with its Python (python3, pip,
# headers), the host's certificate authorities (so that pip in the build
# trusts the same ones as the host) and pip allowed to install into the
# system Python (a container has no other). Needs root, mmdebstrap and
# docker or podman. Exit 0 with NAME built; 2 for bad usage; otherwise the
# failing step's output and a non-zero exit.
set -euo pipefail

RELEASE="${2:-bookworm}"
case "$RELEASE" in
  bookworm) PYTHON=3.11 ;;
  trixie) PYTHON=3.13 ;;
  *) echo "local_base.sh: RELEASE=$RELEASE: use bookworm (Python 3.11) or trixie (Python 3.13)" >&2; exit 2 ;;
esac
NAME="${1:-localhost/python${PYTHON/./}-$RELEASE}"
ENGINE="$(dirname "$0")/engine.sh"
engine="$("$ENGINE")"
for tool in mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "local_base.sh: $tool is missing; install it (apt-get install $tool)" >&2
    exit 2
  }
done
PYTHON_TUPLE="${PYTHON/./, }"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-pip,python3-dev,ca-certificates \
  "$RELEASE" "$work/rootfs.tar"
"$engine" import "$work/rootfs.tar" "$NAME-rootfs" >/dev/null 2>&1
cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
cat >"$work/Containerfile" <<CONTAINERFILE
FROM $NAME-rootfs
COPY host-ca.crt /etc/ssl/certs/ca-certificates.crt
RUN rm -f /usr/lib/python$PYTHON/EXTERNALLY-MANAGED \
    && python3 -c 'import sys; assert sys.version_info[:2] == ($PYTHON_TUPLE), sys.version'
ENV PIP_ROOT_USER_ACTION=ignore
CMD ["python3"]
CONTAINERFILE
"$engine" build --format docker -q -t "$NAME" "$work" >/dev/null
echo "local_base.sh: built $NAME ($("$engine" run --rm "$NAME" python3 --version))"
