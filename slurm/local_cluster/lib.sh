# Shared by start.sh and stop.sh (sourced, not run).

# A pid is alive when /proc/PID/comm exists, names the expected program, and the process is
# not a zombie (a SIGKILLed daemon stays a zombie for about a second).
pid_alive() {  # pid [comm]
    local pid="$1" comm="${2:-}" state
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/comm" ] || return 1
    if [ -n "$comm" ] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$comm"* ]]; then
        return 1
    fi
    state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$state" ] && [ "$state" != "Z" ] && [ "$state" != "X" ]
}

pidfile_alive() {  # pidfile comm
    [ -s "$1" ] && pid_alive "$(tr -d '[:space:]' <"$1")" "$2"
}
