// The official RocketMQ 5 Node client against mqstore's gateway, unchanged:
// `NODE_PATH=tests/clients/node/node_modules node examples/gateway/quickstart.js [ENDPOINT] [TOPIC]`
// (default 127.0.0.1:8081, demo). Sends three messages with a tag and keys, then receives and
// acknowledges them with a simple consumer. The client is rocketmq-client-nodejs 1.0.8, pinned in
// tests/clients/node/package-lock.json (`make rmq-clients`); it logs under $HOME/logs/rocketmq/.
'use strict';

const { Producer, SimpleConsumer, FilterExpression, getDefaultLogger } = require('rocketmq-client-nodejs');

const endpoints = process.argv[2] || '127.0.0.1:8081';
const topic = process.argv[3] || 'demo';

// A client's shutdown() closes its logger and then logs once more (Producer.shutdown in 1.0.8), which
// prints "log stream had been closed" with a stack trace. So both clients share one logger (the client's
// own file logger) that they cannot close, and it is closed here, once both have shut down.
const fileLogger = getDefaultLogger();
const logger = {
  debug: (...args) => fileLogger.debug(...args),
  info: (...args) => fileLogger.info(...args),
  warn: (...args) => fileLogger.warn(...args),
  error: (...args) => fileLogger.error(...args),
};

async function main() {
  const producer = new Producer({ endpoints, namespace: '', topics: [ topic ], logger });
  await producer.startup();
  const sent = new Set();
  for (let i = 0; i < 3; i++) {
    const receipt = await producer.send({ topic, tag: 'greeting', keys: [ `order-${i}` ],
      body: Buffer.from(`hello from node ${i}`) });
    sent.add(receipt.messageId);
    console.log('sent', receipt.messageId);
  }
  await producer.shutdown();

  const consumer = new SimpleConsumer({ endpoints, namespace: '', consumerGroup: 'quickstart-node', logger,
    subscriptions: new Map([ [ topic, new FilterExpression('greeting') ] ]), awaitDuration: 5000 });
  await consumer.startup();
  while (sent.size > 0) {
    for (const message of await consumer.receive(16, 30000)) {
      console.log('received', message.messageId, message.body.toString(), 'attempt', message.deliveryAttempt);
      await consumer.ack(message);
      sent.delete(message.messageId);
    }
  }
  await consumer.shutdown();
}

main().then(() => 0, err => { console.error(err); return 1; })
  .then(status => { fileLogger.close(); process.exit(status); });
