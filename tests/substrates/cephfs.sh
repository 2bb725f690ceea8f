#!/usr/bin/env bash
# A one-host CephFS for the real-substrate tests: 1 mon, 1 mgr, 1 OSD
# (file-backed BlueStore), 1 MDS, one file system, and ceph-fuse clients.
# Every file of the cluster (conf, data, logs, pid files, admin sockets) lives
# under STATE, and every daemon binds 127.0.0.1 only.
#
#   cephfs.sh up STATE         start a cluster; exit 0 once a client can mount it
#   cephfs.sh mount STATE MNT  mount a new ceph-fuse client at MNT
#   cephfs.sh umount MNT       unmount that client
#   cephfs.sh down STATE       unmount every client, stop every daemon, remove STATE
#   cephfs.sh restart-mds STATE SECONDS  kill -9 the MDS, start it again SECONDS later
#
# Environment:
#   KAAS_CEPH_MON_PORT  the mon's msgr2 port (default 3300)
#   KAAS_CEPH_PORTS     the port range the mgr, OSD and MDS bind (default 6800-6899)
#   KAAS_CEPH_MDS_TICK  'mds tick interval' in seconds (default 0.5; Ceph's 5 makes
#                       a second client's open of a just-written file wait up to
#                       5 s, longer than the broker's 3 s lease)
#   KAAS_CEPH_SESSION_TIMEOUT  the file system's session_timeout in seconds
#                       (default 30, Ceph's floor; its 60 keeps the caps of a
#                       client that died — its ceph-fuse killed — for a
#                       minute, and every other client's access to those
#                       files, the brokers' heartbeats among them, waits)
#   KAAS_CEPH_CAP_REVOKE_EVICTION  'mds cap revoke eviction timeout' in
#                       seconds (default 15; Ceph's 0 never evicts a client
#                       that does not answer a cap revoke, so a dead one
#                       blocks the others until its session times out)
#
# Needs ceph-mon, ceph-mgr, ceph-osd, ceph-mds, ceph-fuse, ceph, monmaptool,
# ceph-authtool (Ceph 16 Pacific) and root (FUSE).
set -euo pipefail

# shellcheck source=tests/substrates/common.sh
. "$(dirname "$0")/common.sh"

PROG="cephfs.sh"
MON_PORT="${KAAS_CEPH_MON_PORT:-3300}"
PORTS="${KAAS_CEPH_PORTS:-6800-6899}"
MDS_TICK="${KAAS_CEPH_MDS_TICK:-0.5}"
SESSION_TIMEOUT="${KAAS_CEPH_SESSION_TIMEOUT:-30}"
CAP_REVOKE_EVICTION="${KAAS_CEPH_CAP_REVOKE_EVICTION:-15}"

die() {
    echo "$PROG: $*" >&2
    exit 1
}

usage() {
    die "usage: $PROG up STATE | mount STATE MNT | umount MNT | down STATE | restart-mds STATE SECONDS"
}

# set_state DIR: the paths of the cluster kept in DIR.
MARKER=.kaas-cephfs-state

set_state() {
    [ -n "$1" ] || usage
    STATE="$(abs "$1")"
    STATE="${STATE%/}"
    [ -n "$STATE" ] || die "refusing STATE=/"
    # mountinfo escapes whitespace, so such paths never look mounted.
    [[ "$STATE" != *[[:space:]]* ]] || die "STATE must not contain whitespace: '$STATE'"
    CONF="$STATE/ceph.conf"
    RUN="$STATE/run"
    LOG="$STATE/log"
}

# log_tail FILE...: the last lines of each FILE, to stderr.
log_tail() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "--- tail of $f" >&2
        tail -n 25 "$f" >&2 || true
    done
}

# fail_with WHAT LOGS...: print the logs' tails, then a one-line reason; exit 1.
fail_with() {
    local what="$1"
    shift
    log_tail "$@"
    die "$what (run '$PROG down $STATE' to clean up)"
}

# The ceph CLI against this cluster, bounded: a cluster that is not answering
# would otherwise make it retry for ever.
cephc() {
    timeout 40 ceph -c "$CONF" --connect-timeout 30 "$@" 2>>"$LOG/cli.err"
}

# ours PID: does process PID belong to this cluster (its argv names $CONF)?
# Guards against a stale pid file whose pid was reused by something else.
ours() {
    # $CONF passes through the environment: a grep or awk with it in its own
    # argv would be "ours" too.
    { tr '\0' '\n' < "/proc/$1/cmdline"; } 2>/dev/null |
        C="$CONF" awk '$0 == ENVIRON["C"] { f = 1 } END { exit !f }'
}

