"""The one rule for environment variable names, wherever a user can give one (inventory
env, --env, anything exported on a node): what every POSIX shell accepts."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_env_name(name: object) -> bool:
    """ASCII letters, digits and _, not starting with a digit; the whole text (so neither
    'é' nor a trailing newline passes, as they would with isidentifier() or a '$')."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MASK = "***"


def looks_secret(name: str) -> bool:
    """A variable whose value must not be shown: HF_TOKEN, WANDB_API_KEY, DB_PASSWORD..."""
    return _SECRET.search(name) is not None


def masked(env: Mapping[str, str], secret: Collection[str] = ()) -> dict[str, str]:
    """`env` to show or keep: secret-looking values, and those of the `secret` names
    (launch --secret-env), replaced by ***."""
    return {name: MASK if looks_secret(name) or name in secret else value
            for name, value in env.items()}
