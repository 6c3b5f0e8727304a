-- Experimenting: Debezium-style change events from a file, applied to two
-- tables and printed by the debug sink. Run it:
--   urutau run examples/debug.sql --exit-when-caught-up
-- See what it compiles to:
--   urutau plan --explain examples/debug.sql
CREATE PIPELINE debug;

CREATE SOURCE events FROM file WITH (
  path   = 'examples/data/shop.jsonl',
  format = 'debezium-json'
);

CREATE SINK out INTO debug;

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

-- Upsert: the target mirrors the source rows that pass the filter.
CREATE TABLE out.orders WITH (
  primary_key = 'id',
  write_mode  = 'upsert'
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
CREATE TABLE out.customer_changes WITH (
  primary_key = 'id',
  write_mode  = 'append'
) AS
SELECT id,
       name,
       email,
       _op       AS change_op,
       _position AS source_position
FROM events.customers;
