# Shared by harness/ensure_*.sh (sourced): one build at a time per lock file, and timings.
#   take_lock NAME LOCKFILE   hold LOCKFILE (fd 9) for the rest of the script; waits for another build
#   now / elapsed T0          a timestamp / seconds since T0, one decimal

take_lock() {
    exec 9>"$2"
    if ! flock -n 9; then
        echo "$1: another build holds $2; waiting..."
        flock 9
    fi
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
