"""Why an SSH connection failed, in words a user can act on: each paramiko or socket
error becomes a RemoteError whose FailureKind the fan-out reports per host."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from gpucluster.remote import hostkeys
from gpucluster.remote.result import FailureKind, RemoteError

if TYPE_CHECKING:
    from gpucluster.remote.ssh import Endpoint, SshOptions


def connect_failure(error: BaseException, endpoint: Endpoint, options: SshOptions,
                    host: str) -> BaseException:
    """What a failed connection means, as a RemoteError with its fix (a changed host
    key: hostkeys' refusal); anything unforeseen is returned as it is."""
    import paramiko

    where = f"{endpoint.address}:{endpoint.port}"
    if isinstance(error, paramiko.BadHostKeyException):
        return hostkeys.refuse_changed(host, error, options.known_hosts,
                                       endpoint.address, endpoint.port)
    if isinstance(error, paramiko.PasswordRequiredException):
        return RemoteError(FailureKind.AUTH_FAILED,
                           f"identity file {endpoint.identity_file} is passphrase-"
                           f"protected: add it to ssh-agent (ssh-add) and rerun")
    if isinstance(error, paramiko.AuthenticationException):
        how = "password" if options.password else (
            endpoint.identity_file or "ssh-agent and default keys")
        return RemoteError(FailureKind.AUTH_FAILED,
                           f"{endpoint.user}@{where} refused {how}: check user and "
                           f"identity_file, or pass --ask-pass for password login")
    if isinstance(error, paramiko.SSHException) and "No authentication methods" in str(error):
        return RemoteError(FailureKind.AUTH_FAILED,
                           f"no key or password to offer {endpoint.user}@{where}: set "
                           f"identity_file, load the key into ssh-agent, or pass --ask-pass")
    if isinstance(error, (TimeoutError, socket.timeout)):
        limit = endpoint.connect_timeout or options.connect_timeout
        return RemoteError(FailureKind.UNREACHABLE, f"no answer from {where} within {limit:g}s")
    if isinstance(error, socket.gaierror):
        return RemoteError(FailureKind.UNREACHABLE,
                           f"cannot resolve {endpoint.address}: {error.strerror}")
    if isinstance(error, OSError):
        return RemoteError(FailureKind.UNREACHABLE,
                           f"cannot connect to {where}: {error.strerror or error}")
    if isinstance(error, paramiko.SSHException) and "protocol banner" in str(error):
        return RemoteError(FailureKind.UNREACHABLE,
                           f"{where} took the connection but never spoke SSH: not sshd's "
                           f"port, or sshd turning this address away (hosts.deny, fail2ban) "
                           f"or too busy for new logins (MaxStartups)")
    if isinstance(error, paramiko.SSHException):
        return RemoteError(FailureKind.UNREACHABLE, f"SSH failed with {where}: {error}")
    return error
