//! What the Postgres source asks the server before it streams: table
//! schemas (columns, types, primary key), and the replication set-up —
//! `wal_level`, privileges, REPLICA IDENTITY, the publication and the slot
//! — done idempotently at every start.

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use urutau_planner::diagnostic::Span;
use urutau_planner::registry::{SchemaError, SourceTableSchema};
use urutau_planner::spec::{ColumnSpec, Ident};

use super::errors;
use super::pgtypes::{PgType, PgTypeKind, canonical_type};
use crate::sources::SourceError;

/// A routed table's name in Postgres.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PgTable {
    pub schema: String,
    pub name: String,
}

impl PgTable {
    /// `public.orders` from a route's `orders` or `public.orders`.
    pub fn from_parts(parts: &[String]) -> Result<PgTable, String> {
        match parts {
            [t] => Ok(PgTable {
                schema: "public".into(),
                name: t.clone(),
            }),
            [s, t] => Ok(PgTable {
                schema: s.clone(),
                name: t.clone(),
            }),
            _ => Err(format!(
                "`{}`: a Postgres table is `schema.table` or `table`",
                parts.join(".")
            )),
        }
    }

    /// The quoted SQL name.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl std::fmt::Display for PgTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// `name` as a quoted SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Connects a SQL session (the URI's credentials never reach messages; a
/// server that is away is a transient error).
/// `uri` is the source's effective URI ([`super::tls::effective_uri`]): its
/// TLS settings are libpq's, read by sqlx itself.
pub async fn connect(uri: &str) -> Result<PgConnection, SourceError> {
    // Our words for bad TLS settings (a missing file, a certificate without
    // its key) before sqlx's.
    if let Ok(url) = url::Url::parse(uri) {
        super::tls::TlsSettings::of(&url)?;
    }
    let options: PgConnectOptions = uri.parse().map_err(|e: sqlx::Error| {
        SourceError::new(format!("the source uri: {}", redact(&e.to_string())))
    })?;
    let options = options.log_statements(tracing::log::LevelFilter::Debug);
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => Ok(conn),
        // rustls reports a refused certificate as an I/O error.
        Ok(Err(e))
            if matches!(e, sqlx::Error::Tls(_))
                || super::tls::is_handshake_failure(&e.to_string()) =>
        {
            Err(super::tls::failed("connecting to Postgres", uri, &e.to_string()).await)
        }
        Ok(Err(e)) => Err(super::tls::with_hint(errors::sql(
            "connecting to Postgres",
            &e,
        ))),
        Err(_) => Err(SourceError::transient(format!(
            "connecting to Postgres: no answer within {}s (is the network to the server down?)",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// How long connecting (TCP, TLS, authentication) may take: a network that
/// drops packets silently would otherwise hold a connect for as long as
/// TCP retries.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether some connection streams from `slot` now (`active`), asked on a
/// new session; a slot that does not exist is not.
pub async fn slot_is_active(uri: &str, slot: &str) -> Result<bool, SourceError> {
    let mut conn = connect(uri).await?;
    let active: Option<bool> =
        sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
            .bind(slot)
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| errors::sql(&format!("checking replication slot {slot}"), &e))?;
    close(conn).await;
    Ok(active.unwrap_or(false))
}

/// Sets the session's text output to what the value parsers expect (the
/// replication session's `-c` options), so values a SQL session reads
/// compare byte for byte with the stream's.
pub async fn set_text_output(conn: &mut PgConnection, session: &str) -> Result<(), SourceError> {
    // (Executor's boxed futures: RawSql's own async fns are not Send for
    // every lifetime.)
    sqlx::Executor::execute(
        &mut *conn,
        sqlx::raw_sql(
            "SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET bytea_output = 'hex'; SET extra_float_digits = 1",
        ),
    )
    .await
    .map_err(|e| errors::sql(&format!("setting up {session}"), &e))?;
    Ok(())
}

/// Removes anything that looks like URI credentials from a message.
fn redact(text: &str) -> String {
    urutau_planner::options::redact_text(text)
}

/// The schema of a routed table as the catalog holds it.
pub async fn table_schema(
    conn: &mut PgConnection,
    table: &PgTable,
) -> Result<SourceTableSchema, SchemaError> {
    let rows = sqlx::query(
        "SELECT a.attname::text AS name,
                a.attnotnull AS not_null,
                COALESCE(NULLIF(t.typbasetype, 0), t.oid)::int8 AS oid,
                CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END AS typmod,
                format_type(a.atttypid, a.atttypmod) AS type_name,
                CASE WHEN t.typtype = 'd' THEN b.typtype ELSE t.typtype END::text AS typtype,
                CASE WHEN t.typtype = 'd' THEN b.typcategory ELSE t.typcategory END::text AS category,
                COALESCE(NULLIF(e.typbasetype, 0), e.oid)::int8 AS elem_oid,
                e.typtype::text AS elem_typtype,
                format_type(e.oid, NULL) AS elem_name
         FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_type t ON t.oid = a.atttypid
         LEFT JOIN pg_type b ON b.oid = t.typbasetype
         LEFT JOIN pg_type e ON e.oid = (CASE WHEN t.typtype = 'd' THEN b.typelem ELSE t.typelem END)
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum",
    )
    .bind(&table.schema)
    .bind(&table.name)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| SchemaError::Unavailable(format!("reading the columns of {table}: {e}")))?;
    if rows.is_empty() {
        return Err(SchemaError::Invalid(format!(
            "table {table} does not exist in the source database"
        )));
    }
    let mut columns = Vec::with_capacity(rows.len());
    for r in &rows {
        let name: String = r.get("name");
        let mapping = canonical_type(&pg_type_of(r));
        if let Some(w) = mapping.warning {
            tracing::warn!(table = %table, column = %name, "{w}");
        }
        columns.push(ColumnSpec {
            name: Ident::new(name, Span::default()),
            ty: mapping.ty,
            nullable: !r.get::<bool, _>("not_null"),
        });
    }
    let keys = sqlx::query(
        "SELECT a.attname::text AS name
         FROM pg_index i
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = $1::regclass AND i.indisprimary
         ORDER BY array_position(i.indkey::int2[], a.attnum)",
    )
    .bind(table.quoted())
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| SchemaError::Unavailable(format!("reading the primary key of {table}: {e}")))?;
    Ok(SourceTableSchema {
        columns,
        primary_key: keys.iter().map(|r| r.get::<String, _>("name")).collect(),
        dropped: vec![],
    })
}

/// A column's type from a catalog row with the columns `oid` (the base
/// type's, domains resolved), `typmod`, `type_name`, `typtype`,
/// `category`, `elem_oid`, `elem_typtype` and `elem_name` (the element
/// type of an array), as [`table_schema`] and [`relation_types`] read them.
fn pg_type_of(r: &sqlx::postgres::PgRow) -> PgType {
    let typtype: String = r.get("typtype");
    let category: String = r.get("category");
    PgType {
        oid: r.get::<i64, _>("oid") as u32,
        typmod: r.get("typmod"),
        name: r.get("type_name"),
        kind: if category == "A" {
            let elem_typtype: Option<String> = r.get("elem_typtype");
            PgTypeKind::Array(Box::new(PgType {
                oid: r.get::<Option<i64>, _>("elem_oid").unwrap_or(0) as u32,
                typmod: -1,
                name: r.get::<Option<String>, _>("elem_name").unwrap_or_default(),
                kind: if elem_typtype.as_deref() == Some("e") {
                    PgTypeKind::Enum
                } else {
                    PgTypeKind::Base
                },
            }))
        } else if typtype == "e" {
            PgTypeKind::Enum
        } else {
            PgTypeKind::Base
        },
    }
}

/// The canonical types of the columns a Relation message describes, each
/// given as (type OID, type modifier): the mapping [`table_schema`] makes of
/// the catalog, so a shape the stream sends compares with the planned one.
/// A type's definition never changes under its OID, so what the catalog
/// says now holds for any point of the stream.
pub async fn relation_types(
    conn: &mut PgConnection,
    types: &[(u32, i32)],
) -> Result<std::collections::HashMap<(u32, i32), urutau_planner::types::CanonicalType>, SourceError>
{
    let oids: Vec<i64> = types.iter().map(|(o, _)| i64::from(*o)).collect();
    let typmods: Vec<i32> = types.iter().map(|(_, m)| *m).collect();
    let rows = sqlx::query(
        "SELECT q.oid AS asked_oid, q.typmod AS asked_typmod,
                COALESCE(NULLIF(t.typbasetype, 0), t.oid)::int8 AS oid,
                CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE q.typmod END AS typmod,
                format_type(t.oid, q.typmod) AS type_name,
                CASE WHEN t.typtype = 'd' THEN b.typtype ELSE t.typtype END::text AS typtype,
                CASE WHEN t.typtype = 'd' THEN b.typcategory ELSE t.typcategory END::text AS category,
                COALESCE(NULLIF(e.typbasetype, 0), e.oid)::int8 AS elem_oid,
                e.typtype::text AS elem_typtype,
                format_type(e.oid, NULL) AS elem_name
         FROM unnest($1::int8[], $2::int4[]) AS q(oid, typmod)
         JOIN pg_type t ON t.oid = q.oid::oid
         LEFT JOIN pg_type b ON b.oid = t.typbasetype
         LEFT JOIN pg_type e ON e.oid = (CASE WHEN t.typtype = 'd' THEN b.typelem ELSE t.typelem END)",
    )
    .bind(&oids)
    .bind(&typmods)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| errors::sql("reading the types of a changed table", &e))?;
    let mut out = std::collections::HashMap::new();
    for r in &rows {
        let asked = (
            r.get::<i64, _>("asked_oid") as u32,
            r.get::<i32, _>("asked_typmod"),
        );
        out.insert(asked, canonical_type(&pg_type_of(r)).ty);
    }
    if let Some((oid, _)) = types.iter().find(|t| !out.contains_key(t)) {
        return Err(SourceError::new(format!(
            "a changed table has a column of type OID {oid}, which the catalog does not know (was the type dropped?)"
        )));
    }
    Ok(out)
}

/// The names of `table`'s columns as the catalog holds them now.
pub async fn existing_columns(
    conn: &mut PgConnection,
    table: &PgTable,
) -> Result<Vec<String>, SourceError> {
    sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_attribute a
         WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(table.quoted())
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| errors::sql(&format!("reading the columns of {table}"), &e))
}

