-- Quickstart, on the embedded default (no server): Debezium-style change
-- events from a file into Apache Iceberg on a local SQLite catalog
-- (warehouse/catalog.db; data and metadata under warehouse/bronze/).
--   urutau run examples/quickstart.sql --exit-when-caught-up
--   urutau plan --explain examples/quickstart.sql
CREATE PIPELINE quickstart;

CREATE SOURCE events FROM file WITH (
  path   = 'examples/data/shop.jsonl',
  format = 'debezium-json'
);

CREATE SINK lake INTO iceberg WITH (
  catalog   = 'sql',
  uri       = 'sqlite://warehouse/catalog.db',
  warehouse = 'warehouse',
  namespace = 'bronze'
);

-- The file carries no schema: declare the tables it holds.
CREATE TABLE events.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
);

CREATE TABLE events.customers (
  id    BIGINT NOT NULL,
  name  VARCHAR,
  email VARCHAR,
  PRIMARY KEY (id)
);

-- Upsert: the table mirrors the source rows that pass the filter (a row
-- updated out of it is deleted), one snapshot per batch.
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

-- Append: every change is a row.
CREATE TABLE lake.customer_changes WITH (
  primary_key = 'id',
  write_mode  = 'append'
) AS
SELECT id,
       name,
       email,
       _op       AS change_op,
       _position AS source_position
FROM events.customers;
