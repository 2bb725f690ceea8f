#!/usr/bin/env bash
# A throw-away one-brick GlusterFS volume ("kaas") on loopback, for the
# real-substrate tests. Everything GlusterFS lets us relocate lives under STATE.
#
#   glusterfs.sh up STATE         start glusterd + volume kaas; exit 0 once a client can mount it
#   glusterfs.sh mount STATE MNT  mount a new, independent FUSE client at MNT
#   glusterfs.sh umount MNT       unmount that client for sure
#   glusterfs.sh down STATE       stop everything, remove STATE and what GlusterFS left outside it
#   glusterfs.sh restart-brick STATE SECONDS  kill -9 the brick, start it again SECONDS later
#
# Environment:
#   KAAS_GLUSTER_BRICK_HOST   host name for the brick (default: `hostname` when it
#                             resolves to one 127.0.0.0/8 address, else 127.0.0.2). It
#                             must resolve (IPv4) to one address in 127.0.0.0/8;
#                             GlusterFS refuses the literals localhost and 127.0.0.1.
#   KAAS_GLUSTER_BRICK_PORTS  brick port range LOW-HIGH (default 49152-49251)
#   KAAS_GLUSTER_WAIT         seconds allowed for each readiness step (default 60)
#
# Layout of STATE: glusterd.vol, lib/ (glusterd working dir), run/ (pid files,
# glusterd.socket), log/ (glusterd, cli, bricks/, clients), bricks/kaas (the
# brick), mounts (one client mount point per line).
#
# Requires root, /dev/fuse, glusterd/glusterfs/gluster (GlusterFS 10). Run as a
# script (not sourced).
set -euo pipefail

. "$(dirname "$0")/common.sh"

VOL=kaas
MGMT_PORT=24007 # bricks always fetch their volfile from <brick host>:24007
WAIT="${KAAS_GLUSTER_WAIT:-60}"
MARKER=.kaas-glusterfs-state

die() {
    echo "glusterfs.sh: $*" >&2
    exit 1
}

usage() {
    die "usage: glusterfs.sh up STATE | mount STATE MNT | umount MNT | down STATE | restart-brick STATE SECONDS"
}

need_tools() {
    local t
    for t in glusterd glusterfs gluster getent; do
        command -v "$t" >/dev/null 2>&1 || die "$t not found in PATH (install glusterfs-server/glusterfs-client)"
    done
}

# State-dir sanity: refuse empty / root paths before anything touches them.
state_dir() {
    local st
    [ -n "${1:-}" ] || usage
    st="$(abs "$1")"
    st="${st%/}"
    [ -n "$st" ] && [ "$st" != "/" ] || die "refusing STATE '$1'"
    # Paths go into glusterd.vol and /proc/self/mountinfo matching unquoted.
    [[ ! "$st" =~ [[:space:]] ]] || die "STATE must not contain whitespace: '$st'"
    printf '%s\n' "$st"
}

# gluster CLI against our glusterd only (its unix socket), non-interactive,
# logging under STATE instead of /var/log/glusterfs/cli.log.
gcli() {
    local st="$1"
    shift
    timeout 60 gluster --mode=script --glusterd-sock="$st/run/glusterd.socket" \
        --log-file="$st/log/cli.log" "$@"
}

# gcli_ok STATE WHAT ARGS...: run a gluster command; on failure die with its
# own message folded into the one-line reason.
gcli_ok() {
    local st="$1" what="$2" out
    shift 2
    if ! out="$(gcli "$st" "$@" 2>&1)"; then
        out="$(printf '%s' "$out" | tr -s '\n' ' ')"
        die "$what failed: ${out:-no output} (see $st/log/glusterd.log)"
    fi
}

# ---------------------------------------------------------------- processes

# is_gluster_pid PID: PID is a live (non-zombie) glusterd/glusterfsd/glusterfs.
is_gluster_pid() {
    local pid="$1" comm stat
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
    case "$comm" in glusterd | glusterfsd | glusterfs) ;; *) return 1 ;; esac
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}

