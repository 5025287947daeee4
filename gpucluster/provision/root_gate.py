"""Steps that need root are refused, before any of them changes anything, on nodes whose
user cannot sudo the way this run will."""

from __future__ import annotations

from gpucluster.inventory import Inventory
from gpucluster.remote.session import Session
from gpucluster.remote.sudo_check import sudo_refusal


def root_refusal(session: Session, inventory: Inventory, needing: list[str]) -> str | None:
    """Steps that need root, on nodes whose user cannot sudo (`sudo -n`, or with the
    --ask-sudo-pass password, tried once): refused before any step changes anything
    (else the mesh would be set up and /etc/hosts not)."""
    if not needing:
        return None
    refused = sudo_refusal(session, inventory.hosts)
    if refused is None:
        return None
    user, nodes, said = refused.user, refused.nodes, refused.said
    steps = ", ".join(needing) + (" needs" if len(needing) == 1 else " need")
    if session.options.sudo_password is not None:
        return (f"provision changed nothing: {steps} root on {nodes}, where sudo "
                f"refused {user}'s password ({said}; tried once per node) (fix: "
                f"--ask-sudo-pass again with {user}'s sudo password there, or --skip "
                f"{','.join(needing)})")
    return (f"provision changed nothing: {steps} root on {nodes}, where {user} cannot "
            f"sudo without a password ({said}) (fix: --ask-sudo-pass to type it, echo "
            f"'{user} ALL=(ALL) NOPASSWD:ALL' | sudo tee /etc/sudoers.d/zz-gpucluster on "
            f"those nodes, log in as root, or --skip {','.join(needing)})")
