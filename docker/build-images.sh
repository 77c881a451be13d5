#!/bin/sh
# Build the cluster kit's images without a registry, from the recipes shipped in the
# package (consensus_lease/testing/images/: one folder per image, a Dockerfile built
# FROM a Debian minbase root filesystem made by debootstrap). The same code runs as
# `consensus-lease kit build-images` from an installed package.
#
#   consensus-lease/etcd:3.4        (etcd-server from Debian)
#   consensus-lease/zookeeper:3.8   (zookeeper + openjdk-17-jre-headless)
#
# Idempotent: an image is built only when missing or built by another recipe
# revision or build arguments (label org.consensus-lease.recipe); each build's time
# is printed. Names can be overridden with CONSENSUS_LEASE_ETCD_IMAGE and
# CONSENSUS_LEASE_ZOOKEEPER_IMAGE;
# the Debian mirror is read from this machine's apt sources (override with
# DEBIAN_MIRROR). Needs root, a running engine (docker/start-engine.sh) and
# debootstrap (docker/install-deps.sh).
#
# Usage: docker/build-images.sh [RECIPE ...] [--force]
#   RECIPE: etcd, zookeeper, kit (default: both), lookalike (the images following
#   the upstream etcd / zookeeper conventions), all
set -eu
here=$(cd "$(dirname "$0")" && pwd)
builder="$here/../consensus_lease/testing/images/build.py"
if [ -x "$here/../.venv/bin/python" ]; then
    python="$here/../.venv/bin/python"
else
    python=$(command -v python3 || true)
fi
if [ -z "$python" ]; then
    echo "build-images.sh: no python3 found (apt-get install -y python3)" >&2
    exit 1
fi
# Run as a plain script (standard library only): no virtualenv or dependencies needed.
exec "$python" "$builder" "$@"