# stop_pid PID: SIGTERM, wait up to 10 s, SIGKILL, wait up to 5 s. Zombies count
# as gone (they are reaped by init; there is nothing more to kill).
STOPPED=()
stop_pid() {
    local pid="$1" i
    is_gluster_pid "$pid" || return 0
    STOPPED+=("$pid")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        is_gluster_pid "$pid" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        is_gluster_pid "$pid" || return 0
        sleep 0.1
    done
    return 1
}

# pid_from FILE: the pid FILE holds, if it names a live gluster process.
# (Pid files outlive their processes; never signal a recycled pid.)
pid_from() {
    local pid
    [ -s "$1" ] || return 1
    pid="$(tr -dc '0-9' <"$1")"
    is_gluster_pid "$pid" || return 1
    printf '%s\n' "$pid"
}

# state_pids STATE: every gluster daemon whose command line names a path under
# STATE (glusterd -f STATE/..., bricks -p STATE/..., clients --pid-file=STATE/...).
# Matched on exact argument prefixes, never on our own shell.
state_pids() {
    local st="$1" d pid
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [ "$pid" != "$$" ] || continue
        is_gluster_pid "$pid" || continue
        if tr '\0' '\n' <"$d/cmdline" 2>/dev/null |
            awk -v p="$st/" 'index($0, p) == 1 || index($0, "=" p) > 0 { f = 1 } END { exit !f }'; then
            printf '%s\n' "$pid"
        fi
    done
}

# client_pids MNT: FUSE client daemons whose last argument is exactly MNT.
client_pids() {
    local mnt="$1" d pid last
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [ "$pid" != "$$" ] || continue
        [ "$(cat "$d/comm" 2>/dev/null)" = glusterfs ] || continue
        is_gluster_pid "$pid" || continue
        last="$(tr '\0' '\n' <"$d/cmdline" 2>/dev/null | tail -n 1)" || continue
        [ "$last" = "$mnt" ] && printf '%s\n' "$pid"
    done
    return 0
}

# ------------------------------------------------------------------ network

