#!/bin/bash
# Build the cluster kit's images without a registry: a Debian minbase rootfs
# made by debootstrap, imported with `docker import`.
#
#   consensus-lease/etcd:3.4        (etcd-server from Debian)
#   consensus-lease/zookeeper:3.8   (zookeeper + openjdk-17-jre-headless)
#
# Idempotent: an image is built only when missing or built by an older recipe
# (label org.consensus-lease.recipe). Both builds run in parallel; the time
# each took is printed. Names can be overridden with CONSENSUS_LEASE_ETCD_IMAGE
# and CONSENSUS_LEASE_ZOOKEEPER_IMAGE; the Debian mirror is read from the apt
# sources of this machine (override with DEBIAN_MIRROR). Needs root, a running
# engine (docker/start-engine.sh) and debootstrap (docker/install-deps.sh).
#
# Usage: docker/build-images.sh [--force]
set -euo pipefail

# Bump an image's recipe number when its build changes, so hosts rebuild it.
ETCD_RECIPE=1
ZK_RECIPE=2
ETCD_IMAGE=${CONSENSUS_LEASE_ETCD_IMAGE:-consensus-lease/etcd:3.4}
ZK_IMAGE=${CONSENSUS_LEASE_ZOOKEEPER_IMAGE:-consensus-lease/zookeeper:3.8}
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

die() { echo "build-images.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap missing: run docker/install-deps.sh"
command -v docker >/dev/null || die "docker client missing: run docker/install-deps.sh"
docker info >/dev/null 2>&1 || die "no Docker engine answers: run docker/start-engine.sh"

# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$CODENAME" ] || die "cannot read VERSION_CODENAME from /etc/os-release"

# The first URI of an apt source that carries the release's own suite, from
# deb822 files (*.sources) or one-line lists (sources.list, *.list).
debian_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        awk -v suite="$CODENAME" '
            function flush() {
                if (uris != "" && (" " suites " ") ~ (" " suite " ")) { split(uris, u, " "); print u[1]; found = 1; exit }
                uris = ""; suites = ""
            }
            /^[[:space:]]*$/ { flush(); next }
            tolower($1) == "uris:"   { $1 = ""; uris = $0 }
            tolower($1) == "suites:" { $1 = ""; suites = $0 }
            END { if (!found) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -e "$f" ] || continue
        awk -v suite="$CODENAME" '$1 == "deb" {
            i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == suite) { print $i; exit }
        }' "$f"
    done
}
MIRROR=${DEBIAN_MIRROR:-$(debian_mirror | head -n 1)}
[ -n "$MIRROR" ] || die "no Debian mirror for suite $CODENAME found in /etc/apt/sources.list*; set DEBIAN_MIRROR"

up_to_date() {
    local have
    have=$(docker image inspect -f '{{ index .Config.Labels "org.consensus-lease.recipe" }}' "$1" 2>/dev/null) || return 1
    [ "$FORCE" = 0 ] && [ "$have" = "$2" ]
}

# One build at a time per host (two test sessions may both find an image missing);
# the up-to-date checks below run after the lock is taken.
exec 9>/var/lock/consensus-lease-build-images.lock
flock -w 900 9 || die "another build-images.sh held the lock for 900 s"

WORK=$(mktemp -d /var/tmp/consensus-lease-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# build NAME IMAGE RECIPE PACKAGES [--change ...]: debootstrap + import
build() {
    local name=$1 image=$2 recipe=$3 packages=$4
    shift 4
    local rootfs="$WORK/$name-rootfs" start=$SECONDS
    debootstrap --variant=minbase --include="$packages" "$CODENAME" "$rootfs" "$MIRROR"
    if [ "$name" = zookeeper ]; then
        install -m 0755 /dev/stdin "$rootfs/usr/local/bin/zk-member" <<'ZKMEMBER'
#!/bin/sh
# zk-member MYID [ZOO_CFG_LINE ...]
# Writes MYID and the given zoo.cfg lines (after dataDir=$ZK_DATA_DIR) into the
# data directory, then runs one ZooKeeper quorum peer in the foreground with
# its log on the console. The data directory lives in the container, so it
# survives `docker restart`.
set -eu
[ $# -ge 1 ] || { echo "usage: zk-member MYID [zoo.cfg line ...]" >&2; exit 64; }
data_dir=${ZK_DATA_DIR:-/var/lib/zookeeper-member}
mkdir -p "$data_dir"
echo "$1" > "$data_dir/myid"
shift
{ echo "dataDir=$data_dir"; for line in "$@"; do echo "$line"; done; } > "$data_dir/zoo.cfg"
# shellcheck disable=SC2086
exec java ${JVMFLAGS:-} -Dzookeeper.root.logger=INFO,CONSOLE -Dzookeeper.log.dir="$data_dir" \
    -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$data_dir/zoo.cfg"
ZKMEMBER
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    local old new
    old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
    new=$(tar -C "$rootfs" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . \
        | docker import --change "LABEL org.consensus-lease.recipe=$recipe" "$@" - "$image")
    rm -rf "$rootfs"
    # Drop the image this one replaces; a container still using it keeps it alive.
    if [ -n "$old" ] && [ "$old" != "$new" ]; then
        docker rmi "$old" >/dev/null 2>&1 || echo "kept old image $old (in use)"
    fi
    echo "built $image in $((SECONDS - start)) s"
}

declare -A pids=()
if up_to_date "$ETCD_IMAGE" "$ETCD_RECIPE"; then
    echo "$ETCD_IMAGE is up to date"
else
    build etcd "$ETCD_IMAGE" "$ETCD_RECIPE" etcd-server \
        --change 'ENTRYPOINT ["/usr/bin/etcd"]' \
        >"$WORK/etcd.log" 2>&1 &
    pids[etcd]=$!
fi
if up_to_date "$ZK_IMAGE" "$ZK_RECIPE"; then
    echo "$ZK_IMAGE is up to date"
else
    build zookeeper "$ZK_IMAGE" "$ZK_RECIPE" zookeeper,openjdk-17-jre-headless \
        --change 'ENV JVMFLAGS="-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"' \
        --change 'ENTRYPOINT ["/usr/local/bin/zk-member"]' \
        >"$WORK/zookeeper.log" 2>&1 &
    pids[zookeeper]=$!
fi

failed=0
for name in etcd zookeeper; do
    [ -n "${pids[$name]:-}" ] || continue
    if wait "${pids[$name]}"; then
        tail -n 1 "$WORK/$name.log"
    else
        failed=1
        echo "build-images.sh: building the $name image failed; last lines of its log:" >&2
        tail -n 30 "$WORK/$name.log" >&2
    fi
done
exit "$failed"
