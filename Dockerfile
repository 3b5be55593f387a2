# IMPALA (scalable_agent) with DeepMind Lab built from source.
#
#   docker build -t scalable_agent .
#   docker run --rm scalable_agent          # short training, then test mode
#
# Three stages:
#   dmlab-build  builds the deepmind_lab wheel with DeepMind Lab's documented
#                Bazel build (Bazel, compilers and sources stay in this stage);
#   dataset      fetches the brady_konkle_oliva2008 stimuli the psychlab
#                levels of DMLab-30 need and converts them to PNG;
#   runtime      Python 3.11, the project (installed with the README's command),
#                the wheel, the dataset and a prebuilt batcher.so. The test
#                suite runs while the image builds.
#
# x86_64 only: the pinned Bazel binary and checksum are for linux-x86_64.
# CI does not build this image (its machines have no Docker engine); the
# pins below are checked by tests/docs_test.py.

# Base image: exact Python patch release and Debian release, plus a digest.
# To move it forward: docker buildx imagetools inspect python:3.11-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

###############################################################################
FROM ${PYTHON_IMAGE} AS dmlab-build

# Bazel 7.6.1 with Bzlmod off and WORKSPACE on, and Abseil pinned to
# 20230125.3, is the combination reported to build DeepMind Lab's WORKSPACE
# today (google-deepmind/lab issue 258 and pull request 262). Bazel 8 drops
# WORKSPACE support by default and newer rules_python rejects its PY2 targets.
ARG BAZEL_VERSION=7.6.1
ARG BAZEL_SHA256=ac6249d1192aea9feaf49dfee2ab50c38cee2454b00cf29bbec985a11795c025
ARG ABSEIL_VERSION=20230125.3
# google-deepmind/lab commit (WORKSPACE with python_repo(py_version = "PY3")).
ARG DMLAB_COMMIT=6dd241d1b17a1f4e67819b922ecc05bedc4efcbb
# The NumPy that DeepMind Lab's module compiles against; keep it equal to the
# numpy pin in requirements.txt (tests/docs_test.py checks that).
ARG NUMPY_VERSION=2.4.6
# Bazel's --jobs; lower it (e.g. 4) when the Docker VM runs out of memory.
ARG BAZEL_JOBS=auto

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# DeepMind Lab's documented build dependencies (docs/users/build.md) for
# Debian, with the Python 3 pieces coming from the base image and pip; the GL
# and EGL headers are for its hardware-rendering library.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential ca-certificates curl freeglut3-dev gettext git \
        libegl-dev libffi-dev libgl-dev libosmesa6-dev libsdl2-dev \
        unzip zip zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*

# The Bazel release binary (it embeds its own JDK), checked against its sha256.
RUN curl -fsSL --retry 3 -o /usr/local/bin/bazel \
        "https://github.com/bazelbuild/bazel/releases/download/${BAZEL_VERSION}/bazel-${BAZEL_VERSION}-linux-x86_64" \
    && echo "${BAZEL_SHA256}  /usr/local/bin/bazel" | sha256sum --check --strict - \
    && chmod 0755 /usr/local/bin/bazel \
    && bazel --version

# python_system.bzl runs `python3` to find the Python and NumPy headers (it
# uses distutils, present in 3.11, and packaging); build_pip_package runs
# `setup.py bdist_wheel`.
RUN python3 -m pip install \
        "numpy==${NUMPY_VERSION}" packaging==24.2 setuptools==75.8.0 wheel==0.45.1

WORKDIR /src/lab
RUN git init --quiet . \
    && git remote add origin https://github.com/google-deepmind/lab.git \
    && git fetch --quiet --depth 1 origin "${DMLAB_COMMIT}" \
    && git checkout --quiet --detach FETCH_HEAD \
    && test "$(git rev-parse HEAD)" = "${DMLAB_COMMIT}"

# Pin Abseil (the WORKSPACE tracks its moving master branch) and select the
# legacy WORKSPACE resolver. Each edit is checked so that an upstream change
# fails here instead of silently building something else.
RUN sed -i \
        -e "s#abseil-cpp-master#abseil-cpp-${ABSEIL_VERSION}#" \
        -e "s#abseil-cpp/archive/master.zip#abseil-cpp/archive/refs/tags/${ABSEIL_VERSION}.zip#" \
        WORKSPACE \
    && grep -q "abseil-cpp-${ABSEIL_VERSION}\"" WORKSPACE \
    && grep -q "refs/tags/${ABSEIL_VERSION}.zip" WORKSPACE \
    && printf '%s\n' \
        'common --enable_bzlmod=false' \
        'common --enable_workspace=true' \
        'build --cxxopt=-std=c++17' \
        >> .bazelrc

