"""Topic registry, kept in SQL (SQLite file or PostgreSQL); the consumer offsets of earlier versions, read once."""

from mqstore.meta.sql import SCHEMA_VERSION, MetadataStore

__all__ = ["SCHEMA_VERSION", "MetadataStore"]
