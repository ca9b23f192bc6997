// mqstore from Node.js: create a topic, append two messages with keys, pull them back.
//
//   node examples/node/example.js [ADDRESS] [TOPIC]       (default MQSTORE_ADDRESS or 127.0.0.1:50051, node-demo)
//
// The stubs are built at run time from protos/ by @grpc/proto-loader. Three options matter:
//   includeDirs: [protos/]  the include root: commitlog.proto imports "mqstore/v1/common.proto";
//   keepCase: true          field names as in the .proto (queue_id, msg_id), not camelCase;
//   longs: String           int64 fields (offsets, timestamps) as decimal strings: a JS number loses
//                           precision above 2^53. Send them as strings too ("0").
// Bodies are Buffers (bytes). Errors carry the status code, a message that names the field or limit,
// and the trailers mqstore-error (the error's kind) and mqstore-retriable.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTOS = path.resolve(__dirname, "..", "..", "protos");
const address = process.argv[2] || process.env.MQSTORE_ADDRESS || "127.0.0.1:50051";
const topic = process.argv[3] || "node-demo";
const DEADLINE_MS = 30000;

const definition = protoLoader.loadSync("mqstore/v1/commitlog.proto", {
  includeDirs: [PROTOS],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const mqstore = grpc.loadPackageDefinition(definition).mqstore.v1;
const client = new mqstore.CommitLog(address, grpc.credentials.createInsecure());

// One unary call as a promise, with a deadline.
function call(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + DEADLINE_MS }, (error, response) =>
      error ? reject(error) : resolve(response));
  });
}

async function main() {
  try {
    await call("CreateTopic", { name: topic, queue_count: 1 });
    console.log(`created topic ${topic}`);
  } catch (error) {
    if (error.code !== grpc.status.ALREADY_EXISTS) throw error;
    console.log(`topic ${topic} exists already`);
  }

  const appended = await call("Append", {
    topic,
    messages: [
      { body: Buffer.from("hello from node"), tags: "greeting", keys: ["order-1"] },
      { body: Buffer.from("second message"), keys: ["order-2", "customer-7"], properties: { lang: "en" } },
    ],
  });
  for (const r of appended.results) {
    console.log(`appended msg_id=${r.msg_id} uniq_key=${r.uniq_key} queue=${r.queue_id} ` +
                `offset=${r.queue_offset} ${r.durability}`);
  }

  const first = appended.results[0];
  const pulled = await call("Pull", {
    topic, queue_id: first.queue_id, offset: first.queue_offset, max_messages: 10,
  });
  for (const m of pulled.messages) {
    console.log(`pulled ${m.queue_id}:${m.queue_offset} msg_id=${m.msg_id} keys=${m.keys.join(",")} ` +
                `body=${m.body.toString("utf8")}`);
  }
  console.log(`next_offset=${pulled.next_offset} max_offset=${pulled.max_offset}`);
}

main()
  .catch((error) => {
    const trailers = error.metadata ? error.metadata.getMap() : {};
    console.error(`error: ${grpc.status[error.code] || error.code}: ${error.details || error.message}` +
                  (trailers["mqstore-error"] ? ` (mqstore-error=${trailers["mqstore-error"]}, ` +
                   `mqstore-retriable=${trailers["mqstore-retriable"]})` : ""));
    process.exitCode = 1;
  })
  .finally(() => client.close());
