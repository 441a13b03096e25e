#!/usr/bin/env bash
# Build and run the three-node Docker deployment of pubsub-node.
#
#   deploy/cluster.sh build          cargo build --release --bins, then the image
#   deploy/cluster.sh image          the image only, from binaries already built
#   deploy/cluster.sh up             docker compose up -d, then wait until all three are ready
#   deploy/cluster.sh status         one GET /cluster line per node
#   deploy/cluster.sh logs [ARGS]    docker compose logs ARGS (e.g. -f node1)
#   deploy/cluster.sh down [-v]      remove the containers (-v: and the data volumes)
#
# Environment (all optional):
#   CARGO_TARGET_DIR       where cargo builds            (default: <repo>/target)
#   PUBSUB_IMAGE           the image to build and run    (default: pubsub-node:local)
#   PUBSUB_BASE_IMAGE      the image's base, e.g. debian:bookworm-slim where a registry is
#                          reachable (default: pubsub-base:local, imported from this host's
#                          own libraries, so no registry is needed)
#   PUBSUB_STRIP           0 keeps debug info in the image's binaries (default: stripped)
#   COMPOSE_PROJECT_NAME   the compose project           (default: pubsub)
#   PUBSUB_PORT_1..3       host ports of node1..node3    (default: 8081..8083)
#   PUBSUB_HOST_IP         the host address they are published on (default: 127.0.0.1)
#   PUBSUB_CLUSTER_SECRET  the shared Raft secret (compose has a public default, refused by
#                          `up` when PUBSUB_HOST_IP is not a loopback address)
set -euo pipefail

DEPLOY=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$DEPLOY")
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
BIN_DIR=$TARGET/release
IMAGE=${PUBSUB_IMAGE:-pubsub-node:local}
LOCAL_BASE=pubsub-base:local
PROJECT=${COMPOSE_PROJECT_NAME:-pubsub}
PORTS=("${PUBSUB_PORT_1:-8081}" "${PUBSUB_PORT_2:-8082}" "${PUBSUB_PORT_3:-8083}")
# Where the published ports answer (compose publishes them on PUBSUB_HOST_IP).
HOST=${PUBSUB_HOST_IP:-127.0.0.1}
if [ "$HOST" = 0.0.0.0 ]; then HOST=127.0.0.1; fi
# How long `up` waits for all three nodes to answer /ready (a cold start takes a few seconds).
READY_TIMEOUT_S=120

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# `docker compose` (v2) where installed, else the standalone `docker-compose` (v1).
compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose -p "$PROJECT" -f "$DEPLOY/docker-compose.yml" "$@"
    elif command -v docker-compose >/dev/null 2>&1; then
        docker-compose -p "$PROJECT" -f "$DEPLOY/docker-compose.yml" "$@"
    else
        die "neither 'docker compose' nor 'docker-compose' is installed"
    fi
}

# GET http://$HOST:PORT/PATH answers 200.
http_ok() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS -m 2 -o /dev/null "http://$HOST:$1$2" 2>/dev/null
    else
        "$BIN_DIR/pubsub-probe" "http://$HOST:$1$2" 2>/dev/null
    fi
}

cargo_build() {
    echo "==> cargo build --release --bins (target: $TARGET)"
    (cd "$REPO" && CARGO_TARGET_DIR=$TARGET cargo build --release --bins)
}

# Imports $LOCAL_BASE: a root filesystem holding only what the binaries load (ldd), the
# dynamic loader, /etc/passwd and /etc/group naming the node's uid, and /tmp. Re-imported
# only when that content changes, so rebuilding the image reuses Docker's layer cache.
local_base() {
    local root tarball sum libs lib current
    command -v ldd >/dev/null 2>&1 || die "ldd is needed to build the local base image"
    root=$(mktemp -d)
    tarball=$(mktemp)
    # shellcheck disable=SC2064 # expand now: the names are local.
    trap "rm -rf '$root' '$tarball'" RETURN

    if ldd "$BIN_DIR/pubsub-node" "$BIN_DIR/pubsub-probe" | grep -q 'not found'; then
        ldd "$BIN_DIR/pubsub-node" "$BIN_DIR/pubsub-probe" >&2
        die "a library the binaries need is missing on this host"
    fi
    # Indented lines only (the others name the binary): "libc.so.6 => /lib/.../libc.so.6 (0x...)"
    # and the loader, "/lib64/ld-linux-x86-64.so.2 (0x...)".
    libs=$(ldd "$BIN_DIR/pubsub-node" "$BIN_DIR/pubsub-probe" |
        awk '/^\t/ && $2 == "=>" && $3 ~ /^\// { print $3 } /^\t/ && $1 ~ /^\// { print $1 }' | sort -u)
    [ -n "$libs" ] || die "ldd found no libraries: are the binaries dynamically linked for this host?"
    # glibc before 2.34 loads its name-service modules at run time, so ldd does not list them,
    # and without them peer names (node2) would not resolve. Later glibc has them built in.
    local libc_dir nss
    libc_dir=$(dirname "$(echo "$libs" | grep '/libc\.so\.6$' | head -n1)")
    for nss in "$libc_dir"/libnss_files.so.2 "$libc_dir"/libnss_dns.so.2 "$libc_dir"/libresolv.so.2; do
        if [ -e "$nss" ]; then libs=$(printf '%s\n%s' "$libs" "$nss" | sort -u); fi
    done
    for lib in $libs; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done

    mkdir -p "$root/etc" "$root/tmp" "$root/usr/local/bin"
    chmod 1777 "$root/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\npubsub:x:10001:10001:pubsub:/var/lib/pubsub:/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\npubsub:x:10001:\n' >"$root/etc/group"
    # glibc resolves peer names (node2) through /etc/hosts, then Docker's DNS.
    printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"

    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$tarball" .
    sum=$(sha256sum "$tarball" | cut -c1-64)
    current=$(docker image inspect -f '{{ index .Config.Labels "pubsub.base.sha256" }}' "$LOCAL_BASE" 2>/dev/null || true)
    if [ "$current" = "$sum" ]; then
        echo "==> $LOCAL_BASE is up to date"
    else
        echo "==> docker import $LOCAL_BASE ($(echo "$libs" | wc -l) libraries)"
        docker import --change "LABEL pubsub.base.sha256=$sum" "$tarball" "$LOCAL_BASE" >/dev/null
    fi
}

