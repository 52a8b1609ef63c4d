"""The twin's init inside one instance: mounts its private directories, then boots its user-data's plan.

Run by `sandbox` as ``python3 -I guest.py PLAN STATUS_FD`` in the instance's network, mount and PID namespaces,
as PID 1 of the last; standard library only, since the instance's paths are not the project's. It runs
cloud-init's modules in the order of the stages and module lists of the instance's own /etc/cloud/cloud.cfg
(Debian's cloud-init; `sandbox` reads them into the plan), carrying out those the twin knows and that the
user-data uses: `ssh` (fresh host keys), `bootcmd`, `write_files`, `runcmd` (its script),
`package_update_upgrade_install` (packages must be there), `write_files_deferred`, `scripts_user` (the runcmd
script), `keys_to_console` (the host keys to the console, by cloud-init's own helper) and `final_message`; the
others act on user-data keys the twin refuses, so they would do nothing. So the host keys reach the console
only when the runcmd script has ended, as on Debian. It writes the runcmd script's exit status to STATUS_FD
once the final stage is over, then stays up as the instance's init (reaping orphans) until it is stopped, so
what the boot started in the background keeps running, as on EC2.
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
    """Bind each per-instance source over its path, or lay an overlay (the host's directory under the instance's
    own upper layer) over it; the mount namespace keeps them from the host."""
    for m in mounts:
        target = m["target"]
        if m.get("kind") == "overlay":
            options = f"lowerdir={m['lower']},upperdir={m['upper']},workdir={m['work']}"
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, target], check=True)
            continue
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


def host_keys() -> None:
    """cloud-init's `ssh` module: the image's host keys go, fresh ones of its default types are made."""
    for name in os.listdir("/etc/ssh") if os.path.isdir("/etc/ssh") else []:
        if name.startswith("ssh_host_") and (name.endswith("_key") or name.endswith("_key.pub")):
            os.unlink(f"/etc/ssh/{name}")
    if os.path.exists("/usr/bin/ssh-keygen"):
        for kind in ("rsa", "ecdsa", "ed25519"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", f"/etc/ssh/ssh_host_{kind}_key"], check=True
            )
        log("ssh: generated host keys rsa, ecdsa, ed25519")


def to_console(text: str) -> None:
    with open("/dev/console", "a") as console:
        console.write(text)


def keys_to_console() -> None:
    """cloud-init's `keys_to_console`: its own helper prints the host keys' fingerprints and the keys."""
    helper = "/usr/lib/cloud-init/write-ssh-key-fingerprints"
    if os.path.exists(helper):
        out = subprocess.run([helper, "", "ssh-dss"], capture_output=True, text=True, timeout=60).stdout
        to_console(out)
        log("keys_to_console: the host keys are on the console")


class Boot:
    """One boot of the plan, module by module; `rc` is the runcmd script's exit status."""

    def __init__(self, plan: dict) -> None:
        self.plan = plan
        self.env = dict(plan["env"])
        self.rc = 0
        self.started = time.monotonic()

    def run_module(self, name: str) -> None:
        handler = getattr(self, "m_" + name.replace("-", "_"), None)
        if handler is not None:
            handler()

    def m_ssh(self) -> None:
        host_keys()

    def m_bootcmd(self) -> None:
        if self.plan["bootcmd"]:
            run_script("bootcmd", self.plan["bootcmd"], self.env, self.plan["timeout_s"])

    def m_write_files(self) -> None:
        for spec in self.plan["write_files"]:
            if not spec["defer"]:
                write_file(spec)

    def m_package_update_upgrade_install(self) -> None:
        missing = packages_missing(self.plan["packages"])
        if missing:
            log(f"packages: not installed on this machine, and the twin installs nothing: {' '.join(missing)}")
            self.rc = 1

    def m_write_files_deferred(self) -> None:
        for spec in self.plan["write_files"]:
            if spec["defer"]:
                write_file(spec)

    def m_scripts_user(self) -> None:
        if self.plan["runcmd"]:
            self.rc = run_script("runcmd", self.plan["runcmd"], self.env, self.plan["timeout_s"]) or self.rc

    def m_keys_to_console(self) -> None:
        keys_to_console()

    def m_final_message(self) -> None:
        up = time.monotonic() - self.started
        stamp = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime())
        version = self.plan["cloud_init_version"]
        to_console(f"Cloud-init v. {version} finished at {stamp}. Datasource DataSourceEc2.  Up {up:.2f} seconds\n")


def boot(plan: dict) -> int:
    b = Boot(plan)
    for stage in ("init", "config", "final"):
        for name in plan["modules"][stage]:
            b.run_module(name)
    return b.rc


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
