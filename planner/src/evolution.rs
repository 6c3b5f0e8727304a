//! Schema changes at the source: which changes of a column's type a target
//! can follow, and how the shape a route was planned with grows into the
//! shape a source now sends.
//!
//! The rule (one for every sink, so a table's targets never disagree): a
//! column's type may only *widen* the way every target can promote it in
//! place, without rewriting or losing a value — Iceberg's type promotions:
//! `int -> bigint`, `real -> double`, and a decimal's precision up at the
//! same scale. Any other change (narrowing, a change that would parse or
//! lose values) stops the table with the column, both types and this rule.
//! A length or a name of a type the canonical types do not carry
//! (`varchar(10) -> varchar(20)`) is no change at all.
//!
//! Columns are never dropped from a target: a column dropped at the source
//! stays in the shape, nullable, and is written NULL from then on; a
//! renamed column is a drop and an add. Added columns join the shape at its
//! end, nullable (the stream cannot tell `NOT NULL`, and rows written
//! before the column existed have no value for it).

use std::fmt;

use crate::registry::SourceTableSchema;
use crate::spec::{ColumnSpec, Ident};
use crate::types::CanonicalType;

/// What a route does when its source table changes shape
/// (`schema_changes`; YAML `evolveSchema`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaChanges {
    /// Follow the change: add columns, promote types, keep dropped columns
    /// (the default).
    #[default]
    Evolve,
    /// Stop at the first change, saying what changed.
    Fail,
}

impl SchemaChanges {
    /// Parses `evolve` | `fail`.
    pub fn parse(text: &str) -> Option<SchemaChanges> {
        match text {
            "evolve" => Some(SchemaChanges::Evolve),
            "fail" => Some(SchemaChanges::Fail),
            _ => None,
        }
    }

    /// The policy as written in a pipeline.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaChanges::Evolve => "evolve",
            SchemaChanges::Fail => "fail",
        }
    }
}

impl fmt::Display for SchemaChanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rule a refused type change breaks, as errors quote it.
pub const PROMOTION_RULE: &str = "a column's type may only widen in place: int -> bigint, real -> double, or a numeric's precision up at the same scale";

/// How a column's type moved between two shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeMove {
    /// The same canonical type.
    Same,
    /// A promotion every target can apply in place ([`promotes`]).
    Widened,
    /// Anything else: refused, per [`PROMOTION_RULE`].
    Refused,
}

/// Whether `from` promotes to `to` in place (see the module's rule).
pub fn promotes(from: &CanonicalType, to: &CanonicalType) -> bool {
    use CanonicalType as C;
    match (from, to) {
        (C::Int32, C::Int64) | (C::Float32, C::Float64) => true,
        (
            C::Decimal {
                precision: p1,
                scale: s1,
            },
            C::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => s1 == s2 && p2 > p1,
        _ => false,
    }
}

/// How a column of type `from` moved to `to`.
pub fn type_move(from: &CanonicalType, to: &CanonicalType) -> TypeMove {
    if from == to {
        TypeMove::Same
    } else if promotes(from, to) {
        TypeMove::Widened
    } else {
        TypeMove::Refused
    }
}

/// The wider of two types when one promotes to the other; `None` when
/// neither does (a change the rule refuses).
pub fn wider(a: &CanonicalType, b: &CanonicalType) -> Option<CanonicalType> {
    if a == b || promotes(b, a) {
        Some(a.clone())
    } else if promotes(a, b) {
        Some(b.clone())
    } else {
        None
    }
}

/// A change of one source table's shape that its routes must be planned
/// again for: the source found it in its stream and asks the run to plan
/// the table with `schema` (the shape it was planned with, grown by what
/// the stream now sends) before it reads on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// The source's name.
    pub source: String,
    /// The table, as the pipeline names it.
    pub table: Vec<String>,
    /// The grown shape ([`grow`]).
    pub schema: SourceTableSchema,
    /// What changed, for the log (`column extra (INT) added`).
    pub description: String,
    /// Columns the change added (a route that names its columns ignores
    /// them).
    pub added: Vec<String>,
}

/// One column a source now sends for a table: its name and canonical type
/// (nullability is not known from a stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentColumn {
    pub name: String,
    pub ty: CanonicalType,
}

