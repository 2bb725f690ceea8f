"""One kafka-python workload, run as its own process so that a second
kafka-python (3.x, installed apart from the venv's 2.x) can drive it:
admin create + describe, produce, a group consumer that commits, and a
transaction that commits consumed offsets (send_offsets_to_transaction).

Usage: python3 kafka_python_workload.py BOOTSTRAP TOPIC API_VERSION
API_VERSION is "auto" or dotted, e.g. 4.0 (pins kafka-python's api_version).
Prints one JSON line: {"version": ..., "consumed": N, "txn": "ok"}.
"""

import json
import sys

import kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

bootstrap, topic, pin = sys.argv[1:4]
kw = {} if pin == "auto" else {"api_version": tuple(int(x) for x in pin.split("."))}
common = dict(bootstrap_servers=bootstrap, request_timeout_ms=15000, **kw)

adm = KafkaAdminClient(**common)
adm.create_topics([NewTopic(topic, 2, 1)])
group = f"g-{topic}"

p = KafkaProducer(**common, max_block_ms=15000)
for i in range(20):
    p.send(topic, key=b"k%d" % i, value=b"v%d" % i)
p.flush(15)
p.close()

c = KafkaConsumer(topic, **common, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False, consumer_timeout_ms=20000)
consumed = 0
for _ in c:
    consumed += 1
    if consumed >= 20:
        break
c.commit()

# consume-transform-produce: offsets committed inside a transaction
tp = KafkaProducer(**common, max_block_ms=15000, transactional_id=f"tx-{topic}")
tp.init_transactions()
tp.begin_transaction()
tp.send(topic, value=b"in-txn")
offsets = {t: kafka.OffsetAndMetadata(c.position(t), "", -1) for t in c.assignment()}
tp.send_offsets_to_transaction(offsets, c.group_metadata() if hasattr(c, "group_metadata") else group)
tp.commit_transaction()
tp.close()
c.close()

groups = adm.list_groups() if hasattr(adm, "list_groups") else adm.list_consumer_groups()
described = (adm.describe_groups([group]) if hasattr(adm, "describe_groups")
             else adm.describe_consumer_groups([group]))
adm.describe_topics([topic])
adm.close()
print(json.dumps({"version": kafka.__version__, "consumed": consumed, "txn": "ok",
                  "groups": len(groups)}))
