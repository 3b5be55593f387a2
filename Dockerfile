# IMPALA (scalable_agent), with DeepMind Lab when you bring its wheel.
#
#   docker build -t scalable_agent .          # Atari; DeepMind Lab if wheels/ has it
#   docker run --rm scalable_agent            # short training, then test mode
#
# DeepMind Lab is not built here. Install it from its own project following
# its documentation, which gives a Python wheel (deepmind_lab-*.whl); put that
# wheel in wheels/ before `docker build` and the image installs it with the
# run-time libraries it loads and dm-env. Without one the image still builds,
# says so once, and trains on Atari (the default level falls back to
# atari/pong).
#
# Two stages:
#   dataset  fetches the brady_konkle_oliva2008 stimuli the psychlab levels
#            of DMLab-30 need and converts them to PNG (data, not software);
#            --build-arg DMLAB_DATASET=skip leaves them out where their
#            download cannot be reached (the image then says so once);
#   runtime  Python 3.11 (3.12, 3.13 accepted), the project (installed with the README's command;
#            --build-arg TENSORFLOW=gpu installs tensorflow[and-cuda] instead
#            of tensorflow-cpu), DeepMind Lab's wheel if given, the dataset
#            and a prebuilt batcher.so. The build ends with the image's own
#            check (docker/image_check.sh: a short training run and one test
#            episode, a few minutes); the full suite is CI's.
#
# Where the registry's base image cannot be pulled, make a Python 3.11 one
# locally (docker/local_base.sh) and pass it as --build-arg PYTHON_IMAGE=...
# docker/check.sh builds and runs the image end to end with docker or podman.
# CI does not build this image (its machines have no container engine);
# tests/docs_test.py checks it against the README.

# Base image: exact Python patch release and Debian release, plus a digest.
# To move it forward: docker buildx imagetools inspect python:3.11-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1
# fetch (the default) or skip: the psychlab stimuli.
ARG DMLAB_DATASET=fetch

###############################################################################
FROM ${PYTHON_IMAGE} AS dataset

