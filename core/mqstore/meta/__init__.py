"""Topic registry and consumer group offsets, kept in SQL (SQLite file or PostgreSQL)."""

from mqstore.meta.sql import SCHEMA_VERSION, MetadataStore

__all__ = ["SCHEMA_VERSION", "MetadataStore"]
