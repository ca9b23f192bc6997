"""Pop consumption (RocketMQ 5's consume model) in the commit log process: the server owns each group's
progress, hands out messages with receipt handles and an invisible time, and delivers an unacked message
again with attempt + 1 (retry topic ``%RETRY%{group}+{topic}``), moving it to ``%DLQ%{group}`` after
``max_attempts``. consumer.proto is the contract.

The design is RocketMQ's revive design (the older broker path, PopReviveService), with the state in the
commit log itself so that it is replicated with it:

  step               written first (the durable fact)                then in memory
  ------------------ ----------------------------------------------- ----------------------------------
  receive            CK record in rmq_sys_REVIVE_LOG per queue read  in-flight entries; pop offsets
  ack                ACK record naming (CK, queue offset)            entries removed
  change invisible   a new CK for the one message                    entry replaced (old handle dead)
  expiry (revive)    the copy in %RETRY% (or %DLQ%), then an ACK     entry removed
  flush (1 s)        pop offsets + revive checkpoint: one record of  -
                     RMQ_SYS_CONSUMER_OFFSETS

At start the in-flight set and any pop offset not yet stored are rebuilt from the revive log from the
checkpoint (mqstore.pop.service.PopService.start). Why not commit only up to the lowest unacked
offset (the other design): one unacked message would pin its queue and every message after it would be
delivered again after a crash; with CK records only the messages in flight are.

An ordered group (mqstore.pop.ordered, its setting in mqstore.pop.settings) keeps each message group in
order: a message waits while one of its group is in flight, an expired one is delivered again in place
(no retry topic), and messages of a stalled group are held in its CKs so that other groups flow.

Modules: records (the CK/ACK layouts), ordered (the rule of ordered groups), ordered_read (their reads),
settings (group settings), handle (receipt handles), inflight (the set in memory), offsets (pop offsets),
copies (retry and DLQ copies), legacy (the migration from the legacy retry topic names), service
(PopService, the facade), revive (the background duty), config. Filters (tags, SQL92) are mqstore.filters.
"""
