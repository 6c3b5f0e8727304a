-- Debezium's change events from Kafka into Iceberg on a local SQLite
-- catalog: the topics a Debezium Postgres connector writes (prefix `dbz`).
--   urutau run examples/kafka.sql
CREATE PIPELINE from_debezium;

CREATE SOURCE k FROM kafka WITH (
  brokers = 'localhost:9092',
  format  = 'debezium-json'   -- with or without the schema part
);

CREATE SINK lake INTO iceberg WITH (
  catalog   = 'sql',
  uri       = 'sqlite://warehouse/catalog.db',
  warehouse = 'warehouse',
  namespace = 'bronze'
);

CREATE TABLE k.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
) WITH (topic = 'dbz.public.orders');

CREATE TABLE lake.orders AS
SELECT id, customer_id, amount, status, created_at,
       _commit_ts AS committed_at,
       _shard     AS kafka_partition,
       _sequence  AS kafka_offset
FROM k.orders;
