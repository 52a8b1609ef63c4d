"""A sandbox in which bash runs a rendered boot script for real, with stub commands first on PATH.

Real commands the scripts may use are linked in; everything else they call is a stub that records its call
(one line, written at once), and a command that is neither is not found, so no test can reach the host's apt,
dpkg, mount, systemctl or shutdown. S3 is a directory (`Sandbox.put`), SSM Parameter Store another
(`Sandbox.ssm`), IMDSv2 and the Grid's /status a stub of curl. `gridfleet grid-secret` is the project's own
command, run for real.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

BASH = shutil.which("bash") or "/bin/bash"
INSTANCE_ID = "i-0123456789abcdef0"
LOCAL_IP = "10.0.1.23"
TOKEN = "AQAEAtestTOKEN=="
EFS_ID = "fs-0123456789abcdef0"
REGION = "ap-northeast-2"
SSM_AGENT_KEY = "latest/debian_amd64/amazon-ssm-agent.deb"
SSM_AGENT_BUCKET = f"amazon-ssm-{REGION}"

REAL_TOOLS = [
    "cat", "chmod", "cp", "date", "dirname", "env", "gzip", "mkdir", "mktemp", "mv", "nohup", "rm", "sed", "tar",
    "tee", "test", "timeout", "touch", "uname",
]  # fmt: skip
# Each stub records its call as one line, written at once: the Grid hub's stub runs in the background beside the
# script's next stubs, and a line written in parts could be cut by theirs.
RECORD = (
    '#!{bash}\n_call=${{0##*/}}; for a in "$@"; do _call+=$\'\\x1f\'"$a"; done\n'
    'printf "%s\\n" "$_call" >>"$STUB_LOG"; unset _call\n'
)

STUBS = {
    "curl": r"""
method=GET url= headers=() config=
while (($#)); do
  case $1 in
    -X) method=$2; shift 2 ;;
    -H) headers+=("$2"); shift 2 ;;
    -K) config=$2; shift 2 ;;
    -o|--max-time|--retry) shift 2 ;;
    http*) url=$1; shift ;;
    *) shift ;;
  esac
done
has_header() { local h; for h in "${headers[@]}"; do [[ $h == "$1" ]] && return 0; done; return 1; }
case $url in
  */latest/api/token)
    [[ $method == PUT ]] && has_header "X-aws-ec2-metadata-token-ttl-seconds: 21600" || exit 22
    printf %s "$STUB_TOKEN" ;;
  */latest/meta-data/*)
    has_header "X-aws-ec2-metadata-token: $STUB_TOKEN" || { echo "curl: (22) 401" >&2; exit 22; }
    case ${url#*/latest/meta-data/} in
      instance-id) printf %s "$STUB_INSTANCE_ID" ;;
      local-ipv4) printf %s "$STUB_LOCAL_IP" ;;
      tags/instance/gridfleet:run_id) [[ -n ${STUB_TAG_RUN_ID:-} ]] || exit 22; printf %s "$STUB_TAG_RUN_ID" ;;
      *) exit 22 ;;
    esac ;;
  */status)  # the Grid hub takes only its router's credentials, from a curl config (`-K`)
    [[ -n ${STUB_GRID_DOWN:-} ]] && exit 7
    if [[ -n ${STUB_GRID_SLOW:-} ]]; then  # it answers only at the STUB_GRID_SLOW+1-th try
      echo x >>"$SANDBOX/grid-tries"
      mapfile -t tries <"$SANDBOX/grid-tries"
      ((${#tries[@]} > STUB_GRID_SLOW)) || exit 7
    fi
    [[ -n $config && -f $config ]] && cp -- "$config" "$SANDBOX/curl-config-seen" || exit 22
    printf '{"value":{"ready":false}}' ;;
  *) exit 7 ;;
esac
""",
    # aws: `s3 cp` from the S3 directory; `dynamodb` and `logs` calls are recorded (STUB_AWS_FAILS: they fail)
    "aws": r"""
case $1 in
  s3)
    src=${*: -2:1} dest=${*: -1}
    obj=$S3_ROOT/${src#s3://}
    [[ -f $obj ]] || { echo "fatal error: An error occurred (404) when calling the HeadObject operation" >&2; exit 1; }
    cp -- "$obj" "$dest" ;;
  ssm)  # parameters are files under $SSM_ROOT, named as the parameter; STUB_SSM_FAILS: every call fails,
    # STUB_SSM_GET_FAILS: every get-parameter
    denied="An error occurred (AccessDeniedException) when calling the $2 operation"
    [[ -z ${STUB_SSM_FAILS:-} ]] || { echo "$denied" >&2; exit 254; }
    [[ -z ${STUB_SSM_GET_FAILS:-} || $2 != get-parameter ]] || { echo "$denied" >&2; exit 254; }
    prev= name= value=
    for a in "$@"; do
      case $prev in --name) name=$a ;; --value) value=$a ;; esac
      prev=$a
    done
    case $2 in
      put-parameter) mkdir -p "$SSM_ROOT${name%/*}"; cp -- "${value#file://}" "$SSM_ROOT$name" ;;
      get-parameter)
        missing="An error occurred (ParameterNotFound) when calling the GetParameter operation: "
        [[ -f $SSM_ROOT$name ]] || { echo "$missing" >&2; exit 254; }
        cat -- "$SSM_ROOT$name" ;;
      *) exit 2 ;;
    esac ;;
  dynamodb | logs)
    [[ -z ${STUB_AWS_FAILS:-} ]] || exit 254
    prev=
    for a in "$@"; do [[ $prev == --log-events ]] && cp -- "${a#file://}" "$SANDBOX/events.json"; prev=$a; done
    exit 0 ;;
  *) exit 2 ;;
