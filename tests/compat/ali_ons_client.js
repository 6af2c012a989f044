// Drives the npm package ali-ons (a pure JavaScript RocketMQ remoting client) for the
// compatibility tests.  One JSON line per result on stdout; a failure exits non-zero.
//
//   node ali_ons_client.js send ADDR TOPIC COUNT [TAGS] [PREFIX]
//   node ali_ons_client.js push ADDR TOPIC GROUP EXPECT [TIMEOUT_S]
'use strict';

const { Producer, Consumer, Message } = require('ali-ons');
const httpclient = require('urllib');

const emit = doc => process.stdout.write(JSON.stringify(doc) + '\n');
const common = addr => ({
  httpclient,
  nameSrv: addr,
  accessKeyId: 'compat-test',
  accessKeySecret: 'compat-test',
  heartbeatBrokerInterval: 2000,
  rebalanceInterval: 2000,
});

async function send(addr, topic, count, tags, prefix) {
  const producer = new Producer({ ...common(addr), producerGroup: 'ali-ons-producer' });
  await producer.ready();
  try {
    for (let i = 0; i < count; i++) {
      const msg = new Message(topic, tags || '', `${prefix}-${i}`);
      msg.keys = [ `${prefix}-key-${i}` ];
      const r = await producer.send(msg);
      emit({ i, status: r.sendStatus, msg_id: r.msgId, queue_id: r.messageQueue.queueId });
    }
  } finally {
    await producer.close();
  }
}

async function push(addr, topic, group, expect, timeoutS) {
  const consumer = new Consumer({
    ...common(addr),
    consumerGroup: group,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
  });
  let count = 0;
  const done = new Promise(resolve => {
    consumer.subscribe(topic, '*', async msg => {
      count++;
      emit({ event: 'received', body: msg.body.toString(), tags: msg.tags, msg_id: msg.msgId,
        queue_id: msg.queueId, queue_offset: msg.queueOffset });
      if (count >= expect) resolve();
    });
  });
  // ali-ons reports, among others, QUERY_NOT_FOUND for a new group's empty queues as an
  // 'error' event and goes on (as it does against RocketMQ): log, do not stop.
  consumer.on('error', err => process.stderr.write(`consumer error: ${err && err.message}\n`));
  await consumer.ready();
  const timer = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`received ${count} of ${expect} within ${timeoutS}s`)),
      timeoutS * 1000));
  try {
    await Promise.race([ done, timer ]);
  } finally {
    await consumer.close();
  }
  emit({ event: 'done', count });
}

async function main() {
  const [ cmd, ...args ] = process.argv.slice(2);
  if (cmd === 'send') {
    await send(args[0], args[1], Number(args[2]), args[3], args[4] || 'ons');
  } else if (cmd === 'push') {
    await push(args[0], args[1], args[2], Number(args[3]), Number(args[4] || 60));
  } else {
    throw new Error(`unknown command ${cmd}`);
  }
  process.exit(0);
}

main().catch(err => {
  process.stderr.write(`${err && err.stack || err}\n`);
  process.exit(3);
});
