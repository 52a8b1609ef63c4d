#!/bin/bash
# gridfleet node image: bakes into an instance that becomes an AMI (infra/packer/node.pkr.hcl runs this as
# root) what every node's boot script installs otherwise: the Debian packages, the SSM agent, amazon-efs-utils, the crawl
# user, a venv with the bundle's pinned dependencies (gridfleet itself and the crawler project come with
# each boot's bundle) and the Selenium server jar; then the marker $INSTALL_DIR/image.json, by which a
# node's boot script knows the image and whether its venv holds the dependencies of the bundle it fetched.
# Made from the boot script's own parts (cloud_init/templates) by `python -m cloud_init bake`; a test keeps
# this file equal to that.
#
# usage: bake.sh BUNDLE.tar.gz AMAZON-EFS-UTILS.deb
#   BUNDLE.tar.gz          the bundle of `gridfleet bundle` (the one the nodes will fetch, or one with the
#                          same pinned dependencies)
#   AMAZON-EFS-UTILS.deb   amazon-efs-utils, which Debian does not package (docs/aws/efs-utils.md);
#                          not needed when the source image has it
#   GRIDFLEET_CRAWL_USER, GRIDFLEET_CRAWL_UID: the stack's crawl user (fleet.crawl_user, fleet.crawl_uid)
#   GRIDFLEET_REGION: where the SSM agent's package comes from (default: this instance's region, from IMDSv2)
set -Eeuo pipefail

readonly \
  INSTALL_DIR=/opt/gridfleet \
  STATE_DIR=/var/lib/gridfleet
readonly \
  BUNDLE=${1:-} \
  EFS_UTILS_DEB=${2:-} \
  CRAWL_USER=${GRIDFLEET_CRAWL_USER:-gridfleet} \
  CRAWL_UID=${GRIDFLEET_CRAWL_UID:-2000} \
  CRAWL_HOME=$STATE_DIR/home \
  IMDS=http://169.254.169.254 \
  BOOT_TIMEOUT_S=3600  # the bake's time budget
REGION=${GRIDFLEET_REGION:-}
STEP=start
WORK_DIR=
export DEBIAN_FRONTEND=noninteractive

log() { printf '%s gridfleet-bake: %s\n' "$(date -u +%FT%TZ)" "$*"; }

step() {
  STEP=$1
  log "step: $STEP"
}

fail() {
  trap - ERR
  log "bake failed at $STEP: $*"
  exit 1
}

trap 'fail "exit status $? from: $BASH_COMMAND"' ERR
trap '[[ -z $WORK_DIR ]] || rm -rf -- "$WORK_DIR"' EXIT