/// Why a shape cannot grow into what the source sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A column's type changed against [`PROMOTION_RULE`].
    #[error(
        "column {column} changed type from {from} to {to}, which the targets cannot follow ({PROMOTION_RULE}); nothing of the change was committed. Undo the change at the source, or create the target tables again with the new type and snapshot the table again"
    )]
    RefusedType {
        column: String,
        from: CanonicalType,
        to: CanonicalType,
    },
    /// A key column is gone from the source.
    #[error(
        "key column {column} was dropped (or renamed) at the source: the routes cannot find rows by it any more. Restore the column, or set the route's primary_key and create the targets again"
    )]
    KeyDropped { column: String },
}

/// What differs between a planned shape and what a source sends, as a
/// sentence for logs and errors (`column extra (INT) added; column v
/// dropped`), `dropped` being the columns the source dropped (a planned
/// column it merely does not send yet is no change); empty when they are
/// the same.
pub fn describe_difference(
    planned: &SourceTableSchema,
    sent: &[SentColumn],
    dropped: &[String],
) -> String {
    let mut parts = Vec::new();
    for c in sent {
        match planned.columns.iter().find(|p| p.name.name == c.name) {
            None => parts.push(format!("column {} ({}) added", c.name, c.ty)),
            Some(p) if p.ty != c.ty => parts.push(format!(
                "column {} changed from {} to {}",
                c.name, p.ty, c.ty
            )),
            Some(_) => {}
        }
    }
    for d in dropped {
        parts.push(format!("column {d} dropped"));
    }
    parts.join("; ")
}

/// Whether rows sent with `sent` can be read into `planned` as it stands:
/// every sent column is planned with the same type or one it promotes to,
/// and every planned column the source no longer sends is nullable (it
/// reads as NULL).
pub fn covers(planned: &SourceTableSchema, sent: &[SentColumn]) -> bool {
    sent.iter().all(|c| {
        planned
            .columns
            .iter()
            .find(|p| p.name.name == c.name)
            .is_some_and(|p| p.ty == c.ty || promotes(&c.ty, &p.ty))
    }) && planned
        .columns
        .iter()
        .all(|p| p.nullable || sent.iter().any(|c| c.name == p.name.name))
}

/// `planned` grown so rows sent with `sent` fit it: planned columns keep
/// their place (widened where the source widened them; those the source
/// does not send become nullable), then columns new to the plan, nullable,
/// in the order the source sends them. `dropped` are the columns the
/// source dropped (it sent them before in the same stream): they are
/// listed as such, with those dropped earlier. A column dropped earlier
/// stays dropped when `sent` has it: a stream read again from an older
/// position sends the shapes before the drop once more (only the catalog
/// can say a column is back, [`merge_with_catalog`]).
pub fn grow(
    planned: &SourceTableSchema,
    sent: &[SentColumn],
    dropped: &[String],
) -> Result<SourceTableSchema, ShapeError> {
    let mut columns = Vec::with_capacity(planned.columns.len() + sent.len());
    let mut now_dropped = planned.dropped.clone();
    for p in &planned.columns {
        match sent.iter().find(|c| c.name == p.name.name) {
            Some(c) => {
                let ty = wider(&p.ty, &c.ty).ok_or_else(|| ShapeError::RefusedType {
                    column: p.name.name.clone(),
                    from: p.ty.clone(),
                    to: c.ty.clone(),
                })?;
                columns.push(ColumnSpec { ty, ..p.clone() });
            }
            None => {
                if planned.primary_key.contains(&p.name.name) {
                    return Err(ShapeError::KeyDropped {
                        column: p.name.name.clone(),
                    });
                }
                if dropped.contains(&p.name.name) && !now_dropped.contains(&p.name.name) {
                    now_dropped.push(p.name.name.clone());
                }
                columns.push(ColumnSpec {
                    nullable: true,
                    ..p.clone()
                });
            }
        }
    }
    for c in sent {
        if !planned.columns.iter().any(|p| p.name.name == c.name) {
            columns.push(ColumnSpec {
                name: Ident::new(c.name.clone(), Default::default()),
                ty: c.ty.clone(),
                nullable: true,
            });
        }
    }
    Ok(SourceTableSchema {
        columns,
        primary_key: planned.primary_key.clone(),
        dropped: now_dropped,
    })
}

