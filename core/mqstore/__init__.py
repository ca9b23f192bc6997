"""mqstore core: the storage engine, with no gRPC, generated stubs or Spark imports.

Map of the package:
  format/      every on-disk byte layout, one module each (record, consume queue entry, checkpoint)
  log/         commit log segments, append, flush, recovery, retention
  queue/       consume queues and the in-process dispatcher that builds them
  meta/        topic registry and consumer offsets through SQLAlchemy
  store.py     the MessageStore facade that services call
  follow.py    the Tail follower of the services derived from the log (index, compaction logs)
  background.py  the base of every background thread (Duty)
  errors.py    the one exception tree (mapped to gRPC status codes in mqstore_rpc)

Glossary (names carry units last):
  offset            a logical message number inside one topic queue (queue offset)
  physical offset   a byte address in the commit log's global address space
  position          a byte position inside one file (physical offset % segment size)
  segment           one commit log file, named by its first physical offset (20 digits)
  visible offset    the end of records that readers may see (written for ASYNC, flushed for SYNC)
  msg_id            the offset message id: hex of the store host, its port and the physical offset;
                    GetMessage finds a record by it
  UNIQ_KEY          the client message id, a property the producer (or the server) sets; the Index
                    finds messages by it (QueryByUniqKeyRequest.uniq_key, which was named msg_id)
  resume offset     where a follower re-opens Tail: every record below it is applied; None means
                    "from the earliest record the log holds" (0 is an offset like any other)
"""
