"""The catalogs as the services open them (mqstore.meta.catalog): by URL (SQL, or etcd for ``etcd://``), the
one-time import of a SQL catalog into an empty etcd prefix, and the watch by which a node learns of topics
written by another (mqstore_rpc.etcd_meta's module docstring says why a revision poll)."""

from __future__ import annotations

import threading

from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.meta import MetadataStore
from mqstore.meta.auth import AuthStore
from mqstore.meta.catalog import AuthCatalog, TopicCatalog, is_etcd_url
from mqstore_rpc.etcd_meta import EtcdAuthStore, EtcdTopicCatalog, parse_url

log = structlog.get_logger()

TOPIC_POLL_MS = 500


# ---- opening by URL (the services' one place) ----------------------------------------------------------------

def open_topic_catalog(url: str, clock: Clock) -> TopicCatalog:
    """The topic catalog ``url`` names: etcd for ``etcd://``, else SQL (mqstore.meta.sql.MetadataStore)."""
    return EtcdTopicCatalog(url, clock) if is_etcd_url(url) else MetadataStore(url, clock)


def open_auth_store(url: str, clock: Clock) -> AuthCatalog:
    """The auth catalog ``url`` names: etcd for ``etcd://``, else SQL (mqstore.meta.auth.AuthStore)."""
    return EtcdAuthStore(url, clock) if is_etcd_url(url) else AuthStore(url, clock)


# ---- the one-time import of a SQL catalog -------------------------------------------------------------------

def import_topics(source, target: EtcdTopicCatalog) -> int:
    """Copy every topic of the SQL catalog ``source`` (those being deleted too) into ``target``, which must hold
    none: the number copied. Rows keep created_ms and start_physical_offset (the incarnation is the log's)."""
    _refuse_non_empty(target.list_topics() + target.deleting_topics(), "topics", target)
    rows = [(t, False) for t in source.list_topics()] + [(t, True) for t in source.deleting_topics()]
    for topic, deleting in rows:
        target.put_topic(topic, deleting)
    return len(rows)


def import_auth(source, target: EtcdAuthStore) -> tuple[int, int, int]:
    """Copy every user, rule and SDK key of the SQL catalog ``source`` into ``target``, which must hold no user:
    (users, rules, SDK keys) copied. Rules get new ids, in the source's order."""
    _refuse_non_empty(target.users(), "users", target)
    users, rules, keys = source.users(), source.rules(), source.sdk_keys()
    for user in users:
        target.put_user(user)
    for rule in rules:
        target.add_rule(rule)
    for key in keys:
        target.put_sdk_key(key)
    return len(users), len(rules), len(keys)


def import_sql(target_url: str, clock: Clock, *, metadata_url: str = "", auth_url: str = "") -> dict[str, int]:
    """The one-time import (``mqstore catalog import``, make run-ha's first start on an earlier data dir): the
    topics of the SQL catalog ``metadata_url`` and the users, rules and SDK keys of ``auth_url`` (each when
    given) into the etcd prefix ``target_url``, which must hold none of them. What was copied, by kind."""
    if not (metadata_url or auth_url):
        raise InvalidArgument("give the SQL catalog to import: a metadata URL, an auth URL, or both")
    if is_etcd_url(metadata_url) or is_etcd_url(auth_url):
        raise InvalidArgument("the catalogs to import are SQL ones (sqlite:///..., postgresql+psycopg2://...)")
    counts: dict[str, int] = {}
    if metadata_url:
        source, target = MetadataStore(metadata_url, clock), EtcdTopicCatalog(target_url, clock)
        try:
            counts["topics"] = import_topics(source, target)
        finally:
            source.close()
            target.close()
    if auth_url:
        source, target = AuthStore(auth_url, clock), EtcdAuthStore(target_url, clock)
        try:
            counts["users"], counts["rules"], counts["sdk_keys"] = import_auth(source, target)
        finally:
            source.close()
            target.close()
    log.info("meta.imported", to=str(parse_url(target_url)), **counts)
    return counts


def _refuse_non_empty(found: list, what: str, target: EtcdTopicCatalog | EtcdAuthStore) -> None:
    if found:
        raise FailedPrecondition(f"{target.url} holds {len(found)} {what} already: an import goes into an empty "
                                 f"prefix only (give another prefix in the URL)")


# ---- a replica's view of topics created elsewhere -----------------------------------------------------------

class TopicWatch(Duty):
    """Every ``poll_ms``, reads ``topics-changed``'s mod revision and calls ``changed()`` (the store's
    TopicRegistry.refresh) when it moved: a node learns of topics created, changed or deleted on another within
    a poll, not only when it misses one (the revision poll of the module docstring)."""

    def __init__(self, catalog: EtcdTopicCatalog, changed: Callable[[], None], poll_ms: int = TOPIC_POLL_MS):
        super().__init__("topic-watch", interval_s=poll_ms / 1000)
        self._catalog, self._changed = catalog, changed
        self._seen = -1
        self._lock = threading.Lock()

    def step(self) -> None:
        self.fresh()

    def fresh(self) -> None:
        """Now, not within a poll: reload when ``topics-changed`` moved since the last look. A listing that
        answers a caller (ListTopics) calls it first, so it never misses a topic whose records the caller
        already read from the log: the compactor takes a record's topic for unknown, and skips its records,
        when the node it asks has not polled since the topic was created (seen in make compose-check-ha)."""
        with self._lock:
            revision = self._catalog.changed_revision()
            if revision != self._seen:
                if self._seen >= 0:
                    self._changed()
                self._seen = revision
