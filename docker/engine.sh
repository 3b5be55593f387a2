#!/usr/bin/env bash
# Prints the container engine that answers on this host: docker when its
# daemon does, else podman (rootful; see docs/docker.md for the
# containers.conf a locked-down host may need); exit 2 when neither does.
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  echo docker
elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then
  echo podman
else
  echo "no container engine answers: start Docker's daemon or install podman" >&2
  exit 2
fi
