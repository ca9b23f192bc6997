"""A MessageStore with the parts that use it: the one way a store is built (the commit log's composition, the
bench, the tests' stores).

The storage core (mqstore.store) knows neither part; each is composed here, onto one of the store's hooks:

- topic administration (mqstore.topic_admin: CreateTopic, UpdateTopic, DeleteTopic's steps, lookups), reached
  as ``store.topic_admin``; ``store.on_start``: the deletes a crash cut short are resumed once the store serves;
- the replica side (mqstore.store_replica: the visibility of copied records, promotion), reached as
  ``store.replica_view``; ``store.dispatch_through``: a new leader's copied records go in before its appends.

The parts hang on the store as attributes so that their callers (servicers, pop, the timer, replication) reach
them from the store they are handed; the store itself never reads them (tests/test_layering_core.py: the store
layer does not import these features).
"""

from __future__ import annotations

from mqstore.clock import Clock
from mqstore.config import StoreConfig
from mqstore.meta.catalog import TopicCatalogOpener
from mqstore.metrics import Registry
from mqstore.store import MessageStore
from mqstore.store_replica import ReplicaView
from mqstore.topic_admin import TopicAdmin
from mqstore.writers import Writers


def build_store(config: StoreConfig, clock: Clock | None = None, metrics: Registry | None = None,
                writers: Writers | None = None, open_catalog: TopicCatalogOpener | None = None) -> MessageStore:
    """A MessageStore (its arguments as the store's) with topic administration and the replica side composed onto
    it; not started."""
    store = MessageStore(config, clock, metrics, writers, open_catalog)
    admin = TopicAdmin(store)
    store.on_start(admin.resume_deletes)
    store.topic_admin = admin
    view = ReplicaView(store)
    store.dispatch_through(view.dispatch_to)
    store.replica_view = view
    return store
