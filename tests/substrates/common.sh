# Helpers shared by the real-substrate scripts (glusterfs.sh, cephfs.sh).
# Sourced, not run. Each script takes: up STATE | mount STATE MNT | umount MNT | down STATE.

# abs PATH: PATH made absolute (it need not exist yet).
abs() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s/%s\n' "$(pwd)" "$1" ;;
    esac
}

# is_mounted PATH: is PATH a mount point right now (per /proc/self/mountinfo)?
is_mounted() {
    local target
    target="$(abs "$1")"
    awk -v t="$target" '$5 == t { found = 1 } END { exit !found }' /proc/self/mountinfo
}

# umount_one MNT: unmount a FUSE client for sure: fusermount -u, umount, then
# a lazy umount. A killed FUSE daemon leaves "Transport endpoint is not
# connected" behind; the lazy unmount clears that too.
umount_one() {
    local mnt i cmd
    mnt="$(abs "$1")"
    for cmd in "fusermount3 -u" "fusermount -u" "umount" "umount -l"; do
        is_mounted "$mnt" || return 0
        command -v "${cmd%% *}" >/dev/null 2>&1 || continue
        for i in 1 2 3 4 5 6 7 8 9 10; do
            # shellcheck disable=SC2086
            timeout 15 $cmd "$mnt" >/dev/null 2>&1 && break
            is_mounted "$mnt" || break
            sleep 0.2
        done
    done
    ! is_mounted "$mnt"
}

# wait_for SECONDS WHAT CMD...: run CMD until it succeeds or SECONDS pass.
wait_for() {
    local secs="$1" what="$2" deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "timed out after ${secs}s waiting for $what" >&2
            return 1
        fi
        sleep 0.2
    done
}
