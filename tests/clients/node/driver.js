// Drives the official RocketMQ 5 Node client (rocketmq-client-nodejs, pinned in package.json and
// package-lock.json of this folder; `npm ci` installs it) for mqstore's gateway tests:
// `node driver.js ENDPOINT`. The client is used as its users use it, unchanged. Commands come as JSON
// lines on stdin, one reply per command as a JSON line on stdout ({"id": n, "ok": true, ...} or
// {"id": n, "ok": false, "error": ...}); a transaction check from the server prints an event line
// {"event": "check", ...} at any time. The same commands as tests/clients/python/rmq_driver.py
// (see there): producer, send, send_many, send_stream, half, end, answer, recall, consumer, receive, ack,
// change, shutdown. With RMQ_ACCESS_KEY and RMQ_SECRET_KEY in the environment the clients sign their requests with
// them (SDK credentials); without, they send none.
'use strict';

const readline = require('node:readline');
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { FilterType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const RESOLUTIONS = {
  COMMIT: TransactionResolution.COMMIT,
  ROLLBACK: TransactionResolution.ROLLBACK,
  UNKNOWN: TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
};

function emit(item) {
  process.stdout.write(JSON.stringify(item) + '\n');
}

class Driver {
  constructor(endpoint) {
    this.endpoint = endpoint;
    // SDK credentials from the environment (the gateway's signed-request tests), else none.
    this.credentials = process.env.RMQ_ACCESS_KEY
      ? { accessKey: process.env.RMQ_ACCESS_KEY, accessSecret: process.env.RMQ_SECRET_KEY || '' } : undefined;
    this.checkAnswer = 'COMMIT';
    this.transactions = new Map();
    this.messages = new Map();
    this.handles = 0;
  }

  async producer(c) {
    this.checkAnswer = c.check_answer || 'COMMIT';
    const checker = {
      check: async messageView => {
        const answer = this.checkAnswer;
        emit({ event: 'check', message_id: messageView.messageId, topic: messageView.topic,
          body: messageView.body.toString(), answer });
        return RESOLUTIONS[answer];
      },
    };
    this.producerClient = new Producer({ endpoints: this.endpoint, namespace: '', topics: c.topics, checker,
      requestTimeout: 10000, sessionCredentials: this.credentials });
    await this.producerClient.startup();
    return {};
  }

  message(c) {
    const m = { topic: c.topic, body: Buffer.from(c.body) };
    if (c.tag) m.tag = c.tag;
    if (c.keys) m.keys = c.keys;
    if (c.group) m.messageGroup = c.group;
    if (c.properties) m.properties = new Map(Object.entries(c.properties));
    if (c.delay_ms) m.delay = c.delay_ms;
    return m;
  }

  async send(c) {
    const receipt = await this.producerClient.send(this.message(c));
    return { message_id: receipt.messageId, offset: Number(receipt.offset), recall_handle: receipt.recallHandle || '' };
  }

  async recall(c) {
    const receipt = await this.producerClient.recallMessage(c.topic, c.recall_handle);
    return { message_id: receipt.messageId };
  }

  async send_many(c) {
    const body = 'x'.repeat(c.body_bytes || 1024);
    const start = process.hrtime.bigint();
    for (let i = 0; i < c.count; i++) {
      await this.producerClient.send(this.message({ topic: c.topic, body }));
    }
    return { elapsed_s: Number(process.hrtime.bigint() - start) / 1e9 };
  }

  async send_stream(c) {
    let sent = 0;
    let failed = 0;
    for (let i = 0; i < c.count; i++) {
      const body = `${c.prefix || 'm'}-${i}`;
      try {
        const receipt = await this.producerClient.send(this.message({ topic: c.topic, body }));
        sent++;
        emit({ event: 'sent', body, message_id: receipt.messageId });
      } catch (err) {
        failed++;
        emit({ event: 'send_failed', body, error: String(err && err.message || err) });
      }
    }
    return { sent, failed };
  }

  async half(c) {
    const transaction = this.producerClient.beginTransaction();
    const receipt = await this.producerClient.send(this.message(c), transaction);
    this.transactions.set(receipt.transactionId, transaction);
    return { message_id: receipt.messageId, tx: receipt.transactionId };
  }

  async end(c) {
    const transaction = this.transactions.get(c.tx);
    this.transactions.delete(c.tx);
    await (c.decision === 'commit' ? transaction.commit() : transaction.rollback());
    return {};
  }

  async answer(c) {
    this.checkAnswer = c.check_answer;
    return {};
  }

  async consumer(c) {
    const filter = c.sql ? new FilterExpression(c.sql, FilterType.SQL) : new FilterExpression(c.tag || '*');
    const subscriptions = new Map([ [ c.topic, filter ] ]);
    this.consumerClient = new SimpleConsumer({ endpoints: this.endpoint, namespace: '', consumerGroup: c.group,
      subscriptions, awaitDuration: (c.await_s || 5) * 1000, requestTimeout: 10000,
      sessionCredentials: this.credentials });
    await this.consumerClient.startup();
    return {};
  }

  async receive(c) {
    const views = await this.consumerClient.receive(c.max || 16, (c.invisible_s || 30) * 1000);
    const messages = views.map(m => {
      const handle = String(++this.handles);
      this.messages.set(handle, m);
      return { handle, message_id: m.messageId, topic: m.topic, body: m.body.toString(), tag: m.tag || null,
        keys: [ ...m.keys ].sort(), attempt: m.deliveryAttempt, receipt_handle: m.receiptHandle,
        group: m.messageGroup || null, properties: Object.fromEntries(m.properties), corrupted: !!m.corrupted,
        delivery_timestamp: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null };
    });
    return { messages };
  }

  async ack(c) {
    const m = this.messages.get(c.handle);
    if (c.receipt_handle) m.receiptHandle = c.receipt_handle;
    await this.consumerClient.ack(m);
    return {};
  }

  async change(c) {
    const m = this.messages.get(c.handle);
    await this.consumerClient.changeInvisibleDuration(m, c.invisible_s * 1000);
    return { receipt_handle: m.receiptHandle };
  }

  async shutdown() {
    for (const client of [ this.producerClient, this.consumerClient ]) {
      if (client) await client.shutdown();
    }
    return {};
  }
}

async function main() {
  const driver = new Driver(process.argv[2]);
  emit({ event: 'ready' });
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const command = JSON.parse(line);
    try {
      const reply = await driver[command.op](command);
      emit({ id: command.id, ok: true, ...reply });
    } catch (err) {
      emit({ id: command.id, ok: false, error: String(err && err.message || err), code: err && err.code || null });
    }
    if (command.op === 'shutdown') break;
  }
  process.exit(0);
}

main();
