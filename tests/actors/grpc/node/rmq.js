// The official RocketMQ 5 Node.js client against a RayMQ broker's gRPC endpoint.
// Driven by tests/actors/grpc: one JSON object of arguments in argv[2], one JSON line of
// results on stdout. Nothing here knows RayMQ: it is what any Node.js service would run.
'use strict';
const {
  ConsumeResult,
  LitePushConsumerImpl,
  Producer,
  SimpleConsumer,
} = require('rocketmq-client-nodejs');

const quiet = { info() {}, warn() {}, error(...a) { console.error(...a); }, debug() {} };
const loud = {
  info(...a) { console.error('INFO', ...a); },
  warn(...a) { console.error('WARN', ...a); },
  error(...a) { console.error('ERROR', ...a); },
  debug(...a) { console.error('DEBUG', ...a); },
};

function clientOptions(a) {
  return {
    endpoints: a.endpoints,
    namespace: a.namespace || '',
    sessionCredentials: { accessKey: a.accessKey, accessSecret: a.secretKey },
    requestTimeout: 10000,
    logger: a.debug ? loud : quiet,
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

// A LitePushConsumer of a LITE parent (bindTopic): subscribes a.liteTopics (and says so on a
// line of its own, so the caller sends after it), collects what
// its listener is given until a.count messages came or a.timeoutMs ran out, then waits
// up to a.waitGoneMs for the broker's NotifyUnsubscribeLiteCommand (after a delete or an
// expiry) naming each of a.waitGone: `notified`, and `left`, those still in its set.
async function litePush(a) {
  const got = [];
  // the 1.0.8 client's Telemetry session does not hand NotifyUnsubscribeLiteCommand to the
  // consumer (it logs it as unrecognized): the lite topics it names are read from that log
  const notified = [];
  const base = clientOptions(a).logger;
  const logger = {
    ...base,
    warn(...args) {
      for (const x of args) {
        const name = x && x.notifyUnsubscribeLiteCommand && x.notifyUnsubscribeLiteCommand.liteTopic;
        if (name) notified.push(name);
      }
      base.warn(...args);
    },
  };
  const consumer = new LitePushConsumerImpl({
    ...clientOptions(a),
    logger,
    consumerGroup: a.group,
    bindTopic: a.topic,
    subscriptions: new Map(),
    messageListener: {
      consume(m) {
        got.push({ lite: m.liteTopic || null, body: m.body.toString(), id: m.messageId });
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  let left = [];
  try {
    for (const t of a.liteTopics) await consumer.subscribeLite(t);
    process.stdout.write(JSON.stringify({ subscribed: a.liteTopics }) + '\n');
    const deadline = Date.now() + (a.timeoutMs || 30000);
    while (got.length < a.count && Date.now() < deadline) await sleep(50);
    if (a.waitGone && a.waitGone.length) {
      const until = Date.now() + (a.waitGoneMs || 20000);
      const still = () => a.waitGone.filter((t) => !notified.includes(t));
      while (still().length && Date.now() < until) await sleep(50);
      left = a.waitGone.filter((t) => consumer.getLiteTopicSet().has(t));
    }
  } finally {
    await consumer.shutdown();
  }
  return { got, left, notified };
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

const modes = { produce, consume, litePush };
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
