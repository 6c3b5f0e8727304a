-- File changes into Iceberg on a local SQLite catalog (the embedded
-- default). The Iceberg writer lands with its own issue; until then this
-- pipeline validates and plans (`urutau plan --explain examples/lake.sql`),
-- and `run` stops before writing with "not in this build".
CREATE PIPELINE lake;

CREATE SOURCE events FROM file WITH (path = 'examples/data/shop.jsonl');

CREATE SINK lake INTO iceberg WITH (
  catalog   = 'sql',
  uri       = 'sqlite://warehouse/catalog.db',
  warehouse = 'warehouse',
  namespace = 'bronze'
);

CREATE TABLE events.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
);

CREATE TABLE lake.orders WITH (
  primary_key  = 'id',
  write_mode   = 'upsert',
  partition_by = 'day(created_at)'
) AS
SELECT id,
       customer_id,
       CAST(amount AS DECIMAL(20,2)) AS amount,
       status,
       created_at,
       _commit_ts AS committed_at,
       _op        AS change_op
FROM events.orders
WHERE status <> 'test';
