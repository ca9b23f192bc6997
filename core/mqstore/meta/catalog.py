"""The two catalogs of small, rarely written metadata, as the store and the services use them, and where each
is kept: the topic registry (:class:`TopicCatalog`) and the users, rules and SDK keys (:class:`AuthCatalog`).

Two implementations of each, chosen by the URL's scheme (``--metadata-url``, ``--auth-url``):

- SQL (``sqlite:///...``, ``postgresql+psycopg2://...``): ``mqstore.meta.sql.MetadataStore`` and
  ``mqstore.meta.auth.AuthStore``, the catalog of a single-node store;
- etcd (``etcd://HOST:PORT,HOST:PORT,HOST:PORT/PREFIX``): ``mqstore_rpc.etcd_meta``, the catalog of a
  replication group (HA), replicated by etcd's own Raft over every member, so the loss of one machine
  neither loses nor blocks it. Its client speaks gRPC, which core does not import: the services open it
  and hand it to the store (``MessageStore(open_catalog=...)``).
"""

from __future__ import annotations

from typing import Callable, Protocol

from mqstore.access import Rule, SdkKey, User
from mqstore.clock import Clock
from mqstore.model import TopicRecord

ETCD_SCHEME = "etcd://"


def is_etcd_url(url: str) -> bool:
    """Whether ``url`` names an etcd catalog (``etcd://members/prefix``)."""
    return url.strip().lower().startswith(ETCD_SCHEME)


class TopicCatalog(Protocol):
    """The topic registry's rows (mqstore.store_topics keeps the rules and an in-memory copy). Thread-safe.
    NotFound / AlreadyExists as the SQL one says; Unavailable when the catalog cannot be reached."""

    def create_topic(self, name: str, queue_count: int, kind: str, retention_ms: int,
                     start_physical_offset: int = 0) -> TopicRecord: ...

    def update_topic(self, name: str, queue_count: int | None = None,
                     retention_ms: int | None = None) -> TopicRecord: ...

    def mark_topic_deleting(self, name: str) -> TopicRecord: ...

    def delete_topic(self, name: str) -> None: ...

    def get_topic(self, name: str) -> TopicRecord: ...

    def list_topics(self) -> list[TopicRecord]: ...

    def deleting_topics(self) -> list[TopicRecord]: ...

    def list_offsets(self, group: str | None = None,
                     topic: str | None = None) -> list[tuple[str, str, int, int]]: ...

    def close(self) -> None: ...


class AuthCatalog(Protocol):
    """Users, rules and SDK keys; every change bumps ``version()`` (the services' caches compare it). Thread-safe."""

    def version(self) -> int: ...

    def user(self, name: str) -> User | None: ...

    def users(self) -> list[User]: ...

    def rules(self, user: str = "") -> list[Rule]: ...

    def sdk_key(self, access_key: str) -> SdkKey | None: ...

    def sdk_keys(self, user: str = "") -> list[SdkKey]: ...

    def create_user(self, name: str, kind: str, secret_hash: str) -> User: ...

    def update_user(self, name: str, *, kind: str | None = None, secret_hash: str | None = None) -> None: ...

    def delete_user(self, name: str) -> None: ...

    def add_rule(self, rule: Rule) -> Rule: ...

    def delete_rule(self, rule_id: int) -> None: ...

    def create_sdk_key(self, access_key: str, user: str, sealed_secret: str) -> SdkKey: ...

    def delete_sdk_key(self, access_key: str) -> None: ...

    def close(self) -> None: ...


TopicCatalogOpener = Callable[[str, Clock], TopicCatalog]
