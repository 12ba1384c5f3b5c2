#!/usr/bin/env bash
# A throwaway single-node Ceph cluster with a RADOS Gateway on 127.0.0.1, for testing and
# benchmarking rlckpt's store against a real S3 implementation (not only moto).
#
#   bash scripts/rgw.sh test     install Ceph if missing, start, run the store + CLI suites
#                                against RGW, stop and remove everything (also on failure)
#   bash scripts/rgw.sh start    install if missing and start; prints the endpoint and env to use
#   bash scripts/rgw.sh stop     stop the daemons and remove the cluster directory
#   bash scripts/rgw.sh status   is it up?
#   bash scripts/rgw.sh gc       free deleted objects now (RGW's garbage collector, run to completion):
#                                benchmarks run it between measurements (python -m benchmarks.policy --rgw-reclaim)
#   bash scripts/rgw.sh install  only install the Debian packages
#
# Cluster: one mon, one memstore OSD (data in RAM), radosgw (beast) on 127.0.0.1:$RGW_PORT,
# `auth none`, pool size 1, everything under $RGW_DIR (default: .rgw/ in the repo, git-ignored).
# User: access key and secret `testing`. Needs root (apt-get) unless Ceph is already installed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RGW_DIR="${RGW_DIR:-$REPO/.rgw}"
RGW_PORT="${RGW_PORT:-7480}"
MON_PORT="${RGW_MON_PORT:-6789}"
# Capacity the memstore OSD reports; data lives in RAM, so this is a ceiling, not a reservation.
MEMSTORE_BYTES="${RGW_MEMSTORE_BYTES:-12884901888}"
ENDPOINT="http://127.0.0.1:$RGW_PORT"
PY="${PY:-$REPO/.venv/bin/python}"
CONF="$RGW_DIR/ceph.conf"

log() { echo "rgw.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Run a command as root: directly when we are root, through sudo otherwise (CI runners).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

ceph_installed() {
    command -v radosgw >/dev/null && command -v ceph-mon >/dev/null \
        && command -v ceph-osd >/dev/null && command -v radosgw-admin >/dev/null
}

do_install() {
    if ceph_installed; then return 0; fi
    log "installing Ceph from Debian (radosgw ceph-mon ceph-osd; ~260 MiB, ~40 s)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends radosgw ceph-mon ceph-osd
    ceph_installed || die "Ceph binaries still missing after apt-get install"
}

write_conf() {
    local fsid="$1"
    # $name/$cluster are Ceph metavariables, expanded by Ceph, not by the shell.
    cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = [v1:127.0.0.1:$MON_PORT]
mon initial members = a
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms bind ipv6 = false
ms bind msgr2 = false
run dir = $RGW_DIR/run
admin socket = $RGW_DIR/run/\$name.asok
log file = $RGW_DIR/log/\$name.log
keyring = $RGW_DIR/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0

[mon]
mon data = $RGW_DIR/mon/\$cluster-\$id

[osd]
osd data = $RGW_DIR/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
osd crush update on start = false
osd class update on start = false

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw data = $RGW_DIR/rgw
rgw enable usage log = false
# Deleted objects' data is freed by RGW's garbage collector, by default after 2 hours: the memstore
# OSD would keep every benchmark repeat in RAM. Free it within seconds instead.
rgw gc obj min wait = 0
rgw gc processor period = 10
EOF
}

ceph_cmd() { ceph -c "$CONF" --connect-timeout 10 "$@"; }

# Poll until "$@" succeeds or $1 seconds pass.
wait_for() {
    local timeout="$1" what="$2"; shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${timeout}s waiting for $what (logs: $RGW_DIR/log)"
        sleep 0.5
    done
}

# Run a Ceph daemon in the foreground, as our own background child, and record its pid in
# run/<name>.pid (daemonizing would block on a daemon whose start-up hangs).
spawn() {
    local name="$1"; shift
    "$@" -f </dev/null >>"$RGW_DIR/log/startup.log" 2>&1 &
    echo $! >"$RGW_DIR/run/$name.pid"
}

# Start osd.0; retried because its first contact with the monitor is racy on a loaded machine.
start_osd() {
    local attempt pid deadline
    for attempt in 1 2 3; do
        spawn osd.0 ceph-osd -c "$CONF" -i 0
        pid="$(cat "$RGW_DIR/run/osd.0.pid")"
        deadline=$((SECONDS + 60))
        while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do
            osd_up && return 0
            sleep 0.5
        done
        log "osd.0 did not come up (attempt $attempt; see $RGW_DIR/log/osd.0.log)"
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        sleep 1
    done
    die "osd.0 failed to start 3 times (logs: $RGW_DIR/log)"
}

osd_up() { ceph_cmd osd dump 2>/dev/null | grep -q '^osd.0 up'; }
# True when nothing listens on 127.0.0.1:$1 (SO_REUSEADDR: sockets in TIME_WAIT do not count).
port_free() {
    python3 - "$1" 2>/dev/null <<'PYEOF'
import socket, sys
with socket.socket() as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1])))
PYEOF
}

