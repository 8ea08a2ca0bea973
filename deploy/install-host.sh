#!/usr/bin/env bash
# Installs pyflannel's flanneld on a plain host (etcd mode, run by systemd), and removes it.
#
#   deploy/install-host.sh [--prefix DIR] [--source-dir DIR] [--python PATH]
#                          [--unit-dir DIR] [--env-file FILE] [--ca-bundle FILE] [--start]
#   deploy/install-host.sh --rollback [--prefix DIR] [--start]
#   deploy/install-host.sh --uninstall [--prefix DIR] [--unit-dir DIR] [--env-file FILE] [--purge]
#
# Each install builds a new virtualenv, PREFIX/versions/<version>-<time>, from
# deploy/requirements.lock (pinned versions, checked hashes; pip and setuptools removed
# afterwards), then swaps the symlink PREFIX/bin to it in one rename: a running flanneld keeps
# its own files, and the unit's /opt/pyflannel/bin/flanneld starts the new one on the next
# restart. PREFIX/previous-bin keeps the version before, for --rollback.
# The env file (FLANNELD_* settings) is created once, mode 0600, and never overwritten.
# Defaults: --prefix /opt/pyflannel, --python python3 (>= 3.11 with venv), --unit-dir
# /etc/systemd/system, --env-file /etc/default/flanneld. systemctl runs only with --start.
set -euo pipefail

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "install-host.sh: $*" >&2
    exit 1
}

# Paths end up in the unit file: absolute, and only characters that need no quoting there.
valid_path() {
    [[ "$1" =~ ^/[A-Za-z0-9._/+-]{0,4000}$ ]] && [[ ! "$1" =~ (^|/)\.\.(/|$) ]]
}

mode=install
prefix=/opt/pyflannel
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
python=python3
unit_dir=/etc/systemd/system
env_file=/etc/default/flanneld
ca_bundle=""
start=false
purge=false
while [ "$#" -gt 0 ]; do
    case "$1" in
        --prefix) [ "$#" -ge 2 ] || usage; prefix="$2"; shift 2 ;;
        --source-dir) [ "$#" -ge 2 ] || usage; source_dir="$2"; shift 2 ;;
        --python) [ "$#" -ge 2 ] || usage; python="$2"; shift 2 ;;
        --unit-dir) [ "$#" -ge 2 ] || usage; unit_dir="$2"; shift 2 ;;
        --env-file) [ "$#" -ge 2 ] || usage; env_file="$2"; shift 2 ;;
        --ca-bundle) [ "$#" -ge 2 ] || usage; ca_bundle="$2"; shift 2 ;;
        --start) start=true; shift ;;
        --rollback) mode=rollback; shift ;;
        --uninstall) mode=uninstall; shift ;;
        --purge) purge=true; shift ;;
        -h|--help) usage ;;
        *) echo "install-host.sh: unknown argument: $1" >&2; usage ;;
    esac
done
for option in prefix unit_dir env_file; do
    valid_path "${!option}" \
        || die "--${option//_/-} '${!option}' must be an absolute path of letters, digits and ._/+-"
done
[ "$prefix" != / ] || die "--prefix must not be /"
marker="$prefix/.pyflannel-install"
unit="$unit_dir/flanneld.service"

