"""The sandbox node's own name service: host names from its /etc/hosts only."""

from __future__ import annotations

from gpucluster.sandbox.node import names_from_files_only


def test_host_names_come_from_files_only_and_the_rest_is_kept() -> None:
    box = "passwd:         files systemd\nhosts:          files mdns4_minimal dns\n" \
          "networks:       files\n"
    node = names_from_files_only(box)
    assert [line for line in node.splitlines() if line.startswith("hosts:")] == \
        ["hosts: files"]
    assert "passwd:         files systemd" in node and "networks:       files" in node


def test_a_machine_without_nsswitch_conf_gets_one() -> None:
    assert names_from_files_only("").splitlines()[-1] == "hosts: files"
