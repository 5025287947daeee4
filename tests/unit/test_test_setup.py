"""The suite's own pre-flight: the package manifest scripts/setup installs from."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SYSTEM_PACKAGES, missing_commands, required_commands


def test_the_manifest_names_the_package_of_every_command_the_tests_call() -> None:
    commands = required_commands(SYSTEM_PACKAGES)
    assert commands["nft"] == "nftables"  # firewalld does not bring it (issue 17)
    assert commands["/usr/sbin/sshd"] == "openssh-server"
    assert commands["firewall-cmd"] == "firewalld"
    assert {"ip", "iptables", "podman", "nsenter", "busybox"} <= set(commands)


def test_comments_and_blank_lines_are_ignored(tmp_path: Path) -> None:
    manifest = tmp_path / "packages"
    manifest.write_text("# package commands\n\nfoo  bar baz  # why\nqux\n")
    assert required_commands(manifest) == {"bar": "foo", "baz": "foo"}


def test_a_missing_command_is_named_with_its_package(tmp_path: Path) -> None:
    absent = str(tmp_path / "no-such-tool")
    missing = missing_commands({"sh": "dash", absent: "nothing", "gpc-no-such-cmd": "pkg"})
    assert missing == {absent: "nothing", "gpc-no-such-cmd": "pkg"}
