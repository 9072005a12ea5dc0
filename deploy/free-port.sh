# Sourced by deploy scripts (which define die). free_port [TAKEN...]: prints a TCP port
# nobody on 127.0.0.1 listens on, outside the ephemeral range and not among TAKEN.
free_port() {
    local port taken p
    for _ in $(seq 1 200); do
        port=$((20000 + RANDOM % 12000))
        taken=0
        for p in "$@"; do [[ ${p} == "${port}" ]] && taken=1; done
        ((taken)) && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            echo "${port}"
            return 0
        fi
    done
    die "no free port found"
}
