#!/bin/sh
# Install the host packages the cluster kit needs (Debian 12), quietly.
# Idempotent: when every package is installed it does nothing, not even apt-get update.
#
#   docker.io    dockerd and a client (the images are built and run locally; no registry)
#   debootstrap  the images' root filesystems (docker/build-images.sh)
#   iptables     partitions (consensus_lease/testing/faults.py)
#   util-linux   setpriv, to run a worker under its own gid
#   python3      docker/start-engine.sh when no virtualenv exists yet
#   etcd-server  local etcd members for the etcd backend tests (tests/backends/etcd_local.py)
#   etcd-client  etcdctl, to snapshot and restore them (the etcd store-epoch tests)
#   openssl      certificates for the TLS tests
#   zookeeper, openjdk-17-jre-headless
#                a local ZooKeeper for the TLS test (tests/backends/zk_local.py)
#   pgbouncer    PgBouncer 1.18 in front of the test PostgreSQL (tests/backends/pgbouncer_local.py)
#   redis-server the Celery broker of the fenced-task test (tests/celery/redelivery.py)
#
# Usage: docker/install-deps.sh [--with-compose]
#   --with-compose  also docker-compose, for docker/docker-compose.yml (local dev only)
set -eu
[ "$(id -u)" = 0 ] || { echo "install-deps.sh: must run as root" >&2; exit 1; }
packages="docker.io debootstrap iptables util-linux python3 etcd-server etcd-client openssl zookeeper openjdk-17-jre-headless pgbouncer redis-server"
[ "${1:-}" = "--with-compose" ] && packages="$packages docker-compose"

missing=""
for package in $packages; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $package"
    fi
done
[ -n "$missing" ] || exit 0

export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# shellcheck disable=SC2086
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
    echo "install-deps.sh: installing$missing failed:" >&2
    tail -n 30 "$log" >&2
    exit 1
fi
echo "install-deps.sh: installed$missing"