# The documented pip-package build (python/pip_package/README.md).
ENV PYTHON_BIN_PATH=/usr/local/bin/python3
RUN bazel build -c opt --jobs="${BAZEL_JOBS}" //python/pip_package:build_pip_package \
    && ./bazel-bin/python/pip_package/build_pip_package /tmp/dmlab_pkg \
    && ls -l /tmp/dmlab_pkg/deepmind_lab-*.whl \
    && bazel shutdown

###############################################################################
FROM ${PYTHON_IMAGE} AS dataset

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl unzip \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m pip install Pillow==11.3.0

# Object stimuli of Brady, Konkle, Alvarez and Oliva (2008), fetched and
# renamed as DeepMind Lab's data/brady_konkle_oliva2008/README.md describes:
# the JPEGs, sorted by file name, become 0001.png, 0002.png, ...
WORKDIR /opt/dmlab_data
RUN curl -fsSL --retry 3 -o /tmp/ObjectsAll.zip https://bradylab.ucsd.edu/stimuli/ObjectsAll.zip \
    && unzip -q /tmp/ObjectsAll.zip -d /tmp/objects \
    && python3 -c "import os, sys; from PIL import Image; src = '/tmp/objects/OBJECTSALL'; names = sorted(n for n in os.listdir(src) if n.endswith(('jpg', 'JPG'))); names or sys.exit('no JPEG files in ' + src); [Image.open(os.path.join(src, n)).save('%04d.png' % i) for i, n in enumerate(names, 1)]; print(len(names), 'stimuli written to', os.getcwd())" \
    && rm -rf /tmp/ObjectsAll.zip /tmp/objects

###############################################################################
FROM ${PYTHON_IMAGE} AS runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# g++ builds batcher.so (the dynamic batching op); the rest are the shared
# libraries DeepMind Lab's renderers load (OSMesa for software rendering,
# EGL/GL for hardware rendering).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential libegl1 libffi8 libgl1 libglu1-mesa libglut3.12 \
        libosmesa6 libsdl2-2.0-0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/scalable_agent

# The project's dependencies, with exactly the README's install command.
COPY requirements.txt ./
RUN python3 -m pip install -r requirements.txt

# DeepMind Lab's wheel. Its files live in the wheel under deepmind_lab/; a
# Bazel build with Bzlmod on would nest them under deepmind_lab/_main/, which
# the import cannot find, so such a layout is flattened here.
COPY --from=dmlab-build /tmp/dmlab_pkg/ /tmp/dmlab_pkg/
RUN python3 -m pip install /tmp/dmlab_pkg/deepmind_lab-*.whl \
    && rm -rf /tmp/dmlab_pkg \
    && pkg="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/deepmind_lab" \
    && if [ -d "${pkg}/_main" ]; then cp -a "${pkg}/_main/." "${pkg}/" && rm -rf "${pkg}/_main"; fi \
    && missing="$(find "${pkg}" -name '*.so' -exec ldd {} + | grep 'not found' || true)" \
    && if [ -n "${missing}" ]; then echo "DeepMind Lab libraries missing: ${missing}" >&2; exit 1; fi

COPY --from=dataset /opt/dmlab_data/ /opt/dmlab_data/

# DeepMind Lab works: one DMLab-30 level, and one psychlab level that reads
# the stimuli dataset.
RUN python3 -c "import numpy as np, deepmind_lab; [deepmind_lab.Lab('contributed/dmlab30/' + level, ['RGB_INTERLEAVED'], {'width': '96', 'height': '72', 'datasetPath': '/opt/dmlab_data'}).reset(seed=1) for level in ('explore_goal_locations_small', 'psychlab_arbitrary_visuomotor_mapping')]; print('deepmind_lab OK')"

COPY . .

# Prebuild the dynamic batching op, then run the README's test command.
RUN python3 dynamic_batching.py \
    && python3 -m pytest tests

# Default: a short training run on the default level (explore_goal_locations_small,
# DeepMind Lab being installed), then test mode on the checkpoint it wrote.
CMD ["bash", "-c", "set -e; python3 experiment.py --logdir=/tmp/agent --total_environment_frames=10000 --dataset_path=/opt/dmlab_data; python3 experiment.py --mode=test --logdir=/tmp/agent --test_num_episodes=5 --dataset_path=/opt/dmlab_data"]
