// The official RocketMQ 5 Node.js client against a RayMQ broker's gRPC endpoint.
// Driven by tests/actors/grpc: one JSON object of arguments in argv[2], one JSON line of
// results on stdout. Nothing here knows RayMQ: it is what any Node.js service would run.
'use strict';
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const quiet = { info() {}, warn() {}, error(...a) { console.error(...a); }, debug() {} };

function clientOptions(a) {
  return {
    endpoints: a.endpoints,
    namespace: a.namespace || '',
    sessionCredentials: { accessKey: a.accessKey, accessSecret: a.secretKey },
    requestTimeout: 10000,
    logger: quiet,
  };
}

async function produce(a) {
  const producer = new Producer({ ...clientOptions(a), topics: [a.topic] });
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < a.count; i++) {
      const body = `${a.prefix}-${i}`;
      const receipt = await producer.send({
        topic: a.topic,
        tag: a.tag,
        keys: [`k-${i}`],
        body: Buffer.from(body),
      });
      sent.push({ id: receipt.messageId, body });
    }
  } finally {
    await producer.shutdown();
  }
  return { sent };
}

async function consume(a) {
  const consumer = new SimpleConsumer({
    ...clientOptions(a),
    consumerGroup: a.group,
    subscriptions: new Map().set(a.topic, a.tag || '*'),
    awaitDuration: a.awaitMs || 2000,
  });
  await consumer.startup();
  const got = [];
  const deadline = Date.now() + (a.timeoutMs || 30000);
  try {
    while (got.length < a.count && Date.now() < deadline) {
      const messages = await consumer.receive(16, a.invisibleMs || 10000);
      for (const m of messages) {
        got.push({ id: m.messageId, body: m.body.toString(), tag: m.tag || null });
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { got };
}

const modes = { produce, consume };
const args = JSON.parse(process.argv[2]);
modes[args.mode](args)
  .then((out) => {
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exit(0);
  })
  .catch((err) => {
    process.stdout.write(JSON.stringify({ error: String(err && (err.stack || err)), code: err && err.code }) + '\n');
    process.exit(1);
  });
