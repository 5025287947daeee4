"""Can we work on the node at all: SSH, sudo, and the job's python/torchrun."""

from __future__ import annotations

from gpucluster.doctor.model import CheckResult, Context, Status, check
from gpucluster.errors import split_fix

NON_INTERACTIVE_PATH = (
    "non-interactive SSH sessions do not read /etc/profile, and most ~/.bashrc files stop "
    "at once when not interactive, so PATH differs from a login shell: set "
    "cluster.{key} in the inventory to the absolute path (e.g. /opt/venv/bin/{tool}), or "
    "extend PATH in ~/.ssh/environment or /etc/environment"
)
# A command that starts this long after its session opens is waiting on a login script.
SLOW_LOGIN_S = 5.0
SLOW_LOGIN_REMEDY = (
    "bash runs ~/.bashrc (and /etc/bash.bashrc) for commands sent over SSH, and every "
    "gpucluster command on this node pays it: time `ssh {target} true`, then look there for "
    "what waits (a stale lock file such as pyenv's ~/.pyenv/shims/.pyenv-shim left by a "
    "killed login, a slow network mount, conda or pyenv init)"
)


# No probe section of its own: the login time comes from the clock, which every probe reads.
@check("ssh", "reachability", "SSH login works (host key verified, authentication accepted)",
       sections=())
def ssh(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        login_s = context.facts[host.name].login_s
        if login_s is not None and login_s >= SLOW_LOGIN_S:
            results.append(CheckResult(
                "ssh", host.name, Status.WARN,
                f"logged in as {host.user}, but commands start {login_s:.1f} s later: a "
                f"login script is slow",
                SLOW_LOGIN_REMEDY.format(target=f"{host.user}@{host.address}")))
        else:
            results.append(CheckResult("ssh", host.name, Status.OK, f"logged in as {host.user}"))
    for name, failure in context.unreachable.items():
        message, own_fix = split_fix(failure.message)  # e.g. a missing identity file
        results.append(CheckResult(
            "ssh", name, Status.FAIL, f"{failure.kind.value}: {message}",
            own_fix or _ssh_remedy(failure.kind.value)))
    return results


def _ssh_remedy(kind: str) -> str:
    return {
        "unreachable": "check the node is up, the address and port in the inventory, and "
                       "that sshd runs and a firewall allows port 22 from this machine",
        "auth failed": "check user and identity_file (ssh -i KEY USER@HOST), or load the key "
                       "into ssh-agent",
        "host key unknown": "verify the fingerprint, then rerun with --accept-new-host-keys",
        "host key changed": "find out why the key changed; if legitimate, remove the old key "
                            "with the ssh-keygen -R command shown",
        "timed out": "the message names the probe step that ran out of time: a hung tool "
                     "(typically nvidia-smi on a wedged GPU: try `timeout 10 nvidia-smi` "
                     "there) needs fixing; a slow one (a node's first torch import, an "
                     "overloaded node) needs a larger --timeout: rerun with one",
    }.get(kind, "rerun with -v for details")


@check("sudo", "reachability", "root, or sudo without a password prompt (provision needs it)")
def sudo(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        answer = (context.facts[host.name].text("sudo") or "").strip().splitlines()
        state = answer[-1] if answer else ""
        if state == "root":
            results.append(CheckResult("sudo", host.name, Status.OK, "logged in as root"))
        elif state == "ok":
            results.append(CheckResult("sudo", host.name, Status.OK, "sudo -n works"))
        elif state == "typed":
            results.append(CheckResult("sudo", host.name, Status.OK,
                                       "sudo takes the password typed (--ask-sudo-pass)"))
        elif state == "typed-refused":
            said = answer[-2].strip()[-200:] if len(answer) > 1 else "no reason given"
            results.append(CheckResult(
                "sudo", host.name, Status.WARN,
                f"sudo refused the password typed ({said}; tried once)",
                f"doctor --ask-sudo-pass again with {host.user}'s sudo password on this "
                f"node; nothing here read through it"))
        elif state == "missing":
            results.append(CheckResult("sudo", host.name, Status.WARN, "sudo is not installed",
                                       "install sudo, or log in as root (provision needs "
                                       "root for /etc/hosts and the firewall)"))
        else:
            results.append(CheckResult(
                "sudo", host.name, Status.WARN, "sudo asks for a password",
                f"allow {host.user} passwordless sudo: echo '{host.user} ALL=(ALL) NOPASSWD:ALL'"
                f" | sudo tee /etc/sudoers.d/zz-gpucluster (provision needs it; named to sort "
                f"last, as sudo's last matching rule wins), or type it: "
                f"provision --ask-sudo-pass",
                {"output": " ".join(answer)[-200:]}))
    return results


def _tool(context: Context, name: str, key: str, configured: str) -> list[CheckResult]:
    results = []
    for host in context.answering():
        found = context.facts[host.name].ok_text(key)
        if found:
            results.append(CheckResult(name, host.name, Status.OK, found.splitlines()[0]))
        elif "/" in configured:  # a path: PATH plays no part
            results.append(CheckResult(
                name, host.name, Status.FAIL,
                f"{configured} (cluster.{key}) is missing or not executable",
                f"install it there (the same environment on every node), or set "
                f"cluster.{key} to where {key} is on the nodes"))
        else:
            path = context.facts[host.name].text("path") or "?"
            results.append(CheckResult(
                name, host.name, Status.FAIL,
                f"{configured!r} not found in a non-interactive SSH session",
                NON_INTERACTIVE_PATH.format(key=key, tool=key), {"PATH": path}))
    return results


@check("python", "reachability", "the python jobs use (cluster.python) is found over SSH",
       sections=("python", "path"))
def python(context: Context) -> list[CheckResult]:
    return _tool(context, "python", "python", context.inventory.cluster.python)


@check("torchrun", "reachability", "torchrun (cluster.torchrun) is found over SSH",
       sections=("torchrun", "path"))
def torchrun(context: Context) -> list[CheckResult]:
    return _tool(context, "torchrun", "torchrun", context.inventory.cluster.torchrun)
