-- The quickstart's change events into a ClickHouse server on
-- 127.0.0.1:8123 (add `password = '...'` to the sink; it is never printed).
--   urutau run examples/clickhouse.sql --exit-when-caught-up
--   SELECT * FROM shop.orders FINAL   -- reads live rows only
--   urutau clickhouse cleanup examples/clickhouse.sql   -- reclaims tombstones
CREATE PIPELINE shop_to_clickhouse;

CREATE SOURCE events FROM file WITH (
  path   = 'examples/data/shop.jsonl',
  format = 'debezium-json'
);

CREATE SINK ch INTO clickhouse WITH (
  uri      = 'http://127.0.0.1:8123',
  database = 'shop',
  user     = 'default'
);

CREATE TABLE events.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
);

-- Upsert: ReplacingMergeTree(seq, is_deleted) ORDER BY (id); the position
-- travels in the rows.
CREATE TABLE ch.orders WITH (
  primary_key = 'id',
  write_mode  = 'upsert'
) AS
SELECT id,
       customer_id,
       amount,
       status,
       created_at,
       _commit_ts AS committed_at
FROM events.orders
WHERE status <> 'test';