esac
""",
    "apt-get": r"""
count=$(cat "$SANDBOX/apt.count" 2>/dev/null || echo 0); echo $((count + 1)) >"$SANDBOX/apt.count"
for a in "$@"; do
  case $a in
    update) ((count == 0)) && { echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100; }; exit 0 ;;
    */amazon-efs-utils.deb) cp "$SANDBOX/mount.efs.stub" "$STUB_BIN/mount.efs"; exit 0 ;;
  esac
done
exit 0
""",
    # dpkg-query: a package is installed when STUB_INSTALLED names it
    "dpkg-query": '[[ " ${STUB_INSTALLED:-} " == *" ${*: -1} "* ]] && printf "install ok installed" || exit 1\n',
    "dpkg": '[[ $1 == --print-architecture ]] && echo "${STUB_ARCH:-amd64}"\n',
    "dpkg-deb": '[[ $1 == -f ]] && sed -n "s/^$3: //p" "$2"\n',
    # systemctl: STUB_SYSTEMCTL_FAIL names a unit that fails to start
    "systemctl": '[[ -n ${STUB_SYSTEMCTL_FAIL:-} && " $* " == *" $STUB_SYSTEMCTL_FAIL "* ]] && exit 1; exit 0\n',
    "mountpoint": "exit 1\n",
    "mount": r"""
count=$(cat "$SANDBOX/mount.count" 2>/dev/null || echo 0); echo $((count + 1)) >"$SANDBOX/mount.count"
((count < ${STUB_MOUNT_FAILS:-0})) && { echo "mount.nfs4: Connection timed out" >&2; exit 32; }
exit 0
""",
    "sleep": 'exec "$REAL_SLEEP" "${STUB_SLEEP_REAL:-0}"\n',
    "shutdown": "exit 0\n",
    # Users: none exists until useradd (STUB_PASSWD: one that does); `id` answers STUB_IDS (uid:gid).
    "getent": r"""
[[ $1 == passwd && -n ${STUB_PASSWD:-} && $2 == "${STUB_PASSWD%%:*}" ]] && { echo "$STUB_PASSWD"; exit 0; }
exit 2
""",
    "groupadd": "exit 0\n",
    "useradd": "exit 0\n",
    "id": 'ids=${STUB_IDS:-2000:2000}; [[ $1 == -u ]] && echo "${ids%:*}" || echo "${ids#*:}"\n',
    "chown": "exit 0\n",
    "install": 'mkdir -p -- "${@: -1}"\n',
    # setpriv runs its command as this test's own user.
    "setpriv": r"""
while [[ $1 == --* ]]; do shift; done
exec "$@"
""",
    # java: the Grid hub, gone at once (a stub), or alive for a while when it is slow to answer (STUB_GRID_SLOW)
    "java": '[[ -z ${STUB_GRID_SLOW:-} ]] || exec "$REAL_SLEEP" 10\nexit 0\n',
    # python3: `-m venv` makes a venv whose pip is a stub; anything else (the scripts' own snippets) is real Python
    "python3": r"""
if [[ $1 == -m && $2 == venv ]]; then
  venv=${*: -1}
  mkdir -p "$venv/bin"
  cp "$SANDBOX/pip.stub" "$venv/bin/pip"
  exit 0