[[ -f $BUNDLE ]] || fail "usage: bake.sh BUNDLE.tar.gz AMAZON-EFS-UTILS.deb: no bundle file '$BUNDLE'"
[[ -z $EFS_UTILS_DEB || -f $EFS_UTILS_DEB ]] || fail "no file '$EFS_UTILS_DEB'"
# imds_region: this instance's region, from IMDSv2.
imds_region() {
  local token
  token=$(curl -fsS --max-time 5 --retry 5 -X PUT "$IMDS/latest/api/token" \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 600") || return 1
  curl -fsS --max-time 5 --retry 5 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/placement/region"
}

if [[ -z $REGION ]]; then
  REGION=$(imds_region) || fail "no GRIDFLEET_REGION, and no region from IMDSv2 at $IMDS"
fi
[[ $REGION =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+$ ]] || fail "'$REGION' is not an AWS region"
[[ $CRAWL_USER =~ ^[a-z_][a-z0-9_-]{0,31}$ && $CRAWL_USER != root ]] ||
  fail "GRIDFLEET_CRAWL_USER '$CRAWL_USER' is not a user name (lower-case letters, digits, '_' or '-'; not root)"
if ! [[ $CRAWL_UID =~ ^[1-9][0-9]{3,4}$ ]] || ((CRAWL_UID > 60000)); then
  fail "GRIDFLEET_CRAWL_UID '$CRAWL_UID' is not a uid from 1000 to 60000"
fi

APT_UPDATED=0
IMAGE_MARKER=$INSTALL_DIR/image.json

# bounded CMD...: CMD, killed when the boot time budget (BOOT_TIMEOUT_S from the
# start of this script) runs out.
bounded() {
  local left=$((BOOT_TIMEOUT_S - SECONDS)) rc=0
  ((left > 0)) || fail "the boot time budget of ${BOOT_TIMEOUT_S} s is spent"
  timeout --kill-after=10 "$left" "$@" || rc=$?
  ((rc != 124)) || log "timed out: $1 (boot time budget of ${BOOT_TIMEOUT_S} s)"
  return "$rc"
}

# pause SECONDS: sleep, but not past the boot time budget.
pause() {
  local left=$((BOOT_TIMEOUT_S - SECONDS))
  ((left <= 0)) || sleep "$((left < $1 ? left : $1))"
}

# apt_get ARGS...: apt-get, retried: at boot it races unattended-upgrades for the lock.
apt_get() {
  local attempt
  for attempt in 1 2 3 4 5; do
    bounded apt-get -o DPkg::Lock::Timeout=60 "$@" && return 0
    log "apt-get $1 failed (attempt $attempt of 5)"
    ((attempt == 5)) || pause 10
  done
  return 1
}

apt_update_once() {
  ((APT_UPDATED)) && return 0
  apt_get update && APT_UPDATED=1
}

# installed PACKAGE: whether dpkg has it installed.
installed() {
  [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# install_missing PACKAGE...: apt-get install the packages that are not installed yet.
install_missing() {
  local pkg missing=()
  for pkg in "$@"; do
    installed "$pkg" || missing+=("$pkg")
  done
  if [[ -z ${missing[*]} ]]; then
    log "already installed: $*"
    return 0
  fi
  log "installing: ${missing[*]}"
  apt_update_once && apt_get install -y --no-install-recommends "${missing[@]}"
}

make_venv() {
  bounded python3 -m venv --clear "$INSTALL_DIR/venv" || fail "cannot create $INSTALL_DIR/venv"
}

pip_wheels() {
  bounded "$INSTALL_DIR/venv/bin/pip" install --disable-pip-version-check --no-cache-dir \
    --no-index --find-links "$WHEELS" "$@"
}

# install_ssm_agent: Amazon's SSM agent, through which the hub's kill ladder and the dashboard's port forwarding
# reach this instance. Debian has no package of it: it comes from the region's own agent package in S3 (read
# anonymously, through the VPC's S3 endpoint), then runs as a service.
install_ssm_agent() {
  local arch key deb
  if installed amazon-ssm-agent; then
    log "amazon-ssm-agent is installed"
  else
    arch=$(dpkg --print-architecture)
    key=amazon-ssm-$REGION/latest/debian_$arch/amazon-ssm-agent.deb
    deb=$WORK_DIR/amazon-ssm-agent.deb
    bounded aws s3 cp --region "$REGION" --no-sign-request --only-show-errors "s3://$key" "$deb" ||
      fail "cannot download the SSM agent from s3://$key"
    [[ $(dpkg-deb -f "$deb" Package 2>/dev/null) == amazon-ssm-agent ]] ||
      fail "s3://$key is not the amazon-ssm-agent package"
    apt_get install -y "$deb" || fail "cannot install the SSM agent from s3://$key"
  fi
  systemctl enable --now amazon-ssm-agent.service || fail "cannot start the SSM agent (amazon-ssm-agent.service)"
}

sha256_of() {
  local h
  h=$(sha256sum <"$1") && echo "${h%% *}"
}
APT_PACKAGES=(chromium chromium-driver default-jre-headless python3-venv nfs-common awscli curl ca-certificates)

install_efs_utils() {
  if installed amazon-efs-utils && command -v mount.efs >/dev/null; then
    log "amazon-efs-utils is installed"
    return 0
  fi
  efs_utils_deb "$WORK_DIR/amazon-efs-utils.deb" ||
    fail "amazon-efs-utils is not installed and no .deb of it is at hand: bake it into the node image, or upload it \
with gridfleet bundle --upload --efs-utils-deb FILE (docs/aws/efs-utils.md)"
  [[ $(dpkg-deb -f "$WORK_DIR/amazon-efs-utils.deb" Package 2>/dev/null) == amazon-efs-utils ]] ||
    fail "the amazon-efs-utils .deb is not the amazon-efs-utils package"
  apt_get install -y "$WORK_DIR/amazon-efs-utils.deb" || fail "cannot install amazon-efs-utils from its .deb"
  command -v mount.efs >/dev/null || fail "amazon-efs-utils is installed but there is no mount.efs"
}

# ensure_crawl_user: the user the agent runs as (uid and gid CRAWL_UID, the EFS
# access point's POSIX user; no login shell), created when missing.
ensure_crawl_user() {
  if ! getent passwd "$CRAWL_USER" >/dev/null; then
    getent group "$CRAWL_USER" >/dev/null || groupadd --system --gid "$CRAWL_UID" "$CRAWL_USER"
    useradd --system --no-log-init --uid "$CRAWL_UID" --gid "$CRAWL_UID" --home-dir "$CRAWL_HOME" \
      --no-create-home --shell /usr/sbin/nologin "$CRAWL_USER"
  fi
  [[ $(id -u "$CRAWL_USER"):$(id -g "$CRAWL_USER") == "$CRAWL_UID:$CRAWL_UID" ]] ||
    fail "user $CRAWL_USER is not uid and gid $CRAWL_UID"
  install -d -o "$CRAWL_UID" -g "$CRAWL_UID" -m 0755 "$STATE_DIR"
  install -d -o "$CRAWL_UID" -g "$CRAWL_UID" -m 0700 "$CRAWL_HOME"
}


efs_utils_deb() {
  [[ -n $EFS_UTILS_DEB ]] || { log "amazon-efs-utils is not installed: give its .deb (bake.sh BUNDLE DEB)"; return 1; }
  log "installing amazon-efs-utils from $EFS_UTILS_DEB"
  cp -- "$EFS_UTILS_DEB" "$1"
}

# write_marker: $IMAGE_MARKER, what the image holds; a boot compares its deps_sha256 with its bundle's deps.txt.
write_marker() {
  local deps jar
  deps=$(sha256_of "$WORK_DIR/deps.txt")
  jar=$(sha256_of "$INSTALL_DIR/selenium-server.jar")
  python3 - "$IMAGE_MARKER.part" "$deps" "$jar" "$WORK_DIR/deps.txt" "$CRAWL_USER" "$CRAWL_UID" \
    "$INSTALL_DIR/venv" "${APT_PACKAGES[@]}" "${IMAGE_ONLY_PACKAGES[@]}" amazon-ssm-agent amazon-efs-utils <<'PY'
import datetime, json, platform, sys

out, deps, jar, deps_txt, user, uid, venv, *packages = sys.argv[1:]
with open(deps_txt) as f:
    wheels = f.read().split()
marker = {
    "format": 1,
    "baked_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "packages": packages,
    "crawl_user": user,
    "crawl_uid": int(uid),
    "venv": venv,
    "python": platform.python_version(),
    "deps_sha256": deps,
    "deps": wheels,
    "jar_sha256": jar,
}
with open(out, "w") as f:
    json.dump(marker, f, indent=1)
    f.write("\n")
PY
  mv -f -- "$IMAGE_MARKER.part" "$IMAGE_MARKER"
}

# the image also holds Chrome's headless shell, a lighter browser `browser.chromium` may name (a stock boot
# does not install it)
IMAGE_ONLY_PACKAGES=(chromium-headless-shell)
WORK_DIR=$(mktemp -d)
step install-packages
install_missing "${APT_PACKAGES[@]}" "${IMAGE_ONLY_PACKAGES[@]}" ||
  fail "cannot install ${APT_PACKAGES[*]} ${IMAGE_ONLY_PACKAGES[*]}"
step install-ssm-agent
install_ssm_agent
step install-efs-utils
install_efs_utils
step crawl-user
ensure_crawl_user
step unpack-bundle
tar -xzf "$BUNDLE" --no-same-owner --no-same-permissions -C "$WORK_DIR" || fail "cannot unpack $BUNDLE"
[[ -d $WORK_DIR/wheels && -f $WORK_DIR/selenium-server.jar && -f $WORK_DIR/deps.txt ]] ||
  fail "$BUNDLE has no wheels/, selenium-server.jar or deps.txt: make it with gridfleet bundle"
step install-dependencies
mkdir -p "$INSTALL_DIR"
rm -f -- "$IMAGE_MARKER"
WHEELS=$WORK_DIR/wheels
make_venv
pip_wheels gridfleet || fail "pip cannot install gridfleet's dependencies from the bundle's wheels"
# gridfleet itself comes with each boot's bundle, and is installed then without its dependencies
bounded "$INSTALL_DIR/venv/bin/pip" uninstall --disable-pip-version-check -q -y gridfleet
cp -- "$WORK_DIR/selenium-server.jar" "$INSTALL_DIR/selenium-server.jar"
step marker
write_marker
apt-get clean
log "baked: $IMAGE_MARKER"
