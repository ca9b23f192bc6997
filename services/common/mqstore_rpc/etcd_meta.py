"""The topic registry and the users, rules and SDK keys in etcd (``etcd://HOST:PORT,HOST:PORT/PREFIX``): the
catalogs of a replication group (mqstore.meta.catalog), kept by etcd's Raft on every member so that the loss of
one machine neither loses nor blocks them (issue 34; a single shared PostgreSQL did both).

Keys (values are JSON objects of the rows' fields), under the URL's prefix (default ``/mqstore/meta``):

  <prefix>/topics/<name>           a TopicRecord's fields and ``deleting`` (1 while a DeleteTopic is under way)
  <prefix>/topics-changed          put by every topic write: its mod revision is what TopicWatch polls
  <prefix>/auth/version            the auth version (a decimal integer) the services' caches compare
  <prefix>/auth/users/<name>       a User
  <prefix>/auth/rules/<id, 20 digits>  a Rule (ids in creation order: the version its add made)
  <prefix>/auth/sdk_keys/<access key>  an SdkKey (its secret sealed under the kek, never here in clear)

Every write is one etcd transaction comparing the mod revision of each key it reads (0: absent, a create),
so two writers of one key never both succeed: the loser re-reads, and a create finds the key taken
(AlreadyExists, as the SQL catalog's unique key says). Every auth change also compares and bumps
``auth/version`` in the same transaction: all auth changes are serialised on it, and a cache that saw
version N has seen every change up to N.

The client moves to another member when one does not answer and may send a transaction again whose answer
was lost (mqstore_rpc.etcd_client): a retry whose comparison fails because the first attempt was applied
finds its own row (same JSON, created_ms and secret hash included) and answers success, so a write is
neither lost nor doubled; a delete that finds its key gone after such a retry is done.

How other nodes learn of changes: a replica looks a topic it does not know up in the catalog (the registry's
reload on a miss, as with SQL) and ``mqstore_rpc.catalogs.TopicWatch`` polls one key's mod revision
(``topics-changed``, one small Range every ``poll_ms``) and reloads the registry when it moved: a revision
poll rather than an etcd Watch stream, because the client's calls move between members one call at a time
and a watch stream would need its own resumption; one Range of one key a second costs etcd nothing. Auth
caches already poll ``version()`` (mqstore.auth.authority).

Thread-safe: every method is a few etcd calls; no lock is held across them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import structlog

from mqstore import defaults
from mqstore.access import Rule, SdkKey, User
from mqstore.clock import Clock
from mqstore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from mqstore.meta.catalog import ETCD_SCHEME, is_etcd_url
from mqstore.meta.sql import _check_kind, _check_non_negative
from mqstore.model import TopicRecord
from mqstore_rpc.etcd_client import EtcdCoordination, parse_endpoints

log = structlog.get_logger()

DEFAULT_PREFIX = defaults.ETCD_CATALOG_PREFIX
MAX_KEYS = 100_000          # rows read by one listing (topics, rules, keys): the catalogs' bound
CAS_ATTEMPTS = 16           # a write whose comparison keeps failing (other writers) gives up after these
# A catalog call waits as long as the SQL catalog's (wait_timeout_ms, 10 s) for some member to answer; a member
# that does not answer within 1 s is left for the next (a loaded machine's etcd can be slow, no lease hangs on it).
CALL_TIMEOUT_S = 10.0
ATTEMPT_TIMEOUT_S = 1.0


@dataclasses.dataclass(frozen=True)
class EtcdUrl:
    endpoints: str  # "host:port,host:port"
    prefix: str     # "/mqstore/meta", no trailing slash

    def __str__(self) -> str:
        return f"{ETCD_SCHEME}{self.endpoints}{self.prefix}"


def parse_url(url: str) -> EtcdUrl:
    """``etcd://h1:p1,h2:p2,h3:p3/prefix`` (the prefix defaults to /mqstore/meta)."""
    if not is_etcd_url(url):
        raise InvalidArgument(f"{url!r} is not an etcd URL: give etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
    rest = url.strip()[len(ETCD_SCHEME):]
    members, _, prefix = rest.partition("/")
    try:
        endpoints = ",".join(parse_endpoints(members))
    except ValueError:
        raise InvalidArgument(f"etcd URL {url!r} names no member: give etcd://HOST:PORT[,HOST:PORT...]/PREFIX") \
            from None
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else DEFAULT_PREFIX
    return EtcdUrl(endpoints, prefix)


def _json(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


class _Catalog:
    def __init__(self, url: str, *, etcd: EtcdCoordination | None = None):
        self.url = parse_url(url)
        self._owned = etcd is None
        self._etcd = etcd or EtcdCoordination(self.url.endpoints, rpc_timeout_s=CALL_TIMEOUT_S,
                                              attempt_timeout_s=ATTEMPT_TIMEOUT_S)

    def close(self) -> None:
        if self._owned:
            self._etcd.close()

    def _key(self, *parts: str) -> str:
        return "/".join((self.url.prefix, *parts))


class EtcdTopicCatalog(_Catalog):
    """mqstore.meta.catalog.TopicCatalog in etcd (the module docstring). Thread-safe."""

    def __init__(self, url: str, clock: Clock, *, etcd: EtcdCoordination | None = None):
        super().__init__(url, etcd=etcd)
        self._clock = clock
        self._changed = self._key("topics-changed")

    def _topic_key(self, name: str) -> str:
        return self._key("topics", name)

    def create_topic(self, name: str, queue_count: int, kind: str, retention_ms: int,
                     start_physical_offset: int = 0) -> TopicRecord:
        _check_kind(kind)
        _check_non_negative(queue_count=queue_count, retention_ms=retention_ms,
                            start_physical_offset=start_physical_offset)
        record = TopicRecord(name, queue_count, kind, retention_ms, self._clock.now_ms(), start_physical_offset)
        self.put_topic(record)
        log.info("meta.topic_created", topic=name, queue_count=queue_count, kind=kind, catalog="etcd")
        return record

    def put_topic(self, record: TopicRecord, deleting: bool = False) -> None:
        """Create the row as given (created_ms included: the import keeps it); AlreadyExists if the name is taken."""
        key, value = self._topic_key(record.name), _json(dataclasses.asdict(record) | {"deleting": int(deleting)})
        if self._etcd.commit({key: 0}, {key: (value, 0), self._changed: (b"", 0)}):
            return
        if self._etcd.get(key).value == value:  # our own create, applied before its answer was lost
            return
        raise AlreadyExists(f"topic {record.name!r} exists already; update it or pick another name")

    def update_topic(self, name: str, queue_count: int | None = None,
                     retention_ms: int | None = None) -> TopicRecord:
        changes = {k: v for k, v in (("queue_count", queue_count), ("retention_ms", retention_ms)) if v is not None}
        _check_non_negative(**changes)
        record = self._modify(name, changes)
        if changes:
            log.info("meta.topic_updated", topic=name, catalog="etcd", **changes)
        return record

    def mark_topic_deleting(self, name: str) -> TopicRecord:
        record = self._modify(name, {"deleting": 1})
        log.info("meta.topic_deleting", topic=name, catalog="etcd")
        return record

    def _modify(self, name: str, changes: dict) -> TopicRecord:
        key = self._topic_key(name)
        for _ in range(CAS_ATTEMPTS):
            found = self._etcd.get(key)
            if found.value is None:
                raise _topic_not_found(name)
            fields = json.loads(found.value) | changes
            if not changes or self._etcd.commit({key: found.mod_revision},
                                                {key: (_json(fields), 0), self._changed: (b"", 0)}):
                return _topic(fields)
        raise _contended(f"topic {name!r}")

    def delete_topic(self, name: str) -> None:
        key = self._topic_key(name)
        for attempt in range(CAS_ATTEMPTS):
            found = self._etcd.get(key)
            if found.value is None:
                if attempt:  # our delete, applied before its answer was lost (or another's: gone either way)
                    return
                raise _topic_not_found(name)
            if self._etcd.commit({key: found.mod_revision}, {self._changed: (b"", 0)}, deletes=(key,)):
                log.info("meta.topic_deleted", topic=name, catalog="etcd")
                return
        raise _contended(f"topic {name!r}")

    def get_topic(self, name: str) -> TopicRecord:
        found = self._etcd.get(self._topic_key(name))
        if found.value is None:
            raise _topic_not_found(name)
        return _topic(json.loads(found.value))

    def list_topics(self) -> list[TopicRecord]:
        return self._topics_where(deleting=0)

    def deleting_topics(self) -> list[TopicRecord]:
        return self._topics_where(deleting=1)

    def _topics_where(self, *, deleting: int) -> list[TopicRecord]:
        rows = [json.loads(value) for _, value, _ in self._etcd.range_prefix(self._key("topics", ""), MAX_KEYS)]
        return sorted((_topic(r) for r in rows if r.get("deleting", 0) == deleting), key=lambda t: t.name)

    def changed_revision(self) -> int:
        """The mod revision of ``topics-changed``: it moves with every topic write (0: none yet)."""
        return self._etcd.get(self._changed).mod_revision

    def list_offsets(self, group: str | None = None, topic: str | None = None) -> list[tuple[str, str, int, int]]:
        """No earlier version kept consumer offsets here (they are records of the log): nothing to import."""
        return []

    def commit_offsets(self, rows) -> None:
        raise FailedPrecondition("consumer offsets are records of the log (RMQ_SYS_CONSUMER_OFFSETS), never in etcd")


def _topic(fields: dict) -> TopicRecord:
    return TopicRecord(**{f.name: fields[f.name] for f in dataclasses.fields(TopicRecord) if f.name in fields})


def _topic_not_found(name: str) -> NotFound:
    return NotFound(f"topic {name!r} does not exist; create it first or check the name")


def _contended(what: str) -> Unavailable:
    return Unavailable(f"{what}: {CAS_ATTEMPTS} compare-and-set attempts in a row lost to other writers; retry")


class EtcdAuthStore(_Catalog):
    """mqstore.meta.catalog.AuthCatalog in etcd (the module docstring). Thread-safe."""

    def __init__(self, url: str, clock: Clock, *, etcd: EtcdCoordination | None = None):
        super().__init__(url, etcd=etcd)
        self._clock = clock
        self._version = self._key("auth", "version")
        self._etcd.commit({self._version: 0}, {self._version: (b"1", 0)})  # a new catalog: version 1

    # ---- reads
    def version(self) -> int:
        found = self._etcd.get(self._version)
        return 1 if found.value is None else int(found.value)

    def user(self, name: str) -> User | None:
        found = self._etcd.get(self._key("auth", "users", name))
        return None if found.value is None else User(**json.loads(found.value))

    def users(self) -> list[User]:
        return [User(**row) for row in self._rows("users")]

    def rules(self, user: str = "") -> list[Rule]:
        return [r for r in (_rule(row) for row in self._rows("rules")) if not user or r.user == user]

    def sdk_key(self, access_key: str) -> SdkKey | None:
        found = self._etcd.get(self._key("auth", "sdk_keys", access_key))
        return None if found.value is None else SdkKey(**json.loads(found.value))

    def sdk_keys(self, user: str = "") -> list[SdkKey]:
        keys = [SdkKey(**row) for row in self._rows("sdk_keys")]
        return sorted((k for k in keys if not user or k.user == user), key=lambda k: (k.created_ms, k.access_key))

    def _rows(self, kind: str) -> list[dict]:
        return [json.loads(value) for _, value, _ in self._etcd.range_prefix(self._key("auth", kind, ""), MAX_KEYS)]

    # ---- changes: each one transaction that compares and bumps the version
    def _change(self, what: str, plan: Callable[[int, int], tuple[dict, dict, tuple] | None]) -> None:
        """``plan(attempt, next version)`` -> (expected mod revisions, puts, deletes), or None when there is
        nothing left to do (a retry found its own write); raises to refuse. Tried until a commit succeeds."""
        for attempt in range(CAS_ATTEMPTS):
            found = self._etcd.get(self._version)
            version = 1 if found.value is None else int(found.value)
            step = plan(attempt, version + 1)
            if step is None:
                return
            expected, puts, deletes = step
            puts = {k: (v, 0) for k, v in puts.items()} | {self._version: (str(version + 1).encode(), 0)}
            if self._etcd.commit({self._version: found.mod_revision, **expected}, puts, deletes):
                return
        raise _contended(what)

    def _get(self, *parts: str):
        return self._etcd.get(self._key("auth", *parts))

    def create_user(self, name: str, kind: str, secret_hash: str) -> User:
        now = self._clock.now_ms()
        self.put_user(User(name, kind, secret_hash, now, now))
        log.info("auth.user_created", user=name, kind=kind, catalog="etcd")
        return User(name, kind, secret_hash, now, now)

    def put_user(self, user: User) -> None:
        """Create the user as given (its times included: the import keeps them); AlreadyExists if taken."""
        value = _json(dataclasses.asdict(user))

        def plan(attempt: int, _version: int):
            found = self._get("users", user.name)
            if found.value is not None:
                if attempt and found.value == value:
                    return None
                raise AlreadyExists(f"user {user.name!r} exists already; update it or pick another name")
            return {self._key("auth", "users", user.name): 0}, {self._key("auth", "users", user.name): value}, ()
        self._change(f"user {user.name!r}", plan)

    def update_user(self, name: str, *, kind: str | None = None, secret_hash: str | None = None) -> None:
        changes: dict[str, object] = {"updated_ms": self._clock.now_ms()}
        if kind is not None:
            changes["kind"] = kind
        if secret_hash is not None:
            changes["secret_hash"] = secret_hash

        def plan(_attempt: int, _version: int):
            found = self._get("users", name)
            if found.value is None:
                raise _no_user(name)
            key = self._key("auth", "users", name)
            return {key: found.mod_revision}, {key: _json(json.loads(found.value) | changes)}, ()
        self._change(f"user {name!r}", plan)
        log.info("auth.user_updated", user=name, kind=kind, secret_changed=secret_hash is not None, catalog="etcd")

    def delete_user(self, name: str) -> None:
        def plan(attempt: int, _version: int):
            found = self._get("users", name)
            if found.value is None:
                if attempt:
                    return None
                raise _no_user(name)
            rules = [self._rule_key(r.rule_id) for r in self.rules(name)]
            keys = [self._key("auth", "sdk_keys", k.access_key) for k in self.sdk_keys(name)]
            # The version's comparison covers the rules and keys read: any change of them bumped it.
            return {self._key("auth", "users", name): found.mod_revision}, {}, \
                (self._key("auth", "users", name), *rules, *keys)
        self._change(f"user {name!r}", plan)
        log.info("auth.user_deleted", user=name, catalog="etcd")

    def _rule_key(self, rule_id: int) -> str:
        return self._key("auth", "rules", f"{rule_id:020d}")

    def add_rule(self, rule: Rule) -> Rule:
        tried: list[Rule] = []
        stored_as: list[Rule] = []
        now = self._clock.now_ms()

        def plan(_attempt: int, version: int):
            for earlier in tried:  # an earlier attempt applied before its answer was lost
                found = self._etcd.get(self._rule_key(earlier.rule_id))
                if found.value is not None and _rule(json.loads(found.value)) == earlier:
                    stored_as.append(earlier)
                    return None
            if self._get("users", rule.user).value is None:
                raise _no_user(rule.user)
            stored = dataclasses.replace(rule, rule_id=version)  # the version is unique and grows
            tried.append(stored)
            stored_as[:] = [stored]
            fields = {"user": rule.user, "kind": rule.kind, "pattern": rule.pattern,
                      "actions": sorted(rule.actions), "decision": rule.decision, "rule_id": version,
                      "created_ms": now}
            return {self._key("auth", "users", rule.user): self._get("users", rule.user).mod_revision}, \
                {self._rule_key(version): _json(fields)}, ()
        self._change(f"a rule of {rule.user!r}", plan)
        log.info("auth.rule_added", user=rule.user, rule=stored_as[-1].describe(), catalog="etcd")
        return stored_as[-1]

    def delete_rule(self, rule_id: int) -> None:
        def plan(attempt: int, _version: int):
            found = self._etcd.get(self._rule_key(rule_id))
            if found.value is None:
                if attempt:
                    return None
                raise NotFound(f"there is no rule #{rule_id}; `mqstore acl list` shows the rules and their ids")
            return {self._rule_key(rule_id): found.mod_revision}, {}, (self._rule_key(rule_id),)
        self._change(f"rule #{rule_id}", plan)
        log.info("auth.rule_deleted", rule_id=rule_id, catalog="etcd")

    def create_sdk_key(self, access_key: str, user: str, sealed_secret: str) -> SdkKey:
        key = SdkKey(access_key, user, sealed_secret, self._clock.now_ms())
        self.put_sdk_key(key)
        log.info("auth.sdk_key_created", user=user, access_key=access_key, catalog="etcd")
        return key

    def put_sdk_key(self, key: SdkKey) -> None:
        value = _json(dataclasses.asdict(key))
        path = self._key("auth", "sdk_keys", key.access_key)

        def plan(attempt: int, _version: int):
            found = self._etcd.get(path)
            if found.value is not None:
                if attempt and found.value == value:
                    return None
                raise AlreadyExists(f"access key {key.access_key!r} exists already")
            owner = self._get("users", key.user)
            if owner.value is None:
                raise _no_user(key.user)
            return {path: 0, self._key("auth", "users", key.user): owner.mod_revision}, {path: value}, ()
        self._change(f"access key {key.access_key!r}", plan)

    def delete_sdk_key(self, access_key: str) -> None:
        path = self._key("auth", "sdk_keys", access_key)

        def plan(attempt: int, _version: int):
            found = self._etcd.get(path)
            if found.value is None:
                if attempt:
                    return None
                raise NotFound(f"there is no SDK key {access_key!r}; `mqstore user sdk-key list` shows them")
            return {path: found.mod_revision}, {}, (path,)
        self._change(f"access key {access_key!r}", plan)
        log.info("auth.sdk_key_revoked", access_key=access_key, catalog="etcd")


def _rule(fields: dict) -> Rule:
    return Rule(fields["user"], fields["kind"], fields["pattern"], frozenset(fields["actions"]), fields["decision"],
                fields["rule_id"])


def _no_user(name: str) -> NotFound:
    return NotFound(f"there is no user {name!r}; `mqstore user list` shows them")
