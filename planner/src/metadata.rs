//! The metadata catalog: the closed set of pipeline metadata columns a route
//! may land in its target, their types, and the context column each reads.
//!
//! In SQL a metadata column is the pseudo-column `_<name>` (`_commit_ts AS
//! committed_at`); in YAML it is `metadata: [{from: <name>, as: ...}]`. Every
//! metadata column lands nullable at the end of the target schema, in the
//! order selected. Names outside this catalog are rejected.

use crate::context::{self, Transport};
use crate::types::CanonicalType;

/// One entry of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataColumn {
    /// Catalog name (`commit_ts`); SQL spells it `_commit_ts`.
    pub name: &'static str,
    /// The change-batch context column it reads.
    pub context_column: &'static str,
    /// Its canonical type in the target.
    pub ty: CanonicalType,
    /// The transport context a source must carry to provide it
    /// ([`Transport::None`]: every source does).
    pub transport: Transport,
    /// What it means, for `validate` and docs.
    pub doc: &'static str,
}

/// The metadata columns of a transport's coordinate, in order: together
/// they name one change uniquely (Kafka's topic, partition, offset).
pub const COORDINATE: [&str; 3] = ["stream", "shard", "sequence"];

/// Every metadata column, CDC ones first, then transport ones.
pub fn catalog() -> Vec<MetadataColumn> {
    use CanonicalType as T;
    let m = |name, context_column, ty, transport, doc| MetadataColumn {
        name,
        context_column,
        ty,
        transport,
        doc,
    };
    vec![
        m(
            "op",
            context::OP,
            T::String,
            Transport::None,
            "insert | update | delete",
        ),
        m(
            "commit_ts",
            context::COMMIT_TS,
            T::TimestampTz,
            Transport::None,
            "source commit time; NULL for snapshot rows",
        ),
        m(
            "ingest_ts",
            context::INGEST_TS,
            T::TimestampTz,
            Transport::None,
            "when the engine read the change",
        ),
        m(
            "position",
            context::POS,
            T::String,
            Transport::None,
            "source position of the change's transaction",
        ),
        m(
            "source_table",
            context::SOURCE_TABLE,
            T::String,
            Transport::None,
            "the source table of the change",
        ),
        m(
            "phase",
            context::PHASE,
            T::String,
            Transport::None,
            "snapshot | stream | incremental",
        ),
        m(
            "stream",
            context::STREAM,
            T::String,
            Transport::Coordinate,
            "transport stream (topic; a change file's name)",
        ),
        m(
            "shard",
            context::SHARD,
            T::Int32,
            Transport::Coordinate,
            "transport shard (partition; 0 for a change file)",
        ),
        m(
            "sequence",
            context::SEQUENCE,
            T::Int64,
            Transport::Coordinate,
            "transport sequence (offset; a change file's line's byte offset)",
        ),
        m(
            "msg_ts",
            context::MSG_TS,
            T::TimestampTz,
            Transport::Full,
            "transport message timestamp",
        ),
        m(
            "msg_key",
            context::MSG_KEY,
            T::Binary,
            Transport::Full,
            "transport message key",
        ),
        m(
            "headers",
            context::HEADERS,
            T::Json,
            Transport::Full,
            "transport headers as JSON",
        ),
    ]
}

/// Looks a metadata column up by its catalog name (`commit_ts`).
pub fn lookup(name: &str) -> Option<MetadataColumn> {
    catalog().into_iter().find(|m| m.name == name)
}

/// Looks a metadata column up by its SQL pseudo-column name (`_commit_ts`).
pub fn lookup_pseudo(name: &str) -> Option<MetadataColumn> {
    name.strip_prefix('_')
        .filter(|rest| !rest.starts_with('_'))
        .and_then(lookup)
}

/// Catalog names, for "did you mean" and listings.
pub fn names() -> Vec<&'static str> {
    catalog().iter().map(|m| m.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_closed_and_typed() {
        assert_eq!(
            names(),
            vec![
                "op",
                "commit_ts",
                "ingest_ts",
                "position",
                "source_table",
                "phase",
                "stream",
                "shard",
                "sequence",
                "msg_ts",
                "msg_key",
                "headers"
            ]
        );
        assert_eq!(lookup("commit_ts").unwrap().ty, CanonicalType::TimestampTz);
        assert_eq!(lookup_pseudo("_op").unwrap().context_column, "__op");
        assert!(lookup_pseudo("__op").is_none());
        assert!(lookup("commit_time").is_none());
        assert_eq!(lookup("headers").unwrap().transport, Transport::Full);
        assert_eq!(lookup("sequence").unwrap().transport, Transport::Coordinate);
        assert_eq!(lookup("op").unwrap().transport, Transport::None);
    }
}
