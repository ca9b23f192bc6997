"""The official RocketMQ 5 Python client against mqstore's gateway, unchanged:
``.venv-rmq/bin/python examples/gateway/quickstart.py [ENDPOINT] [TOPIC]`` (default 127.0.0.1:8081, demo).

Sends three messages with a tag and keys, then receives and acknowledges them with a simple consumer.
The client is rocketmq-python-client 5.1.2 in its own venv (``make rmq-clients``); it logs under
$HOME/logs/rocketmq_python/.
"""

import sys

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

endpoint = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"
topic = sys.argv[2] if len(sys.argv) > 2 else "demo"
config = ClientConfiguration(endpoint, Credentials())

producer = Producer(config, (topic,))
producer.startup()
sent = set()
for i in range(3):
    message = Message()
    message.topic = topic
    message.body = f"hello from python {i}".encode()
    message.tag = "greeting"
    message.keys = f"order-{i}"
    receipt = producer.send(message)
    sent.add(receipt.message_id)
    print("sent", receipt.message_id)
producer.shutdown()

consumer = SimpleConsumer(config, "quickstart-python", {topic: FilterExpression("greeting")}, await_duration=5)
consumer.startup()
while sent:
    for message in consumer.receive(16, 30):
        print("received", message.message_id, message.body.decode(), "attempt", message.delivery_attempt)
        consumer.ack(message)
        sent.discard(message.message_id)
consumer.shutdown()
