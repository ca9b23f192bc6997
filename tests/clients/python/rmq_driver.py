"""Drives the official RocketMQ 5 Python client (rocketmq-python-client, pinned in
requirements-rmq-client.lock) for mqstore's gateway tests: ``.venv-rmq/bin/python rmq_driver.py ENDPOINT``.

It runs in its own interpreter, the client's venv: the client's generated apache.rocketmq.v2 modules
clash with mqstore's own stubs of the same protos in one process. The client is used as its users use
it, unchanged. Commands come as JSON lines on stdin, one reply per command as a JSON line on stdout
(``{"id": n, "ok": true, ...}`` or ``{"id": n, "ok": false, "error": ..., "code": ...}``); a transaction
check from the server prints an event line ``{"event": "check", ...}`` at any time. The same commands
as tests/clients/node/driver.js:

  producer   {topics, check_answer}          start a Producer with a TransactionChecker answering check_answer
  send       {topic, body, tag, keys, group, properties}       one message (group: a FIFO message group); its
                                             message_id, offset and recall_handle (DELAY messages)
  send_many  {topic, count, body_bytes}      count sends in a loop; the elapsed seconds
  send_stream {topic, count, prefix}        count sends, one event per result ("sent" with its message id, or
                                             "send_failed"): a crash test kills a service in the middle
  half       {topic, body, tag, keys}        a transactional message, left open: its transaction as "tx"
  end        {tx, decision}                  commit or rollback a transaction of "half"
  answer     {check_answer}                  what the checker answers from now on (COMMIT, ROLLBACK, UNKNOWN)
  recall     {topic, recall_handle}          cancel a DELAY message (Producer.recall_message); its message_id
  consumer   {group, topic, tag, sql, await_s}  start a SimpleConsumer (tag: a tag expression, "*" for all;
                                             sql: an SQL92 expression instead, FilterType.SQL)
  receive    {max, invisible_s}              receive; each message with a "handle" (a key into this driver)
  ack        {handle, receipt_handle?}       ack a received message (receipt_handle: ack with that one instead)
  change     {handle, invisible_s}           ChangeInvisibleDuration; the new receipt handle
  push       {group, topic, fail, expect, wait_s, work_s}  a PushConsumer (Python only): every message is
                                             consumed (an event "consumed" as it starts; bodies in fail fail
                                             their first delivery; each takes work_s); returns once expect
                                             deliveries succeeded, with "fifo": subscription.fifo as the
                                             client took it from the gateway's settings
  shutdown   {}                              shut the clients down and exit

With RMQ_ACCESS_KEY and RMQ_SECRET_KEY in the environment the clients sign their requests with them (SDK
credentials); without, they send none.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message, MessageListener,
                      Producer, PushConsumer, SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import FilterType

OUT_LOCK = threading.Lock()
RESOLUTIONS = {"COMMIT": TransactionResolution.COMMIT, "ROLLBACK": TransactionResolution.ROLLBACK,
               "UNKNOWN": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED}


def emit(item: dict) -> None:
    with OUT_LOCK:
        sys.stdout.write(json.dumps(item) + "\n")
        sys.stdout.flush()


class Checker(TransactionChecker):
    def __init__(self, answer: str):
        self.answer = answer

    def check(self, message: Message) -> TransactionResolution:
        answer = self.answer
        emit({"event": "check", "message_id": message.message_id, "topic": message.topic,
              "body": message.body.decode(), "answer": answer})
        return RESOLUTIONS[answer]


class Listener(MessageListener):
    """Consumes everything; a body named in ``fail`` fails its first delivery (a nack: delivered again);
    ``work_s``: each consumption takes that long (a slow consumer: longer than the invisible time, it
    needs the server to renew it)."""

    def __init__(self, fail: set[str], expect: int, work_s: float = 0.0):
        self.fail, self.expect, self.work_s = fail, expect, work_s
        self.succeeded = 0
        self.done = threading.Event()

    def consume(self, message: Message) -> ConsumeResult:
        body = message.body.decode()
        failing = body in self.fail and message.delivery_attempt == 1
        emit({"event": "consumed", "message_id": message.message_id, "body": body,
              "attempt": message.delivery_attempt, "failed": failing})
        if self.work_s:
            time.sleep(self.work_s)  # the consumer's work itself, not a synchronisation
        if failing:
            return ConsumeResult.FAILURE
        self.succeeded += 1
        if self.succeeded >= self.expect:
            self.done.set()
        return ConsumeResult.SUCCESS


class Driver:
    def __init__(self, endpoint: str):
        # SDK credentials from the environment (the gateway's signed-request tests), else none.
        credentials = Credentials(os.environ.get("RMQ_ACCESS_KEY", ""), os.environ.get("RMQ_SECRET_KEY", ""))
        self.config = ClientConfiguration(endpoint, credentials, request_timeout=10)
        self.producer: Producer | None = None
        self.consumer: SimpleConsumer | None = None
        self.checker = Checker("COMMIT")
        self.transactions: dict[str, object] = {}
        self.messages: dict[str, Message] = {}
        self.handles = 0

    def producer_(self, c):
        self.checker.answer = c.get("check_answer", "COMMIT")
        self.producer = Producer(self.config, tuple(c["topics"]), checker=self.checker)
        self.producer.startup()
        return {}

    def _message(self, c) -> Message:
        m = Message()
        m.topic = c["topic"]
        m.body = c["body"].encode()
        if c.get("tag"):
            m.tag = c["tag"]
        for key in c.get("keys") or ():
            m.keys = key  # the setter adds one key to the message's set
        if c.get("group"):
            m.message_group = c["group"]
        for name, value in (c.get("properties") or {}).items():
            m.add_property(name, value)
        if c.get("delivery_timestamp"):
            m.delivery_timestamp = c["delivery_timestamp"]  # 5.1.2 puts it into Timestamp.seconds as it is
        return m

    def send(self, c):
        receipt = self.producer.send(self._message(c))
        return {"message_id": receipt.message_id, "offset": receipt.offset,
                "recall_handle": receipt.recall_handle or ""}

    def recall(self, c):
        return {"message_id": self.producer.recall_message(c["topic"], c["recall_handle"])}

    def send_many(self, c):
        body = "x" * c.get("body_bytes", 1024)
        start = time.perf_counter()
        for _ in range(c["count"]):
            self.producer.send(self._message({"topic": c["topic"], "body": body}))
        return {"elapsed_s": time.perf_counter() - start}

    def send_stream(self, c):
        sent = failed = 0
        for i in range(c["count"]):
            body = f"{c.get('prefix', 'm')}-{i}"
            try:
                receipt = self.producer.send(self._message({"topic": c["topic"], "body": body}))
            except Exception as exc:  # noqa: BLE001 - a send refused while a service is down: reported, go on
                failed += 1
                emit({"event": "send_failed", "body": body, "error": f"{type(exc).__name__}: {exc}"})
                continue
            sent += 1
            emit({"event": "sent", "body": body, "message_id": receipt.message_id})
        return {"sent": sent, "failed": failed}

    def half(self, c):
        transaction = self.producer.begin_transaction()
        receipt = self.producer.send(self._message(c), transaction)
        self.transactions[receipt.transaction_id] = transaction
        return {"message_id": receipt.message_id, "tx": receipt.transaction_id}

    def end(self, c):
        transaction = self.transactions.pop(c["tx"])
        (transaction.commit if c["decision"] == "commit" else transaction.rollback)()
        return {}

    def answer(self, c):
        self.checker.answer = c["check_answer"]
        return {}

    def consumer_(self, c):
        expression = (FilterExpression(c["sql"], FilterType.SQL) if c.get("sql")
                      else FilterExpression(c.get("tag", "*")))
        self.consumer = SimpleConsumer(self.config, c["group"], {c["topic"]: expression},
                                       await_duration=c.get("await_s", 5))
        self.consumer.startup()
        return {}

    def receive(self, c):
        out = []
        for m in self.consumer.receive(c.get("max", 16), c.get("invisible_s", 30)):
            self.handles += 1
            handle = str(self.handles)
            self.messages[handle] = m
            out.append({"handle": handle, "message_id": m.message_id, "topic": m.topic, "body": m.body.decode(),
                        "tag": m.tag, "keys": sorted(m.keys or ()), "attempt": m.delivery_attempt,
                        "receipt_handle": m.receipt_handle, "group": m.message_group,
                        "properties": dict(m.properties or {}), "corrupted": m.corrupted,
                        "delivery_timestamp": m.delivery_timestamp})
        return {"messages": out}

    def ack(self, c):
        m = self.messages[c["handle"]]
        if c.get("receipt_handle"):
            m.receipt_handle = c["receipt_handle"]
        self.consumer.ack(m)
        return {}

    def change(self, c):
        m = self.messages[c["handle"]]
        self.consumer.change_invisible_duration(m, c["invisible_s"])
        return {"receipt_handle": m.receipt_handle}

    def push(self, c):
        listener = Listener(set(c.get("fail", ())), c["expect"], c.get("work_s", 0.0))
        consumer = PushConsumer(self.config, c["group"], listener, {c["topic"]: FilterExpression("*")})
        consumer.startup()
        try:
            complete = listener.done.wait(c.get("wait_s", 60))
            # fifo: what the gateway's settings told the client (subscription.fifo), kept in a private field
            return {"complete": complete, "succeeded": listener.succeeded,
                    "fifo": getattr(consumer, "_PushConsumer__fifo", None)}
        finally:
            consumer.shutdown()

    def shutdown(self, c):
        for client in (self.producer, self.consumer):
            if client is not None:
                client.shutdown()
        return {}


def main() -> int:
    driver = Driver(sys.argv[1])
    emit({"event": "ready"})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            reply = getattr(driver, op + "_" if op in ("producer", "consumer") else op)(command)
            emit({"id": command["id"], "ok": True, **reply})
        except Exception as exc:  # noqa: BLE001 - every client failure is the test's to judge
            code = getattr(exc, "code", None)  # the client's exceptions: a number; a grpc error: a method
            emit({"id": command["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                  "code": str(code()) if callable(code) else code, "trace": traceback.format_exc(limit=3)})
        if op == "shutdown":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