image() {
    local ctx base
    for bin in pubsub-node pubsub-probe; do
        [ -x "$BIN_DIR/$bin" ] || die "$BIN_DIR/$bin not built: run '$0 build' (or set CARGO_TARGET_DIR)"
    done
    docker info >/dev/null 2>&1 || die "docker is not reachable ('docker info' fails)"
    if [ -n "${PUBSUB_BASE_IMAGE:-}" ]; then
        base=$PUBSUB_BASE_IMAGE
    else
        local_base
        base=$LOCAL_BASE
    fi
    ctx=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "rm -rf '$ctx'" RETURN
    mkdir -p "$ctx/bin" "$ctx/data"
    cp "$DEPLOY/Dockerfile" "$ctx/Dockerfile"
    cp "$BIN_DIR/pubsub-node" "$BIN_DIR/pubsub-probe" "$ctx/bin/"
    # The release profile keeps line tables, and RocksDB's C++ is built with full debug info:
    # ~460 MB. Stripping the debug sections (symbols stay, so backtraces keep function names)
    # leaves ~20 MB. PUBSUB_STRIP=0 keeps them.
    if [ "${PUBSUB_STRIP:-1}" != 0 ] && command -v strip >/dev/null 2>&1; then
        strip --strip-debug "$ctx/bin/pubsub-node" "$ctx/bin/pubsub-probe"
    fi
    echo "==> docker build $IMAGE (base: $base)"
    docker build -q --build-arg "BASE_IMAGE=$base" -t "$IMAGE" "$ctx" >/dev/null
    docker run --rm --entrypoint /usr/local/bin/pubsub-node "$IMAGE" --version
    echo "==> built $IMAGE"
}

up() {
    # Each node's /raft shares its published client port: beyond loopback, the compose file's
    # public default secret would let anyone who reaches the port act as a peer.
    case "${PUBSUB_HOST_IP:-127.0.0.1}" in
    127.* | localhost | ::1) ;;
    *) [ -n "${PUBSUB_CLUSTER_SECRET:-}" ] ||
        die "PUBSUB_HOST_IP=${PUBSUB_HOST_IP} publishes the nodes beyond this host: set PUBSUB_CLUSTER_SECRET (e.g. \$(openssl rand -hex 16)), the same for every node" ;;
    esac
    # compose never builds it (pull_policy never): say how to, not compose's "no such image".
    if [ "${PUBSUB_PULL_POLICY:-never}" = never ] && ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
        die "no image $IMAGE here: run deploy/cluster.sh build first"
    fi
    compose up -d
    echo "==> waiting for /ready on ports ${PORTS[*]}"
    local deadline=$((SECONDS + READY_TIMEOUT_S)) port ready
    while :; do
        ready=0
        for port in "${PORTS[@]}"; do
            if http_ok "$port" /ready; then ready=$((ready + 1)); fi
        done
        [ "$ready" -eq "${#PORTS[@]}" ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            compose ps >&2
            compose logs --tail 30 >&2
            die "not all nodes ready after ${READY_TIMEOUT_S}s"
        fi
        sleep 0.5
    done
    status
}

status() {
    local i port line
    for i in 0 1 2; do
        port=${PORTS[$i]}
        if command -v curl >/dev/null 2>&1; then
            line=$(curl -sS -m 2 "http://$HOST:$port/cluster" 2>&1) || true
        elif http_ok "$port" /cluster; then
            line="(up; install curl to see /cluster)"
        else
            line="(not answering)"
        fi
        echo "node$((i + 1)) :$port $line"
    done
}

case "${1:-}" in
build)
    cargo_build
    image
    ;;
image) image ;;
up) up ;;
down)
    shift
    compose down --remove-orphans "$@"
    ;;
status) status ;;
logs)
    shift
    compose logs "$@"
    ;;
*)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
