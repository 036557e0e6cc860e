# Sourced by the .ci/prepare-*.sh scripts (not a prepare step itself).

# as_root COMMAND...: run COMMAND as root (through sudo when not root already).
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    else
        sudo "$@"
    fi
}

# apt_install WHAT PACKAGE...: install Debian packages quietly; fail naming WHAT without apt-get.
apt_install() {
    local what=$1
    shift
    if ! command -v apt-get >/dev/null; then
        echo "${0##*/}: no $what and no apt-get to install it" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