# tcp_open IP PORT: something accepts connections there.
tcp_open() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# resolve_brick_host: sets BRICK_HOST and BRICK_IP (the address glusterd binds).
resolve_brick_host() {
    local addrs n
    BRICK_HOST="${KAAS_GLUSTER_BRICK_HOST:-$(hostname)}"
    # Without an explicit host, a hostname that does not resolve to one
    # loopback address (a CI machine's may not) gives way to 127.0.0.2:
    # GlusterFS refuses only the literals localhost and 127.0.0.1.
    if [ -z "${KAAS_GLUSTER_BRICK_HOST:-}" ]; then
        addrs="$(getent ahostsv4 "$BRICK_HOST" 2>/dev/null | awk '{ print $1 }' | awk '!seen[$0]++')" || true
        if [ "$(printf '%s\n' "$addrs" | grep -c .)" -ne 1 ] || [[ ! "$addrs" =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
            BRICK_HOST=127.0.0.2
        fi
    fi
    [ -n "$BRICK_HOST" ] || die "empty host name; set KAAS_GLUSTER_BRICK_HOST to a name resolving to 127.x.x.x"
    case "$BRICK_HOST" in
        localhost | 127.0.0.1 | 0.*)
            die "GlusterFS refuses '$BRICK_HOST' as a brick host; set KAAS_GLUSTER_BRICK_HOST to another name resolving to 127.x.x.x" ;;
    esac
    addrs="$(getent ahostsv4 "$BRICK_HOST" 2>/dev/null | awk '{ print $1 }' | awk '!seen[$0]++')" || true
    [ -n "$addrs" ] || die "brick host '$BRICK_HOST' does not resolve; set KAAS_GLUSTER_BRICK_HOST to a name resolving to 127.x.x.x"
    n="$(printf '%s\n' "$addrs" | wc -l)"
    BRICK_IP="$(printf '%s\n' "$addrs" | head -n 1)"
    # The brick fetches its volfile from <host>:24007 and clients reach the
    # brick by <host>: glusterd must listen on exactly the address the host
    # resolves to, so it must be a single loopback address.
    if [ "$n" -ne 1 ] || [[ ! "$BRICK_IP" =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
        die "brick host '$BRICK_HOST' resolves to '$(printf '%s' "$addrs" | tr '\n' ' ')'; need exactly one 127.0.0.0/8 address; set KAAS_GLUSTER_BRICK_HOST"
    fi
}

# parse_ports: sets PORT_LO and PORT_HI from KAAS_GLUSTER_BRICK_PORTS.
parse_ports() {
    local spec="${KAAS_GLUSTER_BRICK_PORTS:-49152-49251}"
    [[ "$spec" =~ ^([0-9]{1,5})-([0-9]{1,5})$ ]] ||
        die "KAAS_GLUSTER_BRICK_PORTS='$spec' is not LOW-HIGH"
    PORT_LO=$((10#${BASH_REMATCH[1]}))
    PORT_HI=$((10#${BASH_REMATCH[2]}))
    if [ "$PORT_LO" -lt 1024 ] || [ "$PORT_HI" -gt 65535 ] || [ "$PORT_LO" -gt "$PORT_HI" ] ||
        { [ "$PORT_LO" -le "$MGMT_PORT" ] && [ "$PORT_HI" -ge "$MGMT_PORT" ]; }; then
        die "KAAS_GLUSTER_BRICK_PORTS='$spec' must be LOW-HIGH within 1024-65535, LOW<=HIGH, not covering $MGMT_PORT"
    fi
}

# ------------------------------------------------------------------- client

# start_client STATE MNT PIDFILE LOGFILE VOLFILE_SERVER: run one FUSE client,
# wait for the mount and a write+read through it. On failure: stop it, die.
start_client() {
    local st="$1" mnt="$2" pf="$3" log="$4" server="$5" pid="" deadline probe token
    # Keep the kernel from caching anything across clients: no attribute/entry/
    # negative caching, and fopen-keep-cache=off so every open() drops the page
    # cache (without it another client's in-place rewrite reads back stale).
    glusterfs --volfile-server="$server" --volfile-server-port="$MGMT_PORT" \
        --volfile-id="$VOL" \
        --attribute-timeout=0 --entry-timeout=0 --negative-timeout=0 \
        --fopen-keep-cache=off \
        --pid-file="$pf" --log-file="$log" "$mnt" ||
        die "glusterfs client for $mnt failed to start (see $log)"
    # glusterfs daemonizes before mounting; watch for the mount, and bail out
    # early if the daemon dies (e.g. volfile fetch failed).
    deadline=$((SECONDS + WAIT))
    until is_mounted "$mnt"; do
        pid="$(pid_from "$pf")" || pid=""
        if [ "$SECONDS" -ge "$deadline" ] || { [ -z "$pid" ] && [ "$SECONDS" -ge $((deadline - WAIT + 5)) ]; }; then
            [ -n "$pid" ] && stop_pid "$pid"
            umount_one "$mnt" || true
            die "client for $mnt did not mount within ${WAIT}s (see $log)"
        fi
        sleep 0.2
    done
    probe="$mnt/.kaas-mount-probe.$$.$RANDOM"
    token="probe-$$-$RANDOM"
    # shellcheck disable=SC2016 # expanded by the inner bash
    if ! timeout 30 bash -c 'printf %s "$1" >"$2" && [ "$(cat "$2")" = "$1" ] && rm -f "$2"' \
        _ "$token" "$probe" 2>/dev/null; then
        umount_one "$mnt" || true
        pid="$(pid_from "$pf")" && stop_pid "$pid"
        die "write+read through $mnt failed (see $log)"
    fi
}

# stop_client MNT: unmount and make sure its daemon is gone.
stop_client() {
    local mnt="$1" pid pids ok=0
    pids="$(client_pids "$mnt")"
    # shellcheck disable=SC2206 # pids are digits only
    STOPPED+=($pids)
    umount_one "$mnt" || ok=1
    # The daemon exits by itself once unmounted; make sure of it.
    for pid in $pids; do stop_pid "$pid" || ok=1; done
    # A dead daemon can leave "Transport endpoint is not connected" behind.
    umount_one "$mnt" || ok=1
    return "$ok"
}

# ------------------------------------------------------------------ commands

cmd_up() {
    local st bind pid pf deadline
    st="$(state_dir "${1:-}")"
    need_tools
    [ -e /dev/fuse ] || die "/dev/fuse missing (FUSE needed for clients)"
    resolve_brick_host
    parse_ports
    bind="$BRICK_IP"

    if pid="$(pid_from "$st/run/glusterd.pid")" || [ -n "$(state_pids "$st")" ]; then
        die "$st already holds a running volume (glusterd pid ${pid:-?}); run 'glusterfs.sh down $st' first"
    fi
    if [ -d "$st" ] && [ -n "$(ls -A "$st")" ]; then
        die "$st is not empty (leftovers of an earlier run?); run 'glusterfs.sh down $st' first"
    fi
    # sun_path holds 107 bytes.
    [ "${#st}" -le 80 ] || die "STATE path too long for glusterd's unix socket (${#st} > 80 chars): $st"
    if tcp_open "$bind" "$MGMT_PORT" || tcp_open 127.0.0.1 "$MGMT_PORT"; then
        die "port $MGMT_PORT is taken (another glusterd?); GlusterFS bricks need it for glusterd"
    fi

    mkdir -p "$st"
    : >"$st/$MARKER"
    mkdir -p "$st/lib" "$st/run" "$st/log" "$st/bricks"
    : >"$st/mounts"
    # run-directory / logging-directory / glusterd-sockfile keep pid files,
    # brick logs and the CLI socket out of /var/run and /var/log. The
    # bind-address is also passed to every brick it spawns.
    cat >"$st/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $st/lib
    option run-directory $st/run
    option logging-directory $st/log
    option glusterd-sockfile $st/run/glusterd.socket
    option transport-type socket
    option transport.address-family inet
    option transport.socket.bind-address $bind
    option transport.socket.listen-port $MGMT_PORT
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option base-port $PORT_LO
    option max-port $PORT_HI
end-volume
EOF

    # If anything below fails, stop what we started (the STATE logs stay for
    # a look; 'down' removes them).
    UP_STATE="$st"
    trap up_failed EXIT

    # glusterd daemonizes itself and writes the pid file.
    glusterd -f "$st/glusterd.vol" -p "$st/run/glusterd.pid" -l "$st/log/glusterd.log" ||
        die "glusterd failed to start (see $st/log/glusterd.log)"
    # Ready = listening on bind:24007 and answering the CLI. Give up early if
    # glusterd has exited (e.g. could not bind).
    deadline=$((SECONDS + WAIT))
    until tcp_open "$bind" "$MGMT_PORT" && gcli "$st" volume list >/dev/null 2>&1; do
        if ! pid_from "$st/run/glusterd.pid" >/dev/null && [ "$SECONDS" -ge $((deadline - WAIT + 5)) ]; then
            die "glusterd exited during start-up (see $st/log/glusterd.log)"
        fi
        [ "$SECONDS" -lt "$deadline" ] ||
            die "glusterd did not come up on $bind:$MGMT_PORT and $st/run/glusterd.socket within ${WAIT}s (see $st/log/glusterd.log)"
        sleep 0.2
    done

    # The brick sits on the root filesystem: 'force' is required.
    gcli_ok "$st" "volume create" volume create "$VOL" "$BRICK_HOST:$st/bricks/$VOL" force
    # Coherence across clients (close-to-open): no client-side caching
    # translators. Set before start so clients only ever see this graph.
    local opt
    for opt in performance.stat-prefetch performance.quick-read performance.io-cache \
        performance.read-ahead performance.open-behind performance.readdir-ahead \
        performance.flush-behind performance.write-behind; do
        gcli_ok "$st" "volume set $opt off" volume set "$VOL" "$opt" off
    done
    gcli_ok "$st" "volume start" volume start "$VOL"
    # (wait_for's own message is dropped: one line per failure, ours.)
    wait_for "$WAIT" "brick online" brick_online "$st" 2>/dev/null ||
        die "brick not online within ${WAIT}s (see $st/log/bricks/)"

    # Prove a client can mount it (a throw-away client under STATE).
    mkdir -p "$st/probe-mnt"
    pf="$st/run/client-probe.pid"
    start_client "$st" "$st/probe-mnt" "$pf" "$st/log/client-probe.log" "$bind"
    stop_client "$st/probe-mnt" || die "could not unmount the probe client at $st/probe-mnt"
    rmdir "$st/probe-mnt" 2>/dev/null || true
    wait_reaped
    # Remember where clients find the volfile (the address glusterd is bound to).
    printf '%s\n' "$bind" >"$st/volfile-server"
    trap - EXIT
}

# EXIT trap of `up`: on failure stop whatever it had started.
up_failed() {
    local rc=$?
    [ "$rc" -eq 0 ] || stop_all "$UP_STATE" >/dev/null 2>&1 || true
}

# brick_online STATE: `volume status` shows every brick of the volume online
# with a TCP port. (XML, because the text table wraps long brick paths.)
brick_online() {
    gcli "$1" volume status "$VOL" --xml 2>/dev/null | awk '
        /<node>/ { in_node = 1; n++; up = 0; port = 0 }
        in_node && /<status>1<\/status>/ { up = 1 }
        in_node && /<port>[0-9]+<\/port>/ { gsub(/[^0-9]/, ""); port = ($0 + 0 > 0) }
        /<\/node>/ { in_node = 0; if (up && port) y++ }
        END { exit !(n > 0 && n == y) }'
}

cmd_mount() {
    local st mnt n pf server
    st="$(state_dir "${1:-}")"
    [ -n "${2:-}" ] || usage
    mnt="$(abs "$2")"
    mnt="${mnt%/}"
    [[ ! "$mnt" =~ [[:space:]] ]] || die "MNT must not contain whitespace: '$mnt'"
    need_tools
    [ -f "$st/$MARKER" ] || die "$st is not a glusterfs.sh state directory (run 'up' first)"
    pid_from "$st/run/glusterd.pid" >/dev/null || die "glusterd for $st is not running"
    server="$(cat "$st/volfile-server" 2>/dev/null)" || die "$st has no complete volume ('up' did not finish)"
    is_mounted "$mnt" && die "$mnt is already a mount point"
    mkdir -p "$mnt" 2>/dev/null || die "cannot create mount point $mnt"
    # Reserve a fresh client number atomically (noclobber create of its pid file).
    [ -d "$st/run" ] && [ -w "$st/run" ] || die "$st/run is missing or not writable"
    n=1
    until (set -C && : >"$st/run/client-$n.pid") 2>/dev/null; do
        n=$((n + 1))
        [ "$n" -le 1000 ] || die "cannot reserve a client pid file in $st/run"
    done
    pf="$st/run/client-$n.pid"
    # Record it before the client exists so that 'down' unmounts it even if
    # this call fails half-way.
    grep -qxF -- "$mnt" "$st/mounts" 2>/dev/null || printf '%s\n' "$mnt" >>"$st/mounts"
    start_client "$st" "$mnt" "$pf" "$st/log/client-$n.log" "$server"
}

cmd_umount() {
    local mnt
    [ -n "${1:-}" ] || usage
    mnt="$(abs "$1")"
    mnt="${mnt%/}"
    stop_client "$mnt" || die "could not unmount $mnt"
    wait_reaped
}

# brick_sockets STATE: the brick unix sockets glusterd placed in /var/run/gluster
# (not relocatable: GLUSTERD_SOCK_DIR is compiled in). Taken from live brick
# command lines and from the brick logs (which record the command line).
brick_sockets() {
    local st="$1" pid
    {
        for pid in $(state_pids "$st"); do
            [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = glusterfsd ] || continue
            tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | awk 'prev == "-S" { print } { prev = $0 }'
        done
        cat "$st"/log/bricks/*.log 2>/dev/null | grep -o -- ' -S [^ ]*\.socket' | awk '{ print $2 }'
    } | grep -E '^(/var)?/run/gluster/[0-9a-f]+\.socket$' | sort -u || true
}

# stop_all STATE: unmount recorded clients, stop every daemon of STATE, remove
# the brick sockets outside STATE. Returns non-zero if something survived.
stop_all() {
    local st="$1" mnt pid f socks ok=0
    socks="$(brick_sockets "$st")"
    if [ -f "$st/mounts" ]; then
        while IFS= read -r mnt; do
            [ -n "$mnt" ] || continue
            stop_client "$mnt" || ok=1
        done <"$st/mounts"
    fi
    [ -d "$st/probe-mnt" ] && { stop_client "$st/probe-mnt" || ok=1; }
    # Clients, then glusterd (so it cannot respawn anything), then bricks.
    for f in "$st"/run/client-*.pid "$st/run/glusterd.pid" "$st"/run/vols/*/*.pid; do
        [ -e "$f" ] || continue
        pid="$(pid_from "$f")" || continue
        stop_pid "$pid" || ok=1
    done
    # Anything else started for STATE (pid file never written, etc.).
    for pid in $(state_pids "$st"); do stop_pid "$pid" || ok=1; done
    for f in $socks; do rm -f "$f"; done
    [ -z "$(state_pids "$st")" ] || ok=1
    wait_reaped
    return "$ok"
}

# wait_reaped: give init a moment (up to 5 s) to reap the daemons we stopped,
# so no <defunct> gluster entry lingers in `ps` right after we return. They are
# not our children: we cannot reap them ourselves.
wait_reaped() {
    local pid i
    for ((i = 0; i < 50; i++)); do
        for pid in "${STOPPED[@]}"; do
            [ -d "/proc/$pid" ] && break
            pid=""
        done
        [ -z "${pid:-}" ] && return 0
        sleep 0.1
    done
    return 0
}

cmd_down() {
    local st exp mnt leftover=""
    st="$(state_dir "${1:-}")"
    if [ -d "$st" ] && [ ! -f "$st/$MARKER" ] && [ -n "$(ls -A "$st")" ]; then
        die "$st does not look like a glusterfs.sh state directory; not removing it"
    fi
    stop_all "$st" || die "could not stop every GlusterFS process or client of $st"
    # Brick log: we relocate it under STATE, but an older glusterd.vol (or a
    # daemon ignoring logging-directory) would use /var/log/glusterfs/bricks/.
    exp="$st/bricks/$VOL"
    exp="${exp#/}"
    rm -f "/var/log/glusterfs/bricks/${exp//\//-}.log"
    # Last word on mounts: nothing under STATE, nothing recorded, stays mounted.
    while read -r mnt; do
        case "$mnt" in "$st" | "$st"/*) umount_one "$mnt" || leftover="$mnt" ;; esac
    done < <(awk '{ print $5 }' /proc/self/mountinfo)
    [ -z "$leftover" ] || die "$leftover is still mounted"
    rm -rf -- "$st" || die "could not remove $st"
}

# restart-brick STATE SECONDS: kill -9 the brick daemon (the volume's only
# brick: every client's calls fail meanwhile), wait SECONDS, start it again
# ('volume start force') and return once it is online.
cmd_restart_brick() {
    local st pid killed=0
    st="$(cd "$1" && pwd)" || die "no state directory $1"
    for pid in $(state_pids "$st"); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = glusterfsd ] || continue
        kill -9 "$pid" && killed=1
    done
    [ "$killed" = 1 ] || die "no brick daemon of $st found"
    sleep "$2"
    gcli_ok "$st" "volume start force" volume start "$VOL" force
    wait_for "$WAIT" "brick online" brick_online "$st" 2>/dev/null ||
        die "brick not online within ${WAIT}s after the restart (see $st/log/bricks/)"
}

case "${1:-}" in
    up) [ $# -eq 2 ] || usage; cmd_up "$2" ;;
    restart-brick) [ $# -eq 3 ] || usage; cmd_restart_brick "$2" "$3" ;;
    mount) [ $# -eq 3 ] || usage; cmd_mount "$2" "$3" ;;
    umount) [ $# -eq 2 ] || usage; cmd_umount "$2" ;;
    down) [ $# -eq 2 ] || usage; cmd_down "$2" ;;
    *) usage ;;
esac