# Any HTTP answer (even 403) means the gateway serves requests.
rgw_answers() {
    python3 - "$ENDPOINT" <<'PYEOF'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass
PYEOF
}

do_start() {
    do_install
    if [ -f "$CONF" ] && rgw_answers; then log "already running at $ENDPOINT"; print_env; return 0; fi
    [ -e "$RGW_DIR" ] && do_stop
    local port
    for port in "$MON_PORT" "$RGW_PORT"; do
        port_free "$port" || die "port $port on 127.0.0.1 is in use (another cluster?); choose others with RGW_MON_PORT=... RGW_PORT=..."
    done
    local t0=$SECONDS fsid osd_uuid
    mkdir -p "$RGW_DIR"/{run,log,mon,osd/ceph-0,rgw}
    fsid="$("$PY" -c 'import uuid; print(uuid.uuid4())' 2>/dev/null || cat /proc/sys/kernel/random/uuid)"
    osd_uuid="$(cat /proc/sys/kernel/random/uuid)"
    write_conf "$fsid"

    log "starting mon"
    ceph-authtool --create-keyring "$RGW_DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    # Explicit v1 address: on a port other than 6789 monmaptool would assume msgr2, which is off here.
    monmaptool --create --addv a "[v1:127.0.0.1:$MON_PORT]" --fsid "$fsid" "$RGW_DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$RGW_DIR/monmap" --keyring "$RGW_DIR/keyring"
    spawn mon.a ceph-mon -c "$CONF" -i a
    wait_for 30 "the monitor" ceph_cmd mon stat

    log "starting memstore osd"
    ceph_cmd osd new "$osd_uuid" >/dev/null
    # Place the OSD in the CRUSH map from here rather than from the OSD's own start-up commands:
    # under load the OSD can send those before it has the monmap (fsid 0 → "wrong fsid") and exit.
    ceph_cmd osd crush add osd.0 1.0 root=default >/dev/null 2>&1
    ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>>"$RGW_DIR/log/startup.log"
    start_osd

    log "starting radosgw on $ENDPOINT"
    spawn client.rgw.a radosgw -c "$CONF" -n client.rgw.a
    wait_for 90 "radosgw on $ENDPOINT" rgw_answers
    radosgw-admin -c "$CONF" user create --uid=test --display-name="rlckpt test" \
        --access-key=testing --secret=testing >/dev/null
    log "up in $((SECONDS - t0))s at $ENDPOINT"
    print_env
}

print_env() {
    cat <<EOF
export RLCKPT_TEST_S3_ENDPOINT=$ENDPOINT
export RLCKPT_TEST_S3_KEY=testing
export RLCKPT_TEST_S3_SECRET=testing
EOF
}

# Stop the daemons we started (pid files in our own run dir only) and remove the directory.
do_stop() {
    local pidfile pid
    for pidfile in "$RGW_DIR"/run/*.pid; do
        [ -f "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        kill "$pid" 2>/dev/null || true
    done
    for pidfile in "$RGW_DIR"/run/*.pid; do
        [ -f "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$RGW_DIR"
    log "stopped and removed $RGW_DIR"
}

# Run RGW's garbage collector over every deleted object now, not at its next period: a collection that runs
# during a measurement takes the server's CPU (a 1 GiB save swung 3.5-7.9 s; 3.4-3.9 s with this before each).
do_gc() {
    [ -f "$CONF" ] || die "not running (no $CONF)"
    radosgw-admin -c "$CONF" gc process --include-all
}

do_status() {
    if [ -f "$CONF" ] && rgw_answers; then log "up at $ENDPOINT"; else log "not running"; return 1; fi
}

# On exit: stop and remove the cluster unless a `start` completed (so a failed start or any
# `test` run leaves nothing behind).
KEEP_RUNNING=0
cleanup_on_exit() {
    local rc=$?
    [ "$KEEP_RUNNING" = 1 ] || do_stop
    exit "$rc"
}

do_test() {
    local t0=$SECONDS rc=0
    do_start >/dev/null
    # Only the tests that reach S3 run here (tests/conftest.py deselects the rest: `make test` ran them),
    # on two workers as in `make test`.
    log "running the S3 cases of the store and CLI suites against RGW"
    RLCKPT_TEST_S3_ENDPOINT="$ENDPOINT" RLCKPT_TEST_S3_KEY=testing RLCKPT_TEST_S3_SECRET=testing \
        "$PY" -m pytest -n 2 --dist loadgroup tests/store tests/cli "$@" || rc=$?
    log "finished in $((SECONDS - t0))s (pytest exit $rc)"
    return "$rc"
}

cd "$REPO"
case "${1:-}" in
    test) shift; trap cleanup_on_exit EXIT; do_test "$@" ;;
    start) trap cleanup_on_exit EXIT; do_start; KEEP_RUNNING=1 ;;
    stop) do_stop ;;
    status) do_status ;;
    gc) do_gc ;;
    install) do_install ;;
    *) echo "usage: $0 {test [pytest args]|start|stop|status|gc|install}" >&2; exit 2 ;;
esac