systemd_running() {
    [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1
}

# Replace a symlink in one rename, so it always points at a complete virtualenv.
swap_link() {
    local target="$1" link="$2"
    ln -sfn -- "$target" "$link.new"
    mv -fT -- "$link.new" "$link"
}

restart_if_asked() {
    if [ "$start" = true ]; then
        systemd_running || die "--start needs a running systemd"
        systemctl daemon-reload
        systemctl enable flanneld.service
        systemctl restart flanneld.service
    fi
}

# The virtualenv being built and its source copy: an interrupted install leaves neither.
venv=""
build=""
cleanup_build() {
    if [ -n "$build" ]; then rm -rf -- "$build"; fi
    if [ -n "$venv" ] && [ ! -e "$venv/.complete" ]; then rm -rf -- "$venv"; fi
}

install() {
    [ -f "$source_dir/flannel/version.py" ] && [ -f "$source_dir/deploy/requirements.lock" ] \
        || die "--source-dir $source_dir is not a pyflannel source tree"
    command -v -- "$python" >/dev/null \
        || die "$python not found: install Python 3.11 or newer with its venv module, or give one with --python"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
        || die "$python is not Python 3.11 or newer: give one with --python"
    "$python" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$python has no venv/ensurepip module (Debian, Ubuntu: apt-get install python3-venv)"
    if [ -e "$prefix" ] && [ ! -e "$marker" ]; then
        die "$prefix exists and was not made by install-host.sh: choose another --prefix"
    fi
    if [ -n "$ca_bundle" ]; then
        [ -f "$ca_bundle" ] && [ -r "$ca_bundle" ] || die "--ca-bundle $ca_bundle is not a readable file"
        export PIP_CERT="$ca_bundle"
    fi
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

    local version name
    version="$(sed -n 's/^__version__ = "\([0-9A-Za-z.+-]*\)"$/\1/p' "$source_dir/flannel/version.py")"
    [ -n "$version" ] || die "cannot read __version__ from $source_dir/flannel/version.py"
    name="$version-$(date -u +%Y%m%dT%H%M%SZ)"
    mkdir -p -m 0755 "$prefix/versions"
    touch "$marker"
    venv="$prefix/versions/$name"
    [ ! -e "$venv" ] || die "$venv already exists: wait a second and run again"
    # Built from a copy, so the source tree gets no build/ or egg-info directories.
    build="$(mktemp -d)"
    trap cleanup_build EXIT
    cp "$source_dir/pyproject.toml" "$source_dir/README.md" "$build/"
    cp -R "$source_dir/flannel" "$build/flannel"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --require-hashes --no-deps --only-binary=:all: \
        -r "$source_dir/deploy/requirements.lock"
    "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index "$build"
    "$venv/bin/python" -m pip uninstall -q -y setuptools pip
    rm -f "$venv"/bin/activate* "$venv/bin/Activate.ps1"
    "$venv/bin/flanneld" --version 2>/dev/null || die "the new $venv/bin/flanneld does not run"
    touch "$venv/.complete"

    mkdir -p -m 0755 "$unit_dir" "$(dirname "$env_file")"
    sed -e "s|/opt/pyflannel/bin/flanneld|$prefix/bin/flanneld|" \
        -e "s|^EnvironmentFile=.*|EnvironmentFile=$env_file|" \
        "$source_dir/deploy/flanneld.service" > "$unit.new"
    chmod 0644 "$unit.new"
    mv -f -- "$unit.new" "$unit"
    if [ ! -e "$env_file" ]; then
        (umask 077 && sed -n 's/^#   \(FLANNELD_.*\)$/# \1/p' "$source_dir/deploy/flanneld.service" \
            > "$env_file")
    fi

    if [ -L "$prefix/bin" ]; then
        swap_link "$(readlink "$prefix/bin")" "$prefix/previous-bin"
    fi
    swap_link "versions/$name/bin" "$prefix/bin"
    # Keep the current and the previous version; older ones go.
    local keep_current keep_previous entry
    keep_current="$(readlink "$prefix/bin")"
    keep_previous="$(readlink "$prefix/previous-bin" 2>/dev/null || true)"
    for entry in "$prefix"/versions/*; do
        case "versions/$(basename "$entry")/bin" in
            "$keep_current"|"$keep_previous") ;;
            *) rm -rf -- "$entry" ;;
        esac
    done
    echo "installed pyflannel $version in $venv; $prefix/bin now points at it"
    echo "unit: $unit, settings: $env_file"
    if [ "$start" = true ]; then
        restart_if_asked
    else
        echo "next: edit $env_file, then: systemctl daemon-reload && systemctl enable --now flanneld"
    fi
}

rollback() {
    [ -e "$marker" ] || die "no installation made by install-host.sh in $prefix"
    [ -L "$prefix/previous-bin" ] || die "no previous version to roll back to in $prefix"
    local current previous
    current="$(readlink "$prefix/bin")"
    previous="$(readlink "$prefix/previous-bin")"
    [ -x "$prefix/$previous/flanneld" ] || die "the previous version $prefix/$previous is incomplete"
    swap_link "$previous" "$prefix/bin"
    swap_link "$current" "$prefix/previous-bin"
    echo "$prefix/bin now points at $previous (was $current)"
    restart_if_asked
}

uninstall() {
    if systemd_running && systemctl is-active --quiet flanneld.service; then
        die "flanneld is running: stop it first (systemctl disable --now flanneld), then run" \
            "'$prefix/bin/flannelctl cleanup' to remove its network state"
    fi
    if [ -e "$prefix" ]; then
        [ -e "$marker" ] || die "$prefix was not made by install-host.sh: not removing it"
        rm -rf -- "$prefix"
    fi
    rm -f -- "$unit"
    if [ "$purge" = true ]; then
        rm -f -- "$env_file"
    elif [ -e "$env_file" ]; then
        echo "kept $env_file (--purge removes it)"
    fi
    if systemd_running; then
        systemctl daemon-reload
    fi
    echo "removed pyflannel from $prefix and $unit"
}

"$mode"