# live_pids: the pids of every process of this cluster: daemons, ceph-fuse
# clients and ceph CLI calls (all are started with -c $CONF), minus this shell
# and its ancestors. An exact argv match, never a pattern.
live_pids() {
    local d pid skip=" $$ " p
    p=$$
    while [ "$p" -gt 1 ] 2>/dev/null; do
        skip="$skip$p "
        p="$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)"
        [ -n "$p" ] || break
    done
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        case "$skip" in *" $pid "*) continue ;; esac
        ours "$pid" && echo "$pid"
    done
    return 0
}

# pidfile_pid FILE: the pid FILE names, if that process is one of ours.
# (A stale pid file's pid may since belong to something else.)
pidfile_pid() {
    local pid
    [ -s "$1" ] || return 0
    pid="$(tr -dc '0-9' < "$1")"
    if [ -n "$pid" ] && ours "$pid"; then echo "$pid"; fi
    return 0
}

# alive PID: is PID running? A zombie counts as gone: this machine's init
# may take a while to reap an orphan, and kill -0 succeeds on a zombie.
alive() {
    local st
    st="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# stop_pids WAIT_S PID...: SIGTERM them all at once, wait up to WAIT_S
# seconds for all to go, then SIGKILL whatever is left (all at once: one
# at a time, a stopping MDS alone would take ~8 s).
stop_pids() {
    local wait_s="$1" pid left i
    shift
    [ $# -gt 0 ] || return 0
    STOPPED="${STOPPED:-} $*"
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < wait_s * 10; i++)); do
        left=""
        for pid in "$@"; do
            if alive "$pid"; then left="$left $pid"; fi
        done
        [ -n "$left" ] || return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
}

# start_daemon NAME CMD...: start a Ceph daemon (it forks itself into the
# background and writes $RUN/NAME.pid). Its stdout/stderr go to a file, never
# to ours: a caller reading our output through a pipe would wait for EOF.
start_daemon() {
    local name="$1"
    shift
    "$@" -c "$CONF" </dev/null >>"$LOG/$name.out" 2>&1 ||
        fail_with "$name failed to start" "$LOG/$name.out" "$LOG/$name.log"
    wait_for 30 "$name's pid file" test -s "$RUN/$name.pid" ||
        fail_with "$name wrote no pid file" "$LOG/$name.out" "$LOG/$name.log"
}

write_conf() {
    local fsid="$1" pmin="${PORTS%-*}" pmax="${PORTS#*-}"
    cat > "$CONF" <<EOF
[global]
fsid = $fsid
# msgr2 only: the mon then listens on exactly one port, any port we choose.
mon host = [v2:127.0.0.1:$MON_PORT]
ms bind msgr1 = false
ms bind msgr2 = true
ms bind ipv6 = false
ms bind port min = $pmin
ms bind port max = $pmax
public addr = 127.0.0.1
cluster addr = 127.0.0.1
# No cephx: nothing outside this machine can reach loopback, and clients then
# need no keyring.
auth cluster required = none
auth service required = none
auth client required = none
run dir = $RUN
pid file = $RUN/\$name.pid
# Short socket names (a unix socket path has at most 107 bytes); each
# ceph-fuse has a client name of its own, so its socket is its own too.
admin socket = $RUN/\$name.asok
log file = $LOG/\$name.log
mon cluster log file = $LOG/cluster.log
crash dir = $STATE/crash
keyring = $STATE/keyring
# One OSD: pools of one replica, placement across OSDs rather than hosts.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# Meaningless without cephx; they would hold the cluster at HEALTH_WARN.
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
# The mon's store sits on the root disk: only stop when it is really full.
mon data avail warn = 2
mon data avail crit = 1

[client.admin]
# The ceph CLI: no admin socket (concurrent calls would share one name).
admin socket =

[mon]
mon data = $STATE/mon/\$id

[mon.a]
public addrv = [v2:127.0.0.1:$MON_PORT]

[mgr]
mgr data = $STATE/mgr/\$id

[osd]
osd data = $STATE/osd/\$id
osd objectstore = bluestore
# BlueStore on a sparse file, osd data/block (the default when 'bluestore
# block path' is unset; setting it to that same path makes a symlink loop):
# 8 GiB apparent, a few hundred MiB used.
bluestore block create = true
bluestore block size = 8589934592
bluestore fsck on mkfs = false
# Keep the OSD small (its defaults target 4 GiB of RAM): a fixed 64 MiB
# BlueStore cache, and the lowest memory target Ceph takes (896 MiB; a lower
# value is dropped without a word and the 4 GiB default stays).
osd memory target = 939524096
bluestore cache autotune = false
bluestore cache size = 67108864
osd op num shards = 2
osd op num threads per shard = 1

[mds]
mds data = $STATE/mds/\$id
mds tick interval = $MDS_TICK
mds cap revoke eviction timeout = $CAP_REVOKE_EVICTION
mds cache memory limit = 134217728
EOF
}

