"""The gateway's LogPort (mqstore.gateway.log) over gRPC, for Cluster mode: DescribeTopic, Append and the
Consumer service and RecallTimer of the CommitLog service, through one CommitLogClient (which follows a replication
group's leader).

Sends are CommitLogInternal.AppendBatches as writer "gateway" when the gateway has the commit log's internal
token (the record's born host is the producer's): concurrent sends coalesced into one call, each its own
batch with its own outcome, a lone send at once (mqstore.gateway.coalescing); else one public Append per
send (the born host is the gateway's: ``gateway.born_host_is_gateway`` is logged once, at start).

Thread-safe (the CommitLogClient is); the owner closes the client.
"""

from __future__ import annotations

import functools
from typing import Sequence

import structlog
from mqstore.gateway.coalescing import SendCoalescer
from mqstore.model import AppendResult, MessageIn, TopicRecord
from mqstore.relayed import WRITER_GATEWAY

from mqstore_rpc.commitlog_client import CommitLogClient

from .pop_client import PopClient

log = structlog.get_logger("gateway_service.remote_log")


class RemoteLog:
    def __init__(self, log_client: CommitLogClient, internal_token: str):
        self.pop = PopClient(log_client)  # the same nodes: pop consumption follows the commit log's leader
        self._topic = log_client.topic
        self._recall = log_client.recall_timer
        self.coalescer: SendCoalescer | None = None
        if internal_token:  # concurrent sends go together, one AppendBatches call (mqstore.gateway.coalescing)
            self.coalescer = SendCoalescer(functools.partial(log_client.internal_append_batches,
                                                             writer=WRITER_GATEWAY, token=internal_token))
            self._append = self.coalescer.append
        else:
            log.warning("gateway.born_host_is_gateway", reason="no internal token (MQSTORE_INTERNAL_TOKEN): sends "
                        "go through the public Append, which stores the gateway's address as every message's born "
                        "host")
            self._append = log_client.append

    def topic(self, name: str) -> TopicRecord:
        return self._topic(name)

    def append(self, topic: str, messages: list[MessageIn]) -> Sequence[AppendResult]:
        return self._append(topic, messages)

    def recall(self, topic: str, msg_id: str) -> int:
        return self._recall(topic, msg_id)

    def appends_at_once(self) -> bool:
        return False  # a call to the commit log's process