# The base image must have Python 3.11 to 3.13 (the project's); checked
# with /bin/sh, before the SHELL line, so that any base gets this line.
RUN command -v python3 >/dev/null \
    || { echo "PYTHON_IMAGE has no python3; the project needs Python 3.11 to 3.13: pass --build-arg PYTHON_IMAGE=<an image with one of them>, e.g. one made by docker/local_base.sh" >&2; exit 1; } \
    && python3 -c 'import sys; sys.exit(None if (3, 11) <= sys.version_info[:2] <= (3, 13) else "PYTHON_IMAGE has Python " + sys.version.split()[0] + "; the project needs 3.11 to 3.13: pass --build-arg PYTHON_IMAGE=<an image with one of them>, e.g. one made by docker/local_base.sh")'

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Object stimuli of Brady, Konkle, Alvarez and Oliva (2008), fetched and
# renamed as DeepMind Lab's data/brady_konkle_oliva2008/README.md describes:
# the JPEGs, sorted by file name, become 0001.png, 0002.png, ...
ARG DMLAB_DATASET
WORKDIR /opt/dmlab_data
# hadolint ignore=DL3008
RUN if [ "${DMLAB_DATASET}" = skip ]; then \
        echo "The psychlab levels' stimuli (brady_konkle_oliva2008) were left out of this image (DMLAB_DATASET=skip): psychlab_arbitrary_visuomotor_mapping and psychlab_continuous_recognition cannot start; mount the stimuli and pass --dataset_path." | tee NOT_FETCHED; \
    elif [ "${DMLAB_DATASET}" != fetch ]; then \
        echo "DMLAB_DATASET=${DMLAB_DATASET}: use fetch (the default) or skip" >&2; exit 1; \
    else \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates curl unzip \
        && rm -rf /var/lib/apt/lists/* \
        && python3 -m pip install Pillow==11.3.0 \
        && curl -fsSL --retry 3 -o /tmp/ObjectsAll.zip https://bradylab.ucsd.edu/stimuli/ObjectsAll.zip \
        && unzip -q /tmp/ObjectsAll.zip -d /tmp/objects \
        && python3 -c "import os, sys; from PIL import Image; src = '/tmp/objects/OBJECTSALL'; names = sorted(n for n in os.listdir(src) if n.endswith(('jpg', 'JPG'))); names or sys.exit('no JPEG files in ' + src); [Image.open(os.path.join(src, n)).save('%04d.png' % i) for i, n in enumerate(names, 1)]; print(len(names), 'stimuli written to', os.getcwd())" \
        && rm -rf /tmp/ObjectsAll.zip /tmp/objects; \
    fi

###############################################################################
FROM ${PYTHON_IMAGE} AS runtime

# The base image must have Python 3.11 to 3.13 (the project's).
RUN command -v python3 >/dev/null \
    || { echo "PYTHON_IMAGE has no python3; the project needs Python 3.11 to 3.13: pass --build-arg PYTHON_IMAGE=<an image with one of them>, e.g. one made by docker/local_base.sh" >&2; exit 1; } \
    && python3 -c 'import sys; sys.exit(None if (3, 11) <= sys.version_info[:2] <= (3, 13) else "PYTHON_IMAGE has Python " + sys.version.split()[0] + "; the project needs 3.11 to 3.13: pass --build-arg PYTHON_IMAGE=<an image with one of them>, e.g. one made by docker/local_base.sh")'

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# g++ builds batcher.so (the dynamic batching op).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/scalable_agent

# The project's dependencies, with exactly the README's install command;
# TENSORFLOW=gpu swaps tensorflow-cpu for tensorflow[and-cuda] (same
# version) for NVIDIA GPUs, as requirements.txt's header says.
ARG TENSORFLOW=cpu
COPY requirements.txt pyproject.toml ./
COPY install/ ./install/
RUN if [ "${TENSORFLOW}" = gpu ]; then \
        sed -i 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' requirements.txt; \
    elif [ "${TENSORFLOW}" != cpu ]; then \
        echo "TENSORFLOW=${TENSORFLOW}: use cpu (the default) or gpu" >&2; exit 1; \
    fi \
    && python3 -m pip install -r requirements.txt

# DeepMind Lab from the wheel you put in wheels/ (see the top of this file),
# with the Debian libraries its engine loads (software and hardware
# rendering, Lua, SDL, image formats) and dm-env. The check imports it and
# starts one DMLab-30 level and one psychlab level, which reads the stimuli
# dataset (DeepMind Lab's own generated images where it was skipped).
# The same libraries by each Debian release's package names (Debian 13
# renamed some for its 64-bit time_t move); another release: give the list
# as --build-arg DMLAB_RUNTIME_LIBRARIES=... .
ARG DMLAB_RUNTIME_LIBRARIES_BOOKWORM="libabsl20220623 libsdl2-2.0-0 liblua5.1-0 libosmesa6 libegl1 libgl1 libjpeg62-turbo libpng16-16 libxml2 libglib2.0-0"
ARG DMLAB_RUNTIME_LIBRARIES_TRIXIE="libabsl20240722 libsdl2-2.0-0 liblua5.1-0 libosmesa6 libegl1 libgl1 libjpeg62-turbo libpng16-16t64 libxml2 libglib2.0-0t64"
ARG DMLAB_RUNTIME_LIBRARIES=""
COPY --from=dataset /opt/dmlab_data/ /opt/dmlab_data/
COPY wheels/ /tmp/wheels/
COPY docker/wheel_python.py /tmp/wheel_python.py
# hadolint ignore=DL3008,SC2086
RUN wheels="$(find /tmp/wheels -maxdepth 1 -name 'deepmind_lab-*.whl')" \
    && if [ -z "${wheels}" ]; then \
        echo "No DeepMind Lab wheel in wheels/: this image trains on Atari (the default level falls back to atari/pong)."; \
    elif [ "$(echo "${wheels}" | wc -l)" -gt 1 ]; then \
        echo "More than one DeepMind Lab wheel in wheels/: keep one of" ${wheels} >&2; exit 1; \
    else \
        python3 /tmp/wheel_python.py "${wheels}" \
        && release="$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")" \
        && libraries="${DMLAB_RUNTIME_LIBRARIES}" \
        && if [ -z "${libraries}" ]; then case "${release}" in \
            bookworm) libraries="${DMLAB_RUNTIME_LIBRARIES_BOOKWORM}" ;; \
            trixie) libraries="${DMLAB_RUNTIME_LIBRARIES_TRIXIE}" ;; \
            *) echo "PYTHON_IMAGE is Debian ${release}, whose names of DeepMind Lab's libraries this Dockerfile does not know: pass --build-arg DMLAB_RUNTIME_LIBRARIES='...' (the bookworm and trixie lists are in the Dockerfile)" >&2; exit 1 ;; \
        esac; fi \
        && apt-get update \
        && apt-get install -y --no-install-recommends ${libraries} \
        && rm -rf /var/lib/apt/lists/* \
        && python3 -m pip install dm-env==1.6 "${wheels}" \
        && { python3 -c "import deepmind_lab" \
             || { echo "wheels/$(basename "${wheels}") installs but 'import deepmind_lab' fails (above): bring a wheel built for this image's $(python3 -V) on its Debian release" >&2; exit 1; }; } \
        && dataset=/opt/dmlab_data && { [ ! -e /opt/dmlab_data/NOT_FETCHED ] || dataset=dummy; } \
        && for level in explore_goal_locations_small psychlab_arbitrary_visuomotor_mapping; do \
            python3 -c "import sys, deepmind_lab; deepmind_lab.Lab('contributed/dmlab30/' + sys.argv[1], ['RGB_INTERLEAVED'], {'width': '96', 'height': '72', 'datasetPath': sys.argv[2]}).reset(seed=1); print('deepmind_lab OK:', sys.argv[1])" "${level}" "${dataset}" || exit 1; \
        done; \
    fi \
    && rm -rf /tmp/wheels /tmp/wheel_python.py

COPY . .

# Prebuild the dynamic batching op, then the image's own check.
RUN python3 dynamic_batching.py \
    && docker/image_check.sh

# Default: a short training run on the default level (explore_goal_locations_small
# with DeepMind Lab, atari/pong without it), then test mode on its checkpoint.
CMD ["bash", "-c", "set -e; cat /opt/dmlab_data/NOT_FETCHED 2>/dev/null || true; python3 experiment.py --logdir=/tmp/agent --total_environment_frames=10000 --dataset_path=/opt/dmlab_data; python3 experiment.py --mode=test --logdir=/tmp/agent --test_num_episodes=5 --dataset_path=/opt/dmlab_data"]