fi
exec "$REAL_PYTHON" "$@"
""",
}
PIP_STUB = 'cp "$SANDBOX/gridfleet.stub" "$(dirname "$0")/gridfleet"\n'
GRIDFLEET_STUB = r"""
case $1 in
  validate) exit "${STUB_VALIDATE_RC:-0}" ;;
  node)  # STUB_SITE_MOUNTS_RC: how the site-mount helper answers a `site-mount` request
    [[ $2 == report-failure ]] && exit 0
    [[ $2 == site-mount ]] && exit "${STUB_SITE_MOUNTS_RC:-0}"
    exit "${STUB_AGENT_RC:-0}" ;;
  run) exit "${STUB_RUN_RC:-0}" ;;
  grid-secret)  # the project's own command
    PYTHONPATH=$GRIDFLEET_SRC exec "$REAL_PYTHON" -c 'import sys; from cli.main import main; sys.exit(main())' "$@" ;;
  ship-logs) exit 0 ;;
esac
exit 2
"""
MOUNT_EFS_STUB = "exit 0\n"


def make_bundle(path: Path, machine: str = "x86_64", python: str | None = None) -> None:
    """A bundle as `gridfleet bundle` makes it, built for `machine` and `python` (default: the Python running)."""
    python = python or "{}.{}".format(*sys.version_info[:2])
    platform = json.dumps({"format": 1, "machine": machine, "python": python}).encode()
    files = (("wheels/gridfleet-0.1.0-py3-none-any.whl", b"wheel"), ("selenium-server.jar", b"jar"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (*files, ("platform.json", platform)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class Sandbox:
    """A directory with stub commands first on PATH, a fake S3, and the script's paths inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.real = root / "real"
        self.s3 = root / "s3"
        self.ssm = root / "ssm"
        self.etc = root / "etc" / "gridfleet"
        self.log_file = root / "log" / "gridfleet-boot.log"
        self.console = root / "console"
        self.stub_log = root / "calls.log"
        self.bucket = "gridfleet-artifacts"
        for d in (self.bin, self.real, self.s3, self.ssm, root / "home", root / "tmp"):
            d.mkdir(parents=True)
        for tool in REAL_TOOLS:
            (self.real / tool).symlink_to(shutil.which(tool))
        for name, body in STUBS.items():
            self.stub(name, body)
        for name, body in (
            ("pip.stub", PIP_STUB),
            ("gridfleet.stub", GRIDFLEET_STUB),
            ("mount.efs.stub", MOUNT_EFS_STUB),
        ):
            self.write_exe(root / name, body)
        self.put_object(SSM_AGENT_BUCKET, SSM_AGENT_KEY, b"Package: amazon-ssm-agent\n")
        self.env = {
            "PATH": f"{self.bin}:{self.real}",
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "LANG": "C.UTF-8",
            "SANDBOX": str(root),
            "STUB_BIN": str(self.bin),
            "STUB_LOG": str(self.stub_log),
            "S3_ROOT": str(self.s3),
            "SSM_ROOT": str(self.ssm),
            "GRIDFLEET_SRC": str(Path(__file__).resolve().parents[2]),
            "REAL_SLEEP": shutil.which("sleep") or "/bin/sleep",
            "REAL_PYTHON": sys.executable,
            "STUB_TOKEN": TOKEN,
            "STUB_INSTANCE_ID": INSTANCE_ID,
            "STUB_LOCAL_IP": LOCAL_IP,
            "GRIDFLEET_BOOT_LOG": str(self.log_file),
            "GRIDFLEET_CONSOLE": str(self.console),
            "GRIDFLEET_ETC_DIR": str(self.etc),
            "GRIDFLEET_GRID_LOG": str(root / "log" / "grid.log"),
            "GRIDFLEET_RUN_LOG": str(root / "log" / "hub.log"),
            "GRIDFLEET_AGENT_LOG": str(root / "log" / "node.log"),
        }

    def write_exe(self, path: Path, body: str) -> None:
        path.write_text(RECORD.format(bash=BASH) + body)
        path.chmod(0o755)

    def stub(self, name: str, body: str) -> None:
        self.write_exe(self.bin / name, body)

    def put_object(self, bucket: str, key: str, data: bytes = b"") -> Path:
        path = self.s3 / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def put(self, key: str, data: bytes = b"") -> Path:
        return self.put_object(self.bucket, key, data)

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        path = self.root / "boot.sh"
        path.write_text(script)
        return subprocess.run(
            [BASH, str(path), *args], env={**self.env, **env}, cwd=self.root, capture_output=True, text=True, timeout=60
        )

    def calls(self, name: str | None = None) -> list[list[str]]:
        lines = self.stub_log.read_text().splitlines() if self.stub_log.exists() else []
        calls = [line.split("\x1f") for line in lines]
        return [c for c in calls if name is None or c[0] == name]

    def boot_log(self) -> str:
        return self.log_file.read_text()
