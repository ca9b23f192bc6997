"""Users and access rules in SQL (SQLAlchemy Core), in the auth database every service shares
(setting auth_url: a SQLite file, ``<data-dir>/auth.db`` by default, or PostgreSQL).

Tables (created when missing; their own version row, independent of the topic registry's schema):

  auth_schema:  id (always 1), schema_version (1), version (bumped by every change of users or rules:
                the services' caches compare it, mqstore.auth.authority)
  auth_users:   name PK, kind (super|normal), secret_hash (mqstore.auth.secrets: scrypt, salted; never
                the secret), created_ms, updated_ms
  auth_rules:   id PK (auto), user_name (indexed), resource_kind (topic|group|cluster), pattern,
                actions ("PUB,SUB"), decision (allow|deny), created_ms
  auth_sdk_keys: access_key PK, user_name (indexed), sealed_secret (mqstore.auth.sealing: the SDK secret
                key encrypted under the kek, which is not in this database), created_ms

Every change runs in one transaction that also bumps ``version``. Deleting a user deletes its rules and SDK keys.

Thread-safe: SQLAlchemy's engine and pool are; each method is one short transaction.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import sqlalchemy as sa
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from mqstore.access import Rule, SdkKey, User
from mqstore import fs
from mqstore.clock import Clock
from mqstore.errors import AlreadyExists, FailedPrecondition, NotFound, Unavailable
from mqstore.meta.sql import _WRITE_OPTION, _build_engine, lock_schema

log = structlog.get_logger("mqstore.meta.auth")

SCHEMA_VERSION = 1
_META = sa.MetaData()
SCHEMA = sa.Table(
    "auth_schema", _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
)
USERS = sa.Table(
    "auth_users", _META,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("secret_hash", sa.String(255), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
)
RULES = sa.Table(
    "auth_rules", _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("user_name", sa.String(64), nullable=False, index=True),
    sa.Column("resource_kind", sa.String(16), nullable=False),
    sa.Column("pattern", sa.String(128), nullable=False),
    sa.Column("actions", sa.String(64), nullable=False),
    sa.Column("decision", sa.String(8), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)
SDK_KEYS = sa.Table(
    "auth_sdk_keys", _META,
    sa.Column("access_key", sa.String(64), primary_key=True),
    sa.Column("user_name", sa.String(64), nullable=False, index=True),
    sa.Column("sealed_secret", sa.String(512), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)


class AuthStore:
    def __init__(self, url: str, clock: Clock, *, wait_timeout_ms: int = 10_000):
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database:
            fs.make_dirs(pathlib.Path(parsed.database).absolute().parent)  # the creation rule (mqstore.fs)
        self._url_text = parsed.render_as_string(hide_password=True)
        self._clock = clock
        self._wait_timeout_ms = wait_timeout_ms
        self._engine = _build_engine(parsed, wait_timeout_ms=wait_timeout_ms, pool_size=4)
        try:
            with self._transaction(write=True) as conn:  # several services open one database at start
                lock_schema(conn)
                _META.create_all(conn)
                row = conn.execute(sa.select(SCHEMA.c.schema_version)).scalar_one_or_none()
                if row is None:
                    conn.execute(SCHEMA.insert().values(id=1, schema_version=SCHEMA_VERSION, version=1))
                elif row > SCHEMA_VERSION:
                    raise FailedPrecondition(f"auth database {self._url_text} has schema version {row}, newer "
                                             f"than {SCHEMA_VERSION}: upgrade mqstore or use another database")
        except BaseException:
            self._engine.dispose()
            raise

    def close(self) -> None:
        self._engine.dispose()

    # ---- reads ---------------------------------------------------------------------------------------
    def version(self) -> int:
        with self._transaction() as conn:
            return int(conn.execute(sa.select(SCHEMA.c.version)).scalar_one())

    def user(self, name: str) -> User | None:
        with self._transaction() as conn:
            row = conn.execute(USERS.select().where(USERS.c.name == name)).one_or_none()
        return None if row is None else User(row.name, row.kind, row.secret_hash, row.created_ms, row.updated_ms)

    def users(self) -> list[User]:
        with self._transaction() as conn:
            rows = conn.execute(USERS.select()).all()
        return sorted((User(r.name, r.kind, r.secret_hash, r.created_ms, r.updated_ms) for r in rows),
                      key=lambda u: u.name)

    def rules(self, user: str = "") -> list[Rule]:
        query = RULES.select().order_by(RULES.c.id)
        if user:
            query = query.where(RULES.c.user_name == user)
        with self._transaction() as conn:
            rows = conn.execute(query).all()
        return [Rule(r.user_name, r.resource_kind, r.pattern, frozenset(r.actions.split(",")), r.decision, r.id)
                for r in rows]

    def sdk_key(self, access_key: str) -> SdkKey | None:
        with self._transaction() as conn:
            row = conn.execute(SDK_KEYS.select().where(SDK_KEYS.c.access_key == access_key)).one_or_none()
        return None if row is None else _sdk_key(row)

    def sdk_keys(self, user: str = "") -> list[SdkKey]:
        query = SDK_KEYS.select().order_by(SDK_KEYS.c.created_ms, SDK_KEYS.c.access_key)
        if user:
            query = query.where(SDK_KEYS.c.user_name == user)
        with self._transaction() as conn:
            return [_sdk_key(row) for row in conn.execute(query).all()]

    # ---- changes (each bumps the version) ------------------------------------------------------------
    def create_user(self, name: str, kind: str, secret_hash: str) -> User:
        now = self._clock.now_ms()
        with self._transaction(write=True) as conn:
            if conn.execute(sa.select(USERS.c.name).where(USERS.c.name == name)).first() is not None:
                raise AlreadyExists(f"user {name!r} exists already; update it or pick another name")
            conn.execute(USERS.insert().values(name=name, kind=kind, secret_hash=secret_hash, created_ms=now,
                                               updated_ms=now))
            _bump(conn)
        log.info("auth.user_created", user=name, kind=kind)
        return User(name, kind, secret_hash, now, now)

    def update_user(self, name: str, *, kind: str | None = None, secret_hash: str | None = None) -> None:
        changes: dict[str, object] = {"updated_ms": self._clock.now_ms()}
        if kind is not None:
            changes["kind"] = kind
        if secret_hash is not None:
            changes["secret_hash"] = secret_hash
        with self._transaction(write=True) as conn:
            if conn.execute(USERS.update().where(USERS.c.name == name).values(changes)).rowcount == 0:
                raise _no_user(name)
            _bump(conn)
        log.info("auth.user_updated", user=name, kind=kind, secret_changed=secret_hash is not None)

    def delete_user(self, name: str) -> None:
        with self._transaction(write=True) as conn:
            if conn.execute(USERS.delete().where(USERS.c.name == name)).rowcount == 0:
                raise _no_user(name)
            rules = conn.execute(RULES.delete().where(RULES.c.user_name == name)).rowcount
            keys = conn.execute(SDK_KEYS.delete().where(SDK_KEYS.c.user_name == name)).rowcount
            _bump(conn)
        log.info("auth.user_deleted", user=name, rules_deleted=rules, sdk_keys_deleted=keys)

    def add_rule(self, rule: Rule) -> Rule:
        with self._transaction(write=True) as conn:
            if conn.execute(sa.select(USERS.c.name).where(USERS.c.name == rule.user)).first() is None:
                raise _no_user(rule.user)
            result = conn.execute(RULES.insert().values(
                user_name=rule.user, resource_kind=rule.kind, pattern=rule.pattern,
                actions=",".join(sorted(rule.actions)), decision=rule.decision, created_ms=self._clock.now_ms()))
            _bump(conn)
        stored = Rule(rule.user, rule.kind, rule.pattern, rule.actions, rule.decision,
                      int(result.inserted_primary_key[0]))
        log.info("auth.rule_added", user=rule.user, rule=stored.describe())
        return stored

    def delete_rule(self, rule_id: int) -> None:
        with self._transaction(write=True) as conn:
            if conn.execute(RULES.delete().where(RULES.c.id == rule_id)).rowcount == 0:
                raise NotFound(f"there is no rule #{rule_id}; `mqstore acl list` shows the rules and their ids")
            _bump(conn)
        log.info("auth.rule_deleted", rule_id=rule_id)

    def create_sdk_key(self, access_key: str, user: str, sealed_secret: str) -> SdkKey:
        key = SdkKey(access_key, user, sealed_secret, self._clock.now_ms())
        with self._transaction(write=True) as conn:
            if conn.execute(sa.select(USERS.c.name).where(USERS.c.name == key.user)).first() is None:
                raise _no_user(key.user)
            if conn.execute(sa.select(SDK_KEYS.c.access_key).where(
                    SDK_KEYS.c.access_key == key.access_key)).first() is not None:
                raise AlreadyExists(f"access key {key.access_key!r} exists already")
            conn.execute(SDK_KEYS.insert().values(access_key=key.access_key, user_name=key.user,
                                                  sealed_secret=key.sealed_secret, created_ms=key.created_ms))
            _bump(conn)
        log.info("auth.sdk_key_created", user=key.user, access_key=key.access_key)
        return key

    def delete_sdk_key(self, access_key: str) -> None:
        with self._transaction(write=True) as conn:
            if conn.execute(SDK_KEYS.delete().where(SDK_KEYS.c.access_key == access_key)).rowcount == 0:
                raise NotFound(f"there is no SDK key {access_key!r}; `mqstore user sdk-key list` shows them")
            _bump(conn)
        log.info("auth.sdk_key_revoked", access_key=access_key)

    @contextlib.contextmanager
    def _transaction(self, write: bool = False) -> Iterator[sa.Connection]:
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**{_WRITE_OPTION: write})
                with conn.begin():
                    yield conn
        except (sa_exc.OperationalError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise Unavailable(f"auth database {self._url_text} is unavailable or stayed locked for "
                              f"{self._wait_timeout_ms} ms: {cause}; retry later") from exc


def _bump(conn: sa.Connection) -> None:
    conn.execute(SCHEMA.update().values(version=SCHEMA.c.version + 1))


def _sdk_key(row) -> SdkKey:
    return SdkKey(row.access_key, row.user_name, row.sealed_secret, row.created_ms)


def _no_user(name: str) -> NotFound:
    return NotFound(f"there is no user {name!r}; `mqstore user list` shows them")
