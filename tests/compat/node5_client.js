// Drives the official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs) against a broker's
// gRPC port for tests/compat/test_grpc_node5.py.
//
//   node node5_client.js '<json>'
//
// The JSON names the operation ("op") and its arguments.  The script prints JSON lines on
// stdout: events while it runs ({"event": ...}) and, last, {"result": ...}; it exits 0, or
// prints the error to stderr and exits 1.  Every wait is bounded by "timeout" seconds.
//
// Common arguments: endpoint; request_timeout_ms (the client's request timeout, default 3000).
//
// Operations:
//   send         messages = [{body, tag, keys, properties, group, delay_ms}], max_attempts
//                -> {ids, receipts: [{id, offset, queue, deliver_at}]}
//   transaction  one half message, then decision commit or rollback -> {id, transaction_id}
//   half         one half message this process never decides: prints {"event": "half_sent"}
//                and waits (to be killed) until a line arrives on stdin
//   checker      a producer of topic whose checker answers check_answer (commit or rollback);
//                prints {"event": "ready"} once started and {"event": "checked", ...} per
//                check; runs until a line arrives on stdin -> {checked}
//   receive      a SimpleConsumer of group receives until count messages arrived, acking each
//                unless ack is false; with drain, then receives until a receive is empty
//                -> {messages}
//   push         a PushConsumer of group that fails the first delivery of each body in
//                fail_once, until count messages were consumed -> {messages, handled, fifo}
'use strict';

const {
  Producer, SimpleConsumer, PushConsumer, FilterExpression, ConsumeResult,
} = require('rocketmq-client-nodejs');
// The client's own protobuf module, for the checker's answer.
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const emit = doc => process.stdout.write(JSON.stringify(doc) + '\n');

// The client logs to a file under $HOME by default: warnings and errors go to stderr instead.
const logger = {
  info() {},
  debug() {},
  warn(...args) { process.stderr.write(`WARN ${args.map(String).join(' ')}\n`); },
  error(...args) { process.stderr.write(`ERROR ${args.map(String).join(' ')}\n`); },
};

function options(args) {
  return {
    endpoints: args.endpoint,
    namespace: '',
    requestTimeout: args.request_timeout_ms || 3000,
    logger,
  };
}

function build(topic, spec) {
  const m = { topic, body: Buffer.from(spec.body || 'hello') };
  if (spec.tag) m.tag = spec.tag;
  if (spec.keys) m.keys = Array.isArray(spec.keys) ? spec.keys : [ spec.keys ];
  if (spec.properties) m.properties = new Map(Object.entries(spec.properties));
  if (spec.group) m.messageGroup = spec.group;
  if (spec.delay_ms) m.deliveryTimestamp = new Date(Date.now() + spec.delay_ms);
  return m;
}

function view(m) {
  return {
    id: m.messageId,
    body: m.body.toString(),
    tag: m.tag === undefined ? null : m.tag,
    keys: [ ...m.keys ].sort(),
    properties: Object.fromEntries(m.properties),
    group: m.messageGroup === undefined ? null : m.messageGroup,
    attempt: m.deliveryAttempt,
    delivery_timestamp: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null,
    born_timestamp: m.bornTimestamp ? m.bornTimestamp.getTime() : null,
    corrupted: Boolean(m.corrupted), // the body digest did not match
    received_at: Date.now(),
  };
}

function deadline(args) {
  return Date.now() + (args.timeout || 30) * 1000;
}

function stdinLine(timeoutS) {
  return new Promise(resolve => {
    const timer = setTimeout(() => resolve(false), timeoutS * 1000);
    process.stdin.once('data', () => { clearTimeout(timer); resolve(true); });
  });
}

async function opSend(args) {
  const producer = new Producer({
    ...options(args), topic: args.topic, maxAttempts: args.max_attempts || 3,
  });
  await producer.startup();
  try {
    const receipts = [];
    for (const spec of args.messages) {
      const m = build(args.topic, spec);
      const r = await producer.send(m);
      receipts.push({
        id: r.messageId,
        offset: r.offset,
        queue: r.messageQueue.queueId,
        deliver_at: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null,
      });
    }
    return { ids: receipts.map(r => r.id), receipts };
  } finally {
    await producer.shutdown();
  }
}