/// What the replication set-up found and did.
#[derive(Debug)]
pub struct Prepared {
    /// The slot's `confirmed_flush_lsn` (it existed), or where it was
    /// created.
    pub slot_lsn: u64,
    pub slot_created: bool,
}

/// Checks `wal_level` and privileges, sets REPLICA IDENTITY FULL (unless
/// `keep`), makes the publication hold exactly `tables`, and creates the
/// slot when absent — before any snapshot read.
pub async fn prepare(
    conn: &mut PgConnection,
    tables: &[PgTable],
    slot: &str,
    publication: &str,
    keep_replica_identity: bool,
) -> Result<Prepared, SourceError> {
    let fail = |doing: &str, e: sqlx::Error| errors::sql(doing, &e);
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| fail("reading wal_level", e))?;
    if wal_level != "logical" {
        return Err(SourceError::new(format!(
            "the source server has wal_level = {wal_level}; logical replication needs wal_level = logical (postgresql.conf, then a restart)"
        )));
    }
    let (can_replicate, superuser): (bool, bool) = sqlx::query_as(
        "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| fail("reading the role's privileges", e))?;
    if !can_replicate && !superuser {
        return Err(SourceError::new(
            "the source user has no REPLICATION privilege (ALTER ROLE ... WITH REPLICATION)",
        ));
    }
    for t in tables {
        let ident: Option<String> =
            sqlx::query_scalar("SELECT relreplident::text FROM pg_class WHERE oid = $1::regclass")
                .bind(t.quoted())
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| fail(&format!("reading the replica identity of {t}"), e))?;
        if ident.as_deref() != Some("f") {
            if keep_replica_identity {
                tracing::warn!(table = %t, "REPLICA IDENTITY is not FULL (replica_identity = 'keep'): deletes carry the key only and unchanged TOASTed values cannot be filled in");
            } else {
                sqlx::query(&format!("ALTER TABLE {} REPLICA IDENTITY FULL", t.quoted()))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| fail(&format!("setting REPLICA IDENTITY FULL on {t}"), e))?;
                tracing::info!(table = %t, "set REPLICA IDENTITY FULL");
            }
        }
    }
    let list = tables
        .iter()
        .map(PgTable::quoted)
        .collect::<Vec<_>>()
        .join(", ");
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_publication WHERE pubname = $1")
        .bind(publication)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| fail("reading publications", e))?;
    if exists.is_none() {
        sqlx::query(&format!(
            "CREATE PUBLICATION {} FOR TABLE {list}",
            quote_ident(publication)
        ))
        .execute(&mut *conn)
        .await
        .map_err(|e| fail(&format!("creating publication {publication}"), e))?;
        tracing::info!(publication, "created the publication");
    } else {
        let held: Vec<(String, String)> = sqlx::query_as(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
        )
        .bind(publication)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| fail("reading the publication's tables", e))?;
        let mut held: Vec<PgTable> = held
            .into_iter()
            .map(|(schema, name)| PgTable { schema, name })
            .collect();
        let mut wanted = tables.to_vec();
        held.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
        wanted.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
        if held != wanted {
            sqlx::query(&format!(
                "ALTER PUBLICATION {} SET TABLE {list}",
                quote_ident(publication)
            ))
            .execute(&mut *conn)
            .await
            .map_err(|e| fail(&format!("updating publication {publication}"), e))?;
            tracing::info!(
                publication,
                "the publication now holds exactly the routed tables"
            );
        }
    }
    // (`wal_status` through jsonb: the column is new in PostgreSQL 13.)
    let found: Option<(Option<String>, String, Option<String>)> = sqlx::query_as(
        "SELECT confirmed_flush_lsn::text, plugin::text, to_jsonb(s) ->> 'wal_status'
         FROM pg_replication_slots s WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| fail("reading replication slots", e))?;
    match found {
        Some((lsn, plugin, wal_status)) => {
            if plugin != "pgoutput" {
                return Err(SourceError::new(format!(
                    "replication slot {slot} uses the {plugin} plugin; this source needs pgoutput"
                )));
            }
            if wal_status.as_deref() == Some("lost") {
                return Err(SourceError::new(invalidated_slot(slot)));
            }
            Ok(Prepared {
                slot_lsn: lsn.as_deref().map(parse_lsn).transpose()?.unwrap_or(0),
                slot_created: false,
            })
        }
        None => {
            let lsn: String = sqlx::query_scalar(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            )
            .bind(slot)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| fail(&format!("creating replication slot {slot}"), e))?;
            tracing::info!(slot, lsn = %lsn, "created the replication slot");
            Ok(Prepared {
                slot_lsn: parse_lsn(&lsn)?,
                slot_created: true,
            })
        }
    }
}

