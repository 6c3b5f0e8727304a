-- The quickstart's change events into Couchbase on 127.0.0.1 (add
-- `password = '...'` or `password = env('COUCHBASE_PASSWORD')` to the sink;
-- it is never printed).
--   urutau run examples/couchbase.sql --exit-when-caught-up
-- The bucket `shop` (0 replicas), its collection `orders` and the control
-- document `_urutau::position` are created on the first run; each order is
-- one document keyed `[id]`, its metadata under `_urutau`.
CREATE PIPELINE shop_to_couchbase;

CREATE SOURCE events FROM file WITH (
  path   = 'examples/data/shop.jsonl',
  format = 'debezium-json'
);

CREATE SINK cb INTO couchbase WITH (
  uri         = 'couchbase://127.0.0.1',
  bucket      = 'shop',
  username    = 'Administrator',
  commit_mode = 'atomic',
  durability  = 'majority'
);

CREATE TABLE events.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
);

-- Upsert: one document per key; a delete removes it.
CREATE TABLE cb.orders WITH (
  primary_key = 'id',
  write_mode  = 'upsert'
) AS
SELECT id,
       customer_id,
       amount,
       status,
       created_at,
       _commit_ts AS committed_at,
       _op AS op
FROM events.orders
WHERE status <> 'test';
