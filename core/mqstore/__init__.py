"""mqstore core: the storage engine, with no gRPC, generated stubs or Spark imports.

Map of the package:
  format/      every on-disk byte layout, one module each (record, consume queue entry, checkpoint)
  log/         commit log segments, append, flush, recovery, retention
  queue/       consume queues and the in-process dispatcher that builds them
  meta/        topic registry and consumer offsets through SQLAlchemy
  store.py     the MessageStore facade that services call
  errors.py    the one exception tree (mapped to gRPC status codes in mqstore_rpc)

Glossary (names carry units last):
  offset            a logical message number inside one topic queue (queue offset)
  physical offset   a byte address in the commit log's global address space
  position          a byte position inside one file (physical offset % segment size)
  segment           one commit log file, named by its first physical offset (20 digits)
  visible offset    the end of records that readers may see (written for ASYNC, flushed for SYNC)
"""
