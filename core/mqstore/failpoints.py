"""Named crash points. No-ops unless a test arms them (in-process or via MQSTORE_FAILPOINTS).

``hit("name")`` is placed at each crash-relevant step. Armed actions: ``"raise"`` raises
FailpointHit, ``"exit"`` kills the process at once with ``os._exit(137)`` (like kill -9: no flush, no
cleanup). A server started with ``MQSTORE_FAILPOINTS="log.after_write=exit"`` arms them at start;
only ``main()`` reads that variable.
"""

from __future__ import annotations

import os

KNOWN = frozenset({
    "log.after_write",           # records copied into the segment, before any flush
    "log.after_flush",           # an fsync finished, before waiters are released
    "checkpoint.before_rename",  # temp checkpoint written and fsynced, not yet renamed
    "segment.after_create",      # a new segment file exists, not yet in use
    "repair.after_copy",         # .broken copy written, log not yet truncated
    "index.checkpoint.before_rename",  # temp index checkpoint written and fsynced, not yet renamed
    "index.roll.after_create",   # next index file created empty, the message not yet put
    "index.compact.after_write",  # compact temp file written and fsynced, not yet renamed
    "index.compact.after_rename",  # compact file in place, unsealed source not yet deleted
    "index.tier.started",        # a tier move's STARTED (fresh key) is in the manifest, nothing put yet
    "index.tier.after_put",      # the object is put, not yet verified nor FINISHED (the local copy stays)
    "index.tier.finished",       # FINISHED is in the manifest, the local copy not yet deleted
    "index.tier_manifest.snapshot_written",  # the tier manifest's new snapshot is durable, its log not yet truncated
    "index.rebuild.after_rename",  # rebuilt files renamed into place, .damaged not yet deleted
    "compaction.round.staged",   # a round's output complete in staging/, its install not begun
    "compaction.roll.sealed",    # the active compaction segment sealed and synced, the next not yet created
    "compaction.tier.started",   # a segment's upload STARTED (fresh key) is in the tier's manifest, nothing put yet
    "compaction.tier.after_put",  # its object is put, the upload not yet FINISHED (the local .log stays)
    "compaction.tier.finished",  # FINISHED is in the manifest, local retention not yet applied
    "compaction.tier_manifest.snapshot_written",  # the tier manifest's snapshot is put, older objects not deleted
    "compaction.topic.dropping",  # a deleted topic's queues closed, its directory not yet renamed
    "compaction.topic.renamed",  # its directory renamed to <topic>.deleted (durably), not yet removed
    # fs.install (the staged install; its docstring has the steps), each hit after every file of its step:
    "fs.install.staged",         # a staged file moved to <name>.cleaned
    "fs.install.manifest_written",  # the manifest is durable, nothing renamed to .swap yet
    "fs.install.swapped",        # a .cleaned file renamed to .swap (after the last one: committed)
    "fs.install.committed",      # every .swap rename durable, old files untouched
    "fs.install.old_deleted",    # an old file renamed to .deleted
    "fs.install.renamed",        # a .swap file renamed to its name
    "fs.install.cleaned_up",     # a .deleted file removed, the manifest not yet
    # DeleteTopic (mqstore.store_topics has the steps; a delete cut short is resumed at start):
    "topic.delete.marked",       # the row is marked deleting and the topic hidden, nothing announced
    "topic.delete.announced",    # the DELETED event is in the log (flushed), the queues not yet dropped
    "topic.delete.queues_dropped",  # the consume queues are gone, the row not yet deleted
    # the Transaction service (services/txn; txn.proto says what a crash at each step means):
    "txn.prepare.after_half",    # the halves are appended, Prepare not yet answered
    "txn.commit.before_real",    # a commit decided (its guard held), the real messages not yet appended
    "txn.commit.after_real",     # the real messages are appended, no OP entry queued, not answered
    "txn.op.before_write",       # an OP batch is taken (mid batch: entries pending), not yet appended
    "txn.op.after_write",        # the OP message is appended, its entries not yet dropped
    "txn.checkpoint.before_rename",  # temp txn checkpoint written and fsynced, not yet renamed
    # replication (core/mqstore/replication/README.md says what a crash at each step leaves):
    "replication.epochs.before_rename",  # temp epoch file written and fsynced, not yet renamed
    "replication.truncate.after_copy",   # .broken copies of a diverged tail durable, the log not yet cut
    # pop consumption (core/mqstore/pop; consumer.proto says what a crash at each step means):
    "pop.receive.after_ck",      # a receive's CK records are appended, nothing in flight in memory, not answered
    "pop.ack.after_record",      # an ACK record is appended, the entries not yet ended in memory, not answered
    "pop.change.after_ck",       # ChangeInvisibleDuration's new CK is appended, the entry not yet replaced
    "pop.forward.after_copy",    # ForwardToDeadLetter's DLQ copy and ACK are appended, not answered
    "pop.revive.after_copy",     # expired messages copied to a retry topic or DLQ, their ACK not yet written
    # the object storage tier's uploader (mqstore.tier.uploader says what a crash at each step leaves):
    "tier.upload.started",       # a segment's STARTED record is appended, its object not yet put
    "tier.upload.after_put",     # the object is put, not yet read back nor FINISHED
    "tier.upload.queue_file.started",    # a consume queue file's STARTED record is appended, its object not put
    "tier.upload.queue_file.after_put",  # a consume queue file's object is put, not yet FINISHED
    "tier.retention.after_delete",  # an expired segment's object is deleted, its DELETED not yet recorded
})

_armed: dict[str, str] = {}


class FailpointHit(RuntimeError):
    """Raised by an armed failpoint with action 'raise'."""


def arm(name: str, action: str = "raise") -> None:
    if name not in KNOWN:
        raise ValueError(f"unknown failpoint {name!r}; known: {sorted(KNOWN)}")
    if action not in ("raise", "exit"):
        raise ValueError(f"failpoint action must be 'raise' or 'exit', not {action!r}")
    _armed[name] = action


def disarm_all() -> None:
    _armed.clear()


def arm_from_spec(spec: str) -> None:
    """Parse 'name=action,name2=action2'."""
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        arm(name, action or "raise")


def hit(name: str) -> None:
    if not _armed:
        return
    action = _armed.get(name)
    if action == "raise":
        raise FailpointHit(name)
    if action == "exit":
        os._exit(137)
