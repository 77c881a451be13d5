#!/bin/sh
# Stand-in for ZooKeeper's bin/zkServer.sh in the look-alike image: only
# `zkServer.sh start-foreground [CONFIG]`, which is what the official image runs.
# The configuration is $ZOOCFGDIR/zoo.cfg unless CONFIG is given; the heap is
# ZK_SERVER_HEAP MB (default 1000) unless JVMFLAGS sets another -Xmx (the later flag
# wins, as in the real script); the log goes to the console.
set -eu
if [ "${1:-}" != start-foreground ]; then
    echo "zkServer.sh (look-alike image): only 'start-foreground' is supported" >&2
    exit 64
fi
conf_dir=${ZOOCFGDIR:-/conf}
config=${2:-zoo.cfg}
case $config in
    */*) ;;
    *) config="$conf_dir/$config" ;;
esac
echo "Using config: $config" >&2
# shellcheck disable=SC2086
exec java "-Xmx${ZK_SERVER_HEAP:-1000}m" ${SERVER_JVMFLAGS:-} ${JVMFLAGS:-} \
    -Dzookeeper.log.dir="${ZOO_LOG_DIR:-/logs}" -Dzookeeper.root.logger=INFO,CONSOLE \
    -cp "$conf_dir:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$config"
