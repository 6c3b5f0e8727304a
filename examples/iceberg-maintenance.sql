-- Iceberg with table maintenance (the embedded default, no server):
-- compaction, snapshot expiry and orphan cleanup run in the pipeline, after
-- a commit of the table when their turn is due.
--   urutau run examples/iceberg-maintenance.sql --exit-when-caught-up
CREATE PIPELINE maintained;

CREATE SOURCE events FROM file WITH (path = 'examples/data/shop.jsonl');

CREATE SINK lake INTO iceberg WITH (
  catalog   = 'sql',
  uri       = 'sqlite://warehouse/catalog.db',
  warehouse = 'warehouse',
  namespace = 'maintained',
  -- Data files are written up to 256 MiB (an initial snapshot is gathered
  -- into files of this size); compaction rewrites small ones into 512 MiB.
  target_file_size = '256Mi',
  maintenance_enabled = true,
  -- Rewrite the live rows (deletes applied) into large files once 5 small
  -- data files or delete files have accumulated.
  maintenance_compaction_interval         = '5m',
  maintenance_compaction_target_file_size = '512Mi',
  maintenance_compaction_min_input_files  = 5,
  -- Keep the newest snapshot, and every snapshot younger than 7 days (how
  -- long a stopped pipeline can still fall back on snapshot summaries).
  maintenance_snapshot_expiry_interval    = '10m',
  maintenance_snapshot_expiry_retain_last = 1,
  maintenance_snapshot_expiry_max_age     = '168h',
  -- Remove files nothing references once they are 3 days old.
  maintenance_orphan_cleanup_interval     = '1h',
  maintenance_orphan_cleanup_older_than   = '72h'
);

CREATE TABLE events.orders (
  id          BIGINT NOT NULL,
  customer_id BIGINT,
  amount      DECIMAL(12,2),
  status      VARCHAR,
  created_at  TIMESTAMPTZ,
  PRIMARY KEY (id)
);

CREATE TABLE lake.orders WITH (primary_key = 'id', write_mode = 'upsert') AS
SELECT id, customer_id, amount, status, created_at FROM events.orders;
