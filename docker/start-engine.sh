#!/bin/sh
# Start the local Docker engine for the cluster kit, unless one already answers.
#
# Idempotent. Runs dockerd --bridge=none --iptables=false --ip-masq=false in the
# background (log: /var/log/consensus-lease-dockerd.log) and waits, with a
# deadline, for /var/run/docker.sock to answer. Exits non-zero with a message
# saying what is missing on failure.
#
# The logic lives in consensus_lease/testing/engine.py (standard library only),
# which the pytest plugin also uses; it is run here as a plain script so that
# neither a virtualenv nor the package's dependencies are needed.
#
# Usage: docker/start-engine.sh [--timeout-s SECONDS] [--log PATH]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
engine="$here/../consensus_lease/testing/engine.py"
if [ -x "$here/../.venv/bin/python" ]; then
    python="$here/../.venv/bin/python"
else
    python=$(command -v python3 || true)
fi
if [ -z "$python" ]; then
    echo "start-engine.sh: no python3 found (apt-get install -y python3)" >&2
    exit 1
fi
exec "$python" "$engine" "$@"