/// Why a run cannot go on from a slot the server invalidated, and how to
/// start over.
pub fn invalidated_slot(slot: &str) -> String {
    format!(
        "replication slot {slot} was invalidated by the server (wal_status = lost: it fell further behind than max_slot_wal_keep_size allows, and the WAL it needed was removed): the changes after the sinks' positions are gone and cannot be streamed. \
         To start over, drop the slot (SELECT pg_drop_replication_slot('{slot}')) and the target tables, then run again: the tables are snapshotted afresh. \
         To keep it from happening again, raise max_slot_wal_keep_size or keep the pipeline running"
    )
}

/// `X/Y` as a number.
pub fn parse_lsn(text: &str) -> Result<u64, SourceError> {
    let (hi, lo) = text
        .split_once('/')
        .ok_or_else(|| SourceError::new(format!("`{text}` is not an LSN")))?;
    let hi = u64::from_str_radix(hi, 16)
        .map_err(|_| SourceError::new(format!("`{text}` is not an LSN")))?;
    let lo = u64::from_str_radix(lo, 16)
        .map_err(|_| SourceError::new(format!("`{text}` is not an LSN")))?;
    Ok((hi << 32) | lo)
}

/// The server's current WAL position, and a logical message after it that
/// proves the stream has passed it (`--exit-when-caught-up`). The
/// statement takes a transaction id, so its commit flushes the WAL and the
/// walsender sends the message at once, not at the WAL writer's next turn.
pub async fn caught_up_mark(conn: &mut PgConnection, prefix: &str) -> Result<u64, SourceError> {
    let lsn: String = sqlx::query_scalar(
        "SELECT pg_logical_emit_message(false, $1, 'caught-up')::text, txid_current()",
    )
    .bind(prefix)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| errors::sql("writing the caught-up mark", &e))?;
    parse_lsn(&lsn)
}

/// Closes a session politely.
pub async fn close(conn: PgConnection) {
    let _ = conn.close().await;
}
