"""The twin's init inside one instance: mounts its private directories, then boots its user-data's plan.

Run by `sandbox` as ``python3 -I guest.py PLAN STATUS_FD`` in the instance's network, mount and PID
namespaces, as PID 1 of the last; standard library only, since the instance's paths are not the project's.
Its order is cloud-init's: bootcmd, write_files, packages, deferred write_files, then the runcmd script.
It writes the runcmd script's exit status to STATUS_FD, then stays up as the instance's init (reaping
orphans) until it is stopped, so what the boot started in the background keeps running, as on EC2.
"""

from __future__ import annotations

import base64
import grp
import json
import os
import pwd
import signal
import subprocess
import sys
import time

CLOUD_DIR = "/var/lib/cloud"
STATUS_FILE = CLOUD_DIR + "/twin/boot-status.json"
MOUNTED_FILE = CLOUD_DIR + "/twin/mounted"  # written once the instance's own directories are bound


def log(text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} twin: {text}", flush=True)


def mount_all(mounts: list[dict[str, str]]) -> None:
    """Bind each per-instance source over its path; the mount namespace keeps them from the host."""
    for m in mounts:
        target = m["target"]
        if os.path.isdir(m["source"]):
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            raise SystemExit(f"twin: {target} does not exist to bind a file over")
        subprocess.run(["mount", "--bind", m["source"], target], check=True)


def _ids(owner: str) -> tuple[int, int]:
    user, _, group = owner.partition(":")
    uid = pwd.getpwnam(user).pw_uid
    gid = grp.getgrnam(group).gr_gid if group else pwd.getpwnam(user).pw_gid
    return uid, gid


def write_file(spec: dict) -> None:
    path = spec["path"]
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "ab" if spec["append"] else "wb") as f:
        f.write(base64.b64decode(spec["data_b64"]))
    os.chmod(path, spec["mode"])
    try:
        os.chown(path, *_ids(spec["owner"]))
    except KeyError:
        log(f"write_files: no such owner {spec['owner']} for {path}; left root's")
    log(f"wrote {path} ({oct(spec['mode'])}, {spec['owner']})")


def run_script(name: str, text: str, env: dict[str, str], timeout_s: float) -> int:
    path = f"{CLOUD_DIR}/instance/scripts/{name}"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o700)
    log(f"running {name}")
    proc = subprocess.Popen([path], env=env, cwd="/", start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log(f"{name} did not end within {timeout_s:g} s: killed")
        return 124
    log(f"{name} exited with status {rc}")
    return rc


def packages_missing(names: list[str]) -> list[str]:
    missing = []
    for name in names:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
        if out.stdout != "install ok installed":
            missing.append(name)
    return missing


def boot(plan: dict) -> int:
    env = dict(plan["env"])
    rc = 0
    if plan["bootcmd"]:
        run_script("bootcmd", plan["bootcmd"], env, plan["timeout_s"])
    for spec in plan["write_files"]:
        if not spec["defer"]:
            write_file(spec)
    missing = packages_missing(plan["packages"])
    if missing:
        log(f"packages: not installed on this machine, and the twin installs nothing: {' '.join(missing)}")
        rc = 1
    for spec in plan["write_files"]:
        if spec["defer"]:
            write_file(spec)
    if plan["runcmd"]:
        rc = run_script("runcmd", plan["runcmd"], env, plan["timeout_s"]) or rc
    return rc


def idle() -> None:
    """PID 1 of the instance: reap whatever the boot left behind until SIGTERM or SIGKILL."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child orphaned later wakes the pause below
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        plan = json.load(f)
    status_fd = int(argv[2])
    mount_all(plan["mounts"])
    os.makedirs(os.path.dirname(MOUNTED_FILE), exist_ok=True)
    with open(MOUNTED_FILE, "w") as f:
        f.write("mounted\n")
    started = time.monotonic()
    try:
        rc = boot(plan)
    except Exception as e:  # the boot's outermost frame: report it as the boot's failure
        log(f"boot failed: {type(e).__name__}: {e}")
        rc = 1
    status = {"exit_code": rc, "seconds": round(time.monotonic() - started, 3)}
    os.makedirs(os.path.dirname(STATUS_FILE), exist_ok=True)
    with open(STATUS_FILE, "w") as f:
        json.dump(status, f)
    os.write(status_fd, (json.dumps(status) + "\n").encode())
    os.close(status_fd)
    sys.stdout.flush()
    idle()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