cmd_up() {
    set_state "${1:-}"
    local pid f fsid osd_uuid osd_id
    command -v ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph monmaptool ceph-authtool uuidgen \
        >/dev/null 2>&1 || die "Ceph is not installed (need ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph monmaptool ceph-authtool uuidgen)"
    [[ "$PORTS" =~ ^[0-9]+-[0-9]+$ ]] || die "KAAS_CEPH_PORTS must be MIN-MAX, not '$PORTS'"
    [[ "$MON_PORT" =~ ^[0-9]+$ ]] || die "KAAS_CEPH_MON_PORT must be a port number, not '$MON_PORT'"
    # Another cluster's mon on our port would answer our CLI calls (no auth).
    if timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$MON_PORT" 2>/dev/null; then
        die "port $MON_PORT is taken (another Ceph mon?); set KAAS_CEPH_MON_PORT"
    fi
    for f in "$RUN"/*.pid; do
        pid="$(pidfile_pid "$f")"
        [ -z "$pid" ] || die "$STATE already holds a running cluster ($(basename "$f" .pid) is pid $pid)"
    done
    [ ! -e "$CONF" ] || die "$STATE already holds a cluster (stopped); run '$PROG down $STATE' first"
    if [ -d "$STATE" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
        die "$STATE is not empty; give a new or empty directory"
    fi
    # Not fatal: the daemons then run without admin sockets (they log it).
    [ $((${#RUN} + 24)) -le 107 ] ||
        echo "$PROG: note: $RUN is too long for admin sockets (107-byte limit); daemons run without them" >&2

    mkdir -p "$STATE"
    # 'down' removes only a directory that carries this marker.
    : >"$STATE/$MARKER"
    mkdir -p "$RUN" "$LOG" "$STATE/mon/a" "$STATE/mgr/x" "$STATE/mds/a" "$STATE/crash"
    fsid="$(uuidgen)"
    write_conf "$fsid"

    # The mon keyring is needed by --mkfs even without cephx.
    ceph-authtool --create-keyring "$STATE/keyring" --gen-key -n mon. --cap mon 'allow *' \
        >>"$LOG/bootstrap.out" 2>&1 || fail_with "ceph-authtool failed" "$LOG/bootstrap.out"
    monmaptool --create --addv a "[v2:127.0.0.1:$MON_PORT]" --fsid "$fsid" "$STATE/monmap" \
        >>"$LOG/bootstrap.out" 2>&1 || fail_with "monmaptool failed" "$LOG/bootstrap.out"
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$STATE/monmap" --keyring "$STATE/keyring" \
        </dev/null >>"$LOG/bootstrap.out" 2>&1 || fail_with "ceph-mon --mkfs failed" "$LOG/bootstrap.out" "$LOG/mon.a.log"

    start_daemon mon.a ceph-mon -i a
    wait_for 60 "the mon to form a quorum" cephc mon stat ||
        fail_with "the mon did not come up on 127.0.0.1:$MON_PORT" "$LOG/mon.a.out" "$LOG/mon.a.log" "$LOG/cli.err"

    # The mgr serves the PG map: without it statfs on a client reports nothing.
    start_daemon mgr.x ceph-mgr -i x

    osd_uuid="$(uuidgen)"
    osd_id="$(cephc osd new "$osd_uuid")" || fail_with "'ceph osd new' failed" "$LOG/cli.err"
    [[ "$osd_id" =~ ^[0-9]+$ ]] || fail_with "'ceph osd new' answered '$osd_id'" "$LOG/cli.err"
    mkdir -p "$STATE/osd/$osd_id"
    ceph-osd -c "$CONF" -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" \
        </dev/null >>"$LOG/bootstrap.out" 2>&1 ||
        fail_with "ceph-osd --mkfs failed" "$LOG/bootstrap.out" "$LOG/osd.$osd_id.log"
    start_daemon "osd.$osd_id" ceph-osd -i "$osd_id"
    wait_for 120 "osd.$osd_id to be up" osd_up ||
        fail_with "osd.$osd_id did not come up" "$LOG/osd.$osd_id.out" "$LOG/osd.$osd_id.log"

    # Small pools (8 PGs each): one OSD, a test's worth of data.
    if ! { cephc osd pool create cephfs_metadata 8 8 >/dev/null &&
        cephc osd pool create cephfs_data 8 8 >/dev/null &&
        cephc fs new cephfs cephfs_metadata cephfs_data >/dev/null &&
        cephc fs set cephfs session_timeout "$SESSION_TIMEOUT" >/dev/null; }; then
        fail_with "creating the file system failed" "$LOG/cli.err"
    fi

    start_daemon mds.a ceph-mds -i a
    wait_for 120 "the MDS to be up:active" mds_active ||
        fail_with "the MDS did not become active" "$LOG/mds.a.out" "$LOG/mds.a.log" "$LOG/cli.err"
    wait_for 60 "the mgr to be available" mgr_available ||
        fail_with "the mgr did not become available" "$LOG/mgr.x.out" "$LOG/mgr.x.log"
}

osd_up() {
    cephc osd stat | grep -q ' 1 up'
}

mds_active() {
    cephc mds stat | grep -q 'up:active'
}

mgr_available() {
    cephc mgr stat | grep -q '"available": true'
}

cmd_mount() {
    set_state "${1:-}"
    [ -n "${2:-}" ] || usage
    local mnt cid n probe
    mnt="$(abs "$2")"
    mnt="${mnt%/}"
    [ -s "$CONF" ] || die "no cluster in $STATE (run '$PROG up $STATE' first)"
    [ -n "$(pidfile_pid "$RUN/mds.a.pid")" ] || die "the cluster in $STATE is not running (no live MDS)"
    mkdir -p "$mnt" || die "cannot create $mnt"
    ! is_mounted "$mnt" || die "$mnt is already a mount point"

    # Each mount is its own client (client.fuseN): its own pid file and admin
    # socket, and a session of its own at the MDS. N comes from a counter
    # under a lock so that concurrent mounts never share a name. The mount is
    # recorded before it starts so that 'down' unmounts even a half-made one.
    {
        flock 9
        n="$(cat "$STATE/clients" 2>/dev/null || echo 0)"
        n=$((n + 1))
        echo "$n" > "$STATE/clients"
        echo "$mnt" >> "$STATE/mounts"
    } 9>>"$STATE/mounts.lock"
    cid="fuse$n"

    # ceph-fuse forks into the background once the mount is made; the parent's
    # exit status says whether it was. -r / mounts the root of the file system.
    timeout 60 ceph-fuse -c "$CONF" --id "$cid" -r / "$mnt" \
        </dev/null >>"$LOG/client.$cid.out" 2>&1 ||
        fail_with "ceph-fuse (client.$cid) failed to mount $mnt" "$LOG/client.$cid.out" "$LOG/client.$cid.log"
    wait_for 30 "$mnt to be mounted" is_mounted "$mnt" ||
        fail_with "$mnt is not a mount point after ceph-fuse" "$LOG/client.$cid.out" "$LOG/client.$cid.log"

    # A write and a read through the mount, bounded: a hung FUSE call would
    # otherwise block for minutes.
    probe="$mnt/.cephfs-probe.$cid"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 30 bash -c 'printf "%s" "$2" > "$1" && [ "$(cat "$1")" = "$2" ] && rm -f "$1"' \
        _ "$probe" "$cid" >>"$LOG/client.$cid.out" 2>&1 ||
        fail_with "a write and read through $mnt failed" "$LOG/client.$cid.out" "$LOG/client.$cid.log"
}

# fuse_pids MNT: the pids of the ceph-fuse processes serving MNT (their argv
# is "ceph-fuse ... MNT").
fuse_pids() {
    local d
    for d in /proc/[0-9]*; do
        { tr '\0' '\n' < "$d/cmdline"; } 2>/dev/null | awk -v m="$1" '
            NR == 1 { fuse = ($0 ~ /(^|\/)ceph-fuse$/) }
            $0 == m { hit = 1 }
            END { exit !(fuse && hit) }' && echo "${d#/proc/}"
    done
    return 0
}

cmd_umount() {
    [ -n "${1:-}" ] || usage
    local mnt pids
    mnt="$(abs "$1")"
    mnt="${mnt%/}"
    pids="$(fuse_pids "$mnt")"
    umount_one "$mnt" || die "cannot unmount $mnt"
    # Once unmounted, ceph-fuse closes its MDS session and leaves on its own
    # (~2 s); make sure it does.
    # shellcheck disable=SC2086
    stop_pids 10 $pids
}

cmd_down() {
    set_state "${1:-}"
    local mnt f pids pid left i failed=0
    [ -e "$STATE" ] || return 0
    # Ours: the marker, or (a state from before the marker) our ceph.conf.
    if [ ! -f "$STATE/$MARKER" ] && ! grep -qs "^mds tick interval" "$CONF" &&
        [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
        die "$STATE is not a cephfs.sh state directory (no $MARKER); not removing it"
    fi

    # Clients first, while the MDS is still there to close their sessions;
    # a client whose ceph-fuse died leaves a dead mount that umount_one clears.
    pids=""
    if [ -f "$STATE/mounts" ]; then
        while IFS= read -r mnt; do
            [ -n "$mnt" ] || continue
            pids="$pids $(fuse_pids "$mnt")"
            umount_one "$mnt" || { echo "$PROG: cannot unmount $mnt" >&2; failed=1; }
        done < "$STATE/mounts"
    fi
    for f in "$RUN"/client.*.pid; do
        pids="$pids $(pidfile_pid "$f")"
    done
    # shellcheck disable=SC2086
    stop_pids 5 $pids
    # Then every daemon at once, with a short grace: the data goes anyway (a
    # stopping MDS takes ~8 s, the others 2-3 s).
    pids=""
    for f in "$RUN"/*.pid; do
        pids="$pids $(pidfile_pid "$f")"
    done
    # shellcheck disable=SC2086
    stop_pids 3 $pids
    # Whatever has no pid file (a daemon killed before it wrote one, a hung
    # ceph CLI call of a failed 'up'): every process whose argv names our conf.
    # shellcheck disable=SC2046
    stop_pids 5 $(live_pids)
    sleep 0.1
    pids="$(live_pids)"
    [ -z "$pids" ] || { echo "$PROG: processes of $STATE survive SIGKILL: ${pids//$'\n'/ }" >&2; failed=1; }
    # The stopped daemons are orphans that this machine's init may reap a few
    # seconds late: wait a little for their zombies too, so that nothing of
    # the cluster shows in ps after 'down' (a zombie holds no resources).
    for ((i = 0; i < 50; i++)); do
        left=""
        for pid in ${STOPPED:-}; do
            if [ -e "/proc/$pid" ]; then left=1; break; fi
        done
        [ -n "$left" ] || break
        sleep 0.1
    done
    # A mount point inside STATE would have its contents removed with it.
    while IFS= read -r mnt; do
        umount_one "$mnt" || die "cannot unmount $mnt inside $STATE; not removing it"
    done < <(awk -v s="$STATE/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo)
    # --one-file-system: never descend into a mount we failed to remove.
    rm -rf --one-file-system "$STATE" || die "cannot remove $STATE"
    [ "$failed" = 0 ] || die "down left something behind (see above)"
}

# restart-mds STATE SECONDS: kill -9 the only MDS (every client's metadata
# calls wait meanwhile), wait SECONDS, start it again and return once it is
# up:active (it replays its journal; clients reconnect to it).
cmd_restart_mds() {
    set_state "$1"
    local pid
    pid="$(pidfile_pid "$RUN/mds.a.pid")"
    [ -n "$pid" ] || die "no MDS of $STATE running"
    kill -9 "$pid"
    wait_for 30 "the MDS to exit" bash -c '! kill -0 "$1" 2>/dev/null' _ "$pid" ||
        die "the MDS ($pid) did not exit after kill -9"
    rm -f "$RUN/mds.a.pid"
    sleep "$2"
    start_daemon mds.a ceph-mds -i a
    wait_for 120 "the MDS to be up:active" mds_active ||
        fail_with "the MDS did not become active again" "$LOG/mds.a.out" "$LOG/mds.a.log"
}

case "${1:-}" in
    up) [ $# -eq 2 ] || usage; cmd_up "$2" ;;
    restart-mds) [ $# -eq 3 ] || usage; cmd_restart_mds "$2" "$3" ;;
    mount) [ $# -eq 3 ] || usage; cmd_mount "$2" "$3" ;;
    umount) [ $# -eq 2 ] || usage; cmd_umount "$2" ;;
    down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
    *) usage ;;
esac
