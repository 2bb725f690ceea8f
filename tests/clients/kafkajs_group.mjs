// A kafkajs consumer group: MEMBERS consumers in GROUP read TOPIC until
// EXPECTED distinct values are seen, committing as they go; prints one JSON
// line {values: [[value, member], ...], members: {member: partitions}}.
// Usage: node kafkajs_group.mjs BOOTSTRAP TOPIC GROUP EXPECTED [MEMBERS]
import kafkajs from "kafkajs";

const { Kafka, logLevel } = kafkajs;
const [bootstrap, topic, groupId, expectedArg, membersArg] = process.argv.slice(2);
const expected = Number(expectedArg);
const members = Number(membersArg || 2);
const kafka = new Kafka({
  clientId: "kaas-e2e-kafkajs",
  brokers: [bootstrap],
  logLevel: logLevel.WARN,
  retry: { retries: 10, initialRetryTime: 100 },
});

const values = [];
const distinct = new Set();
const assigned = {};
let done;
const finished = new Promise((r) => (done = r));
const deadline = setTimeout(() => done("timeout"), 90_000);

const consumers = [];
for (let i = 0; i < members; i++) {
  const c = kafka.consumer({ groupId, sessionTimeout: 10_000, heartbeatInterval: 500, maxWaitTimeInMs: 100 });
  c.on(c.events.GROUP_JOIN, (e) => {
    assigned[i] = e.payload.memberAssignment[topic] || [];
  });
  await c.connect();
  await c.subscribe({ topic, fromBeginning: true });
  consumers.push(c);
}
await Promise.all(
  consumers.map((c, i) =>
    c.run({
      autoCommitInterval: 100,
      eachMessage: async ({ message }) => {
        const v = Number(message.value.toString());
        values.push([v, i]);
        distinct.add(v);
        if (distinct.size >= expected) done("ok");
      },
    }),
  ),
);
const why = await finished;
clearTimeout(deadline);
for (const c of consumers) await c.disconnect();
console.log(JSON.stringify({ why, values, members: assigned }));
process.exit(why === "ok" ? 0 : 1);
