"""Managing users and rules (the Access API, ``mqstore user ...`` and ``mqstore acl ...``).

Checks every input (mqstore.access, mqstore.auth.secrets), hashes secrets before they reach the
store (a generated secret is returned once, to be handed to its user, and never stored in clear),
seals SDK secret keys under the kek (mqstore.auth.sealing: the server must recompute their signatures, so
they cannot be only hashed; a generated one is returned once), refuses the reserved service identity,
and drops the caches of this process's Authority after each
change (the other services follow within their refresh interval).

Thread-safe: the store and the authority are.
"""

from __future__ import annotations

from dataclasses import dataclass
import secrets as random
from typing import Callable

from mqstore import access as model
from mqstore.access import SERVICE_USER, Rule, SdkKey, User
from mqstore.auth import secrets
from mqstore.auth.sealing import Kek
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.meta.auth import AuthStore


@dataclass(frozen=True, slots=True)
class Created:
    user: User
    secret: str     # the generated secret (shown once), or "" when the caller gave one


@dataclass(frozen=True, slots=True)
class CreatedSdkKey:
    key: SdkKey
    secret_key: str  # shown once: kept only sealed


class AccessAdmin:
    def __init__(self, store: AuthStore, changed: Callable[[], None] = lambda: None, kek: Kek | None = None):
        self._store = store
        self._changed = changed
        self._kek = kek

    def create_user(self, name: str, kind: str, secret: str = "") -> Created:
        self._check_name(name)
        _check_kind(kind)
        generated = "" if secret else secrets.generate()
        user = self._store.create_user(name, kind, secrets.hash_secret(secret or generated))
        self._changed()
        return Created(user, generated)

    def update_user(self, name: str, *, kind: str = "", secret: str = "", new_secret: bool = False) -> str:
        """Change the kind and/or the secret (``new_secret``: generate one, returned). Returns the
        generated secret or ""."""
        self._check_name(name)
        if kind:
            _check_kind(kind)
        if secret and new_secret:
            raise InvalidArgument("give a secret or ask for a generated one, not both")
        generated = secrets.generate() if new_secret else ""
        chosen = secret or generated
        if not kind and not chosen:
            raise InvalidArgument("nothing to change: give a kind, a secret or ask for a generated secret")
        self._store.update_user(name, kind=kind or None, secret_hash=secrets.hash_secret(chosen) if chosen else None)
        self._changed()
        return generated

    def delete_user(self, name: str) -> None:
        self._check_name(name)
        self._store.delete_user(name)
        self._changed()

    def users(self) -> list[User]:
        return self._store.users()

    def add_rule(self, user: str, kind: str, pattern: str, actions: frozenset[str], decision: str) -> Rule:
        self._check_name(user)
        rule = self._store.add_rule(Rule(user, kind, "*" if kind == model.CLUSTER else pattern, actions, decision))
        self._changed()
        return rule

    def delete_rule(self, rule_id: int) -> None:
        if rule_id <= 0:
            raise InvalidArgument(f"id is {rule_id}; give a rule's id: 1 or more, as `mqstore acl list` shows")
        self._store.delete_rule(rule_id)
        self._changed()

    def rules(self, user: str = "") -> list[Rule]:
        if user:
            model.check_user_name(user)
        return self._store.rules(user)

    def create_sdk_key(self, user: str) -> CreatedSdkKey:
        """A new access key and secret key for ``user`` (a user may hold several: rotate by creating a new
        one, then revoking the old)."""
        self._check_name(user)
        if self._kek is None:
            raise FailedPrecondition("this server has no key-encryption key for SDK secrets: give it "
                                     "--auth-kek-file (MQSTORE_AUTH_KEK_FILE) or --data-dir")
        access_key = "MQ" + random.token_hex(10).upper()
        secret_key = secrets.generate()
        key = self._store.create_sdk_key(access_key, user, self._kek.seal(secret_key, access_key))
        self._changed()
        return CreatedSdkKey(key, secret_key)

    def sdk_keys(self, user: str = "") -> list[SdkKey]:
        if user:
            model.check_user_name(user)
        return self._store.sdk_keys(user)

    def revoke_sdk_key(self, access_key: str) -> None:
        self._store.delete_sdk_key(model.check_access_key(access_key))
        self._changed()

    @staticmethod
    def _check_name(name: str) -> None:
        model.check_user_name(name)
        if name == SERVICE_USER:
            raise FailedPrecondition(f"{SERVICE_USER!r} is the services' own identity (its secret is "
                                     f"MQSTORE_INTERNAL_TOKEN); it cannot be created, changed or given rules")


def _check_kind(kind: str) -> None:
    if kind not in model.USER_KINDS:
        raise InvalidArgument(f"kind: {' or '.join(model.USER_KINDS)}")
