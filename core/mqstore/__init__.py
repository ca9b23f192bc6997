"""mqstore core: the storage engine, with no gRPC, generated stubs or Spark imports.

One rule for where code lives: the domain of a feature (its state machine, its formats' use, its
rounds) is ``core/mqstore/<feature>/`` and knows no gRPC; ``services/<name>/`` holds composition
(``main.py``), the servicer and the adapters to other services (tests/test_layering.py).

Map of the package:
  format/      every on-disk byte layout, one module each (record, consume queue entry, checkpoint);
               record_reader and record_scan are the one reader of commit log records
  log/         commit log segments, append, flush, recovery, retention
  queue/       consume queues and the in-process dispatcher that builds them
  meta/        topic registry, earlier versions' consumer offsets, the transaction audit trail: the only SQL
  index/       the Index service's domain (IndexFile and RIP-65 files, queries, recovery)
  txn/         the Transaction service's domain (half messages, OP batches, check-back)
  compaction/  compaction topics' domain (compaction logs, rounds, latest values)
  message_keys.py  the message key rules every topic kind shares (compaction key and queue, tombstones)
  store.py     the MessageStore facade that services call: the write path, the read path and recovery of
               the log and its queues; it composes store_topics.py (topic registry), store_space.py (full
               disk) and store_retention.py (retention, holds), and runs its duties on background.py
  writers.py   the registry of system writers (owner, topics, checks) that the store asks; each feature
               registers its rules (system_writers.py composes them); no writer is known to the store
  access.py    the access model (users, rules, the decision): stored by meta/, used by auth/
  Layers (tests/test_layering_core.py): formats and shared pieces -> log/, queue/, meta/ -> the store ->
               features (pop/, txn/, compaction/, index/, gateway/, replication/, auth/...), no cycle
  follow.py    the Tail follower of the services derived from the log (index, compaction logs)
  background.py  the base of every background thread (Duty)
  fs.py        the only module that renames files: atomic replace, durable copy, staged install
  errors.py    the one exception tree (mapped to gRPC status codes in mqstore_rpc)

Glossary (names carry units last):
  offset            a logical message number inside one topic queue (queue offset)
  physical offset   a byte address in the commit log's global address space
  position          a byte position inside one file (physical offset % segment size)
  segment           one commit log file, named by its first physical offset (20 digits)
  visible offset    the end of records that readers may see (written for ASYNC, flushed for SYNC)
  min offset        two units, so always say which. On the log (CommitLog.min_offset,
                    StoreInfo.min_physical_offset): a physical offset, the first byte still held (the
                    first segment's start; retention raises it; StoreInfo's is the logical log's, which
                    with the object storage tier reaches below the local log: CommitLog.logical_min). On a consume queue
                    (ConsumeQueue.min_offset, QueueInfo.min_offset, PullResult.min_offset): an offset,
                    the first message still readable (log or topic retention raises it)
  msg_id            the offset message id: hex of the store host, its port and the physical offset;
                    GetMessage finds a record by it
  UNIQ_KEY          the client message id, a property the producer (or the server) sets; the Index
                    finds messages by it (QueryByUniqKeyRequest.uniq_key, which was named msg_id)
  resume offset     where a follower re-opens Tail: every record below it is applied; None means
                    "from the earliest record the log holds" (0 is an offset like any other)
"""