/// The shape a table is planned with when the source's catalog says
/// `current` and a stream asked for `grown` ([`SchemaChange::schema`]):
/// the stream's shape (it describes the changes still to be read), with
/// the catalog's types where they are wider and the catalog's columns it
/// lacks (they were added after the point the stream has reached) at the
/// end, nullable. A column the catalog has again is not dropped.
pub fn merge_with_catalog(
    current: &SourceTableSchema,
    grown: &SourceTableSchema,
) -> SourceTableSchema {
    let mut columns: Vec<ColumnSpec> = grown
        .columns
        .iter()
        .map(
            |g| match current.columns.iter().find(|c| c.name.name == g.name.name) {
                Some(c) => ColumnSpec {
                    ty: wider(&g.ty, &c.ty).unwrap_or_else(|| g.ty.clone()),
                    nullable: g.nullable || c.nullable,
                    ..g.clone()
                },
                None => g.clone(),
            },
        )
        .collect();
    for c in &current.columns {
        if !columns.iter().any(|g| g.name.name == c.name.name) {
            columns.push(ColumnSpec {
                nullable: true,
                ..c.clone()
            });
        }
    }
    let dropped = grown
        .dropped
        .iter()
        .filter(|d| !current.columns.iter().any(|c| &c.name.name == *d))
        .cloned()
        .collect();
    SourceTableSchema {
        columns,
        primary_key: if grown.primary_key.is_empty() {
            current.primary_key.clone()
        } else {
            grown.primary_key.clone()
        },
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str, nullable: bool) -> ColumnSpec {
        ColumnSpec {
            name: Ident::new(name, Default::default()),
            ty: CanonicalType::parse(ty, false).unwrap(),
            nullable,
        }
    }

    fn sent(cols: &[(&str, &str)]) -> Vec<SentColumn> {
        cols.iter()
            .map(|(n, t)| SentColumn {
                name: n.to_string(),
                ty: CanonicalType::parse(t, false).unwrap(),
            })
            .collect()
    }

    fn planned() -> SourceTableSchema {
        SourceTableSchema {
            columns: vec![
                col("id", "BIGINT", false),
                col("v", "TEXT", false),
                col("n", "INT", true),
                col("d", "DECIMAL(10,2)", true),
            ],
            primary_key: vec!["id".into()],
            dropped: vec![],
        }
    }

    #[test]
    fn only_in_place_promotions_widen() {
        let t = |s: &str| CanonicalType::parse(s, false).unwrap();
        assert!(promotes(&t("INT"), &t("BIGINT")));
        assert!(promotes(&t("REAL"), &t("DOUBLE")));
        assert!(promotes(&t("DECIMAL(10,2)"), &t("DECIMAL(12,2)")));
        assert!(!promotes(&t("DECIMAL(10,2)"), &t("DECIMAL(12,3)")), "scale");
        assert!(!promotes(&t("BIGINT"), &t("INT")), "narrowing");
        assert!(!promotes(&t("INT"), &t("TEXT")), "the targets cannot");
        assert!(!promotes(&t("INT"), &t("DOUBLE")), "not in place");
        assert_eq!(type_move(&t("INT"), &t("INT")), TypeMove::Same);
        assert_eq!(type_move(&t("BIGINT"), &t("INT")), TypeMove::Refused);
        assert_eq!(wider(&t("BIGINT"), &t("INT")), Some(t("BIGINT")));
        assert_eq!(wider(&t("INT"), &t("TEXT")), None);
    }

    #[test]
    fn the_same_shape_or_a_narrower_replay_is_covered() {
        let p = planned();
        assert!(covers(
            &p,
            &sent(&[
                ("id", "BIGINT"),
                ("v", "TEXT"),
                ("n", "INT"),
                ("d", "DECIMAL(10,2)")
            ])
        ));
        // Rows written before a widening the plan already has.
        let mut wide = p.clone();
        wide.columns[2] = col("n", "BIGINT", true);
        assert!(covers(
            &wide,
            &sent(&[
                ("id", "BIGINT"),
                ("v", "TEXT"),
                ("n", "INT"),
                ("d", "DECIMAL(10,2)")
            ])
        ));
        // A nullable column the source no longer sends reads as NULL.
        assert!(covers(&p, &sent(&[("id", "BIGINT"), ("v", "TEXT")])));
        // A NOT NULL one does not.
        assert!(!covers(&p, &sent(&[("id", "BIGINT"), ("n", "INT")])));
        assert!(!covers(
            &p,
            &sent(&[("id", "BIGINT"), ("v", "TEXT"), ("x", "INT")])
        ));
        assert!(!covers(
            &p,
            &sent(&[("id", "BIGINT"), ("v", "TEXT"), ("n", "BIGINT")])
        ));
    }

    #[test]
    fn growing_adds_widens_and_keeps_dropped_columns() {
        let g = grow(
            &planned(),
            &sent(&[
                ("id", "BIGINT"),
                ("n", "BIGINT"),
                ("d", "DECIMAL(12,2)"),
                ("extra", "INT"),
            ]),
            &["v".to_string()],
        )
        .unwrap();
        let shape: Vec<(String, String, bool)> = g
            .columns
            .iter()
            .map(|c| (c.name.name.clone(), c.ty.to_string(), c.nullable))
            .collect();
        assert_eq!(
            shape,
            vec![
                ("id".into(), "BIGINT".into(), false),
                ("v".into(), "VARCHAR".into(), true),
                ("n".into(), "BIGINT".into(), true),
                ("d".into(), "DECIMAL(12,2)".into(), true),
                ("extra".into(), "INT".into(), true),
            ]
        );
        assert_eq!(g.dropped, vec!["v".to_string()]);
        // A column the stream does not send yet (it was added later) is
        // nullable, not dropped; one dropped earlier and sent again (a
        // replay of an older shape) stays dropped.
        let later = grow(
            &g,
            &sent(&[("id", "BIGINT"), ("v", "TEXT"), ("n", "BIGINT")]),
            &[],
        )
        .unwrap();
        assert_eq!(later.dropped, vec!["v".to_string()]);
        assert!(
            later
                .columns
                .iter()
                .all(|c| c.nullable || c.name.name == "id")
        );
        assert_eq!(
            describe_difference(
                &planned(),
                &sent(&[("id", "BIGINT"), ("n", "BIGINT"), ("extra", "INT")]),
                &["v".to_string()]
            ),
            "column n changed from INT to BIGINT; column extra (INT) added; column v dropped"
        );
    }

    #[test]
    fn refused_changes_and_dropped_keys_are_errors_naming_the_column() {
        let mut p = planned();
        p.columns[2] = col("n", "BIGINT", true);
        let e = grow(
            &p,
            &sent(&[("id", "BIGINT"), ("v", "TEXT"), ("n", "TEXT")]),
            &[],
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("column n changed type from BIGINT to VARCHAR"),
            "{text}"
        );
        assert!(text.contains(PROMOTION_RULE), "{text}");
        let e = grow(&planned(), &sent(&[("v", "TEXT")]), &[]).unwrap_err();
        assert_eq!(
            e,
            ShapeError::KeyDropped {
                column: "id".into()
            }
        );
    }

    #[test]
    fn the_catalog_widens_and_extends_what_the_stream_asked_for() {
        let grown = grow(
            &planned(),
            &sent(&[("id", "BIGINT"), ("n", "INT"), ("extra", "INT")]),
            &["v".to_string(), "d".to_string()],
        )
        .unwrap();
        // Later, at the source: extra became bigint, z was added, v came back.
        let current = SourceTableSchema {
            columns: vec![
                col("id", "BIGINT", false),
                col("n", "INT", true),
                col("extra", "BIGINT", true),
                col("z", "DATE", false),
                col("v", "TEXT", true),
            ],
            primary_key: vec!["id".into()],
            dropped: vec![],
        };
        let m = merge_with_catalog(&current, &grown);
        let names: Vec<&str> = m.columns.iter().map(|c| c.name.name.as_str()).collect();
        assert_eq!(names, ["id", "v", "n", "d", "extra", "z"]);
        assert_eq!(m.columns[4].ty, CanonicalType::Int64);
        assert!(m.columns[5].nullable);
        assert_eq!(m.dropped, vec!["d".to_string()], "v is back");
    }
}