function checkerOf(answer, seen) {
  return {
    async check(m) {
      seen.push({ message_id: m.messageId, body: m.body.toString(), tag: m.tag || null });
      emit({ event: 'checked', message_id: m.messageId, body: m.body.toString() });
      return answer === 'commit' ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
    },
  };
}

async function opTransaction(args) {
  const producer = new Producer({
    ...options(args), topic: args.topic, checker: checkerOf('rollback', []),
  });
  await producer.startup();
  try {
    const tx = producer.beginTransaction();
    const r = await producer.send(build(args.topic, args.message || {}), tx);
    if (args.decision === 'commit') await tx.commit();
    else await tx.rollback();
    return { id: r.messageId, transaction_id: r.transactionId };
  } finally {
    await producer.shutdown();
  }
}

async function opHalf(args) {
  // A checker that never answers (UNKNOWN): this producer leaves the half undecided.
  const checker = { async check() { return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED; } };
  const producer = new Producer({ ...options(args), topic: args.topic, checker });
  await producer.startup();
  const tx = producer.beginTransaction();
  const r = await producer.send(build(args.topic, args.message || {}), tx);
  emit({ event: 'half_sent', id: r.messageId, transaction_id: r.transactionId });
  await stdinLine(args.timeout || 30);
  // ends without deciding and without shutting down (no termination notice)
  return { id: r.messageId };
}

async function opChecker(args) {
  const seen = [];
  const producer = new Producer({
    ...options(args), topic: args.topic, checker: checkerOf(args.check_answer || 'commit', seen),
  });
  await producer.startup();
  try {
    emit({ event: 'ready' });
    await stdinLine(args.timeout || 30);
    return { checked: seen };
  } finally {
    await producer.shutdown();
  }
}

async function opReceive(args) {
  const consumer = new SimpleConsumer({
    ...options(args),
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, new FilterExpression(args.filter || '*') ]]),
    awaitDuration: (args.await_s || 2) * 1000,
  });
  await consumer.startup();
  const got = [];
  try {
    const end = deadline(args);
    while (got.length < args.count && Date.now() < end) {
      for (const m of await consumer.receive(32, (args.invisible_s || 15) * 1000)) {
        got.push(view(m));
        if (args.ack !== false) await consumer.ack(m);
      }
    }
    if (args.drain) {
      // until the broker has nothing more to hand out
      while (Date.now() < end) {
        const more = await consumer.receive(32, (args.invisible_s || 15) * 1000);
        if (more.length === 0) break;
        for (const m of more) {
          got.push(view(m));
          if (args.ack !== false) await consumer.ack(m);
        }
      }
    }
    return { messages: got };
  } finally {
    await consumer.shutdown();
  }
}

async function opPush(args) {
  const got = [];
  const handled = [];
  const failed = new Set();
  const failOnce = new Set(args.fail_once || []);
  let finish;
  const done = new Promise(resolve => { finish = resolve; });
  const consumer = new PushConsumer({
    ...options(args),
    consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, new FilterExpression(args.filter || '*') ]]),
    longPollingTimeout: 2000,
    messageListener: {
      async consume(m) {
        const body = m.body.toString();
        const fail = failOnce.has(body) && !failed.has(body);
        handled.push({ body, group: m.messageGroup || null, attempt: m.deliveryAttempt, failed: fail });
        if (fail) {
          failed.add(body);
          return ConsumeResult.FAILURE;
        }
        got.push({ body, attempt: m.deliveryAttempt });
        if (got.length >= args.count) finish();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  let timer;
  try {
    await Promise.race([ done, new Promise(resolve => { timer = setTimeout(resolve, (args.timeout || 30) * 1000); }) ]);
    return {
      messages: [ ...got ],
      handled: [ ...handled ],
      fifo: consumer.getPushConsumerSettings().isFifo(),
    };
  } finally {
    clearTimeout(timer);
    await consumer.shutdown();
  }
}

const OPS = {
  send: opSend,
  transaction: opTransaction,
  half: opHalf,
  checker: opChecker,
  receive: opReceive,
  push: opPush,
};

async function main() {
  const args = JSON.parse(process.argv[2]);
  try {
    const result = await OPS[args.op](args);
    emit({ result });
  } catch (err) {
    process.stderr.write(`${args.op} failed: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  }
  // the client keeps timers and streams open after shutdown: leave at once
  process.exit(0);
}

main();
