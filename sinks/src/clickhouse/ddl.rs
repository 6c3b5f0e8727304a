//! ClickHouse table definitions: how a route's target becomes a table, the
//! text of identifiers and literals, and the check of an existing table.
//!
//! Type mapping (canonical → ClickHouse; `Nullable(..)` for nullable
//! columns, never for key columns):
//! bool → Bool, int32/int64/uint64 → Int32/Int64/UInt64 (uint64 native),
//! float32/float64 → Float32/Float64, decimal(p,s) → Decimal(p, s),
//! string/json/unknown → String (JSON as its text), binary → String,
//! fixed(n) → FixedString(n), date → Date32, time → Time64(6),
//! timestamp → DateTime64(6), timestamptz → DateTime64(6, 'UTC'),
//! uuid → UUID, struct → Tuple(name T, ..), list → Array(Nullable(T)),
//! map → Map(K, Nullable(V)).
//!
//! ClickHouse cannot make an Array or a Map Nullable: a NULL list or map
//! lands as an empty one (the sink warns when it creates such a column).

use urutau_planner::evolution;
use urutau_planner::spec::WriteMode;
use urutau_planner::target::TargetTable;
use urutau_planner::types::CanonicalType;

/// The reserved column holding the position a row was committed with.
pub const POSITION: &str = "position";
/// The reserved version column (`ReplacingMergeTree(seq, ..)`).
pub const SEQ: &str = "seq";
/// The reserved tombstone flag (`ReplacingMergeTree(.., is_deleted)`).
pub const IS_DELETED: &str = "is_deleted";
/// The reserved columns, appended after the route's columns.
pub const RESERVED: [&str; 3] = [POSITION, SEQ, IS_DELETED];

/// `name` as a ClickHouse identifier: always quoted, so keywords
/// (`order`) and spaces work.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// `text` as a ClickHouse string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The ClickHouse type of a canonical type (`nullable` for the outer
/// level; nested values are always nullable, except map keys).
pub fn column_type(ty: &CanonicalType, nullable: bool) -> String {
    let base = match ty {
        CanonicalType::Bool => "Bool".to_string(),
        CanonicalType::Int32 => "Int32".to_string(),
        CanonicalType::Int64 => "Int64".to_string(),
        CanonicalType::UInt64 => "UInt64".to_string(),
        CanonicalType::Float32 => "Float32".to_string(),
        CanonicalType::Float64 => "Float64".to_string(),
        CanonicalType::Decimal { precision, scale } => format!("Decimal({precision}, {scale})"),
        CanonicalType::String
        | CanonicalType::Json
        | CanonicalType::Unknown(_)
        | CanonicalType::Binary => "String".to_string(),
        CanonicalType::Fixed(n) => format!("FixedString({n})"),
        CanonicalType::Date => "Date32".to_string(),
        CanonicalType::Time => "Time64(6)".to_string(),
        CanonicalType::Timestamp => "DateTime64(6)".to_string(),
        CanonicalType::TimestampTz => "DateTime64(6, 'UTC')".to_string(),
        CanonicalType::Uuid => "UUID".to_string(),
        CanonicalType::Struct(fields) => format!(
            "Tuple({})",
            fields
                .iter()
                .map(|f| format!("{} {}", ident(&f.name), column_type(&f.ty, true)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        CanonicalType::List(item) => return format!("Array({})", column_type(item, true)),
        CanonicalType::Map(k, v) => {
            return format!("Map({}, {})", column_type(k, false), column_type(v, true));
        }
    };
    if nullable {
        format!("Nullable({base})")
    } else {
        base
    }
}

/// Whether a NULL of this type cannot be stored (it lands empty).
pub fn loses_null(ty: &CanonicalType) -> bool {
    matches!(ty, CanonicalType::List(_) | CanonicalType::Map(..))
}

/// The table engine a route needs (without arguments): rows replace one
/// another by key (upsert) or by coordinate (append-idempotent).
pub fn engine_name(target: &TargetTable) -> &'static str {
    match target.mode {
        WriteMode::Upsert | WriteMode::AppendIdempotent => "ReplacingMergeTree",
        WriteMode::Append => "MergeTree",
    }
}

/// The columns of the table a route needs: `(name, ClickHouse type)`,
/// route columns then the reserved ones. The columns the table is ordered
/// by are never Nullable.
pub fn table_columns(target: &TargetTable) -> Vec<(String, String)> {
    let order = target.order_columns();
    let mut out: Vec<(String, String)> = target
        .columns
        .iter()
        .map(|c| {
            let in_order = order.contains(&c.name.as_str());
            (c.name.clone(), column_type(&c.ty, c.nullable && !in_order))
        })
        .collect();
    out.push((POSITION.into(), "String".into()));
    out.push((SEQ.into(), "UInt64".into()));
    out.push((IS_DELETED.into(), "UInt8".into()));
    out
}

/// The columns of `target` that collide with a reserved name.
pub fn reserved_collisions(target: &TargetTable) -> Vec<String> {
    target
        .columns
        .iter()
        .filter(|c| RESERVED.contains(&c.name.as_str()))
        .map(|c| c.name.clone())
        .collect()
}

/// `CREATE TABLE IF NOT EXISTS` for `target` in `database`.
///
/// Upsert: `ReplacingMergeTree(seq, is_deleted) ORDER BY (key)` with the
/// table setting `OPTIMIZE .. FINAL CLEANUP` needs; append: `MergeTree`
/// ordered by the key when there is one; append-idempotent:
/// `ReplacingMergeTree(seq) ORDER BY (stream, shard, sequence)`, so a change
/// landed twice (a partitioned table's replay) is merged away, and `FINAL`
/// reads it once. `PARTITION BY` only when the route asks for it.
pub fn create_table(database: &str, table: &str, target: &TargetTable) -> String {
    let columns = table_columns(target)
        .iter()
        .map(|(n, t)| format!("  {} {}", ident(n), t))
        .collect::<Vec<_>>()
        .join(",\n");
    let order_columns = target.order_columns();
    let order = if order_columns.is_empty() {
        "tuple()".to_string()
    } else {
        format!(
            "({})",
            order_columns
                .iter()
                .map(|k| ident(k))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let (args, settings) = match target.mode {
        WriteMode::Upsert => (
            format!("({}, {})", ident(SEQ), ident(IS_DELETED)),
            "\nSETTINGS allow_experimental_replacing_merge_with_cleanup = 1",
        ),
        // Copies of one change hold equal data; the newest (highest `seq`)
        // stays, so the table's `max(seq)` never goes down.
        WriteMode::AppendIdempotent => (format!("({})", ident(SEQ)), ""),
        WriteMode::Append => (String::new(), ""),
    };
    let engine = format!("{}{args}", engine_name(target));
    let partition = if target.partition_by.is_empty() {
        String::new()
    } else {
        format!(
            "\nPARTITION BY ({})",
            target
                .partition_by
                .iter()
                .map(partition_expr)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {}.{} (\n{columns}\n) ENGINE = {engine}{partition}\nORDER BY {order}{settings}",
        ident(database),
        ident(table)
    )
}

/// A `partition_by` field as a ClickHouse expression.
fn partition_expr(f: &urutau_planner::partition::PartitionField) -> String {
    use urutau_planner::partition::Transform;
    let c = ident(&f.column);
    match f.transform {
        Transform::Identity => c,
        Transform::Year => format!("toYear({c})"),
        Transform::Month => format!("toYYYYMM({c})"),
        Transform::Day => format!("toDate({c})"),
        Transform::Hour => format!("toStartOfHour({c})"),
        Transform::Bucket(n) => format!("cityHash64({c}) % {n}"),
        Transform::Truncate(w) => format!("substring(toString({c}), 1, {w})"),
    }
}

/// Type text as ClickHouse normalizes it in `system.columns` (no quotes
/// around tuple element names, no spaces), for comparison.
pub fn normalized(type_text: &str) -> String {
    type_text
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '`')
        .collect()
}

/// A sorting key as `system.tables` shows it (`id`, `(id)`, `a, b`), as
/// its column names.
pub fn sorting_columns(key: &str) -> Vec<String> {
    key.split(',')
        .map(|k| {
            k.chars()
                .filter(|c| !c.is_whitespace() && !matches!(c, '`' | '(' | ')'))
                .collect::<String>()
        })
        .filter(|k| !k.is_empty())
        .collect()
}

/// What is wrong with an existing table, as `(name, type)` lists: one
/// message per missing or differently typed column.
pub fn column_problems(existing: &[(String, String)], wanted: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, ty) in wanted {
        match existing.iter().find(|(n, _)| n == name) {
            None => out.push(format!("column `{name}` ({ty}) is missing")),
            Some((_, have)) if normalized(have) != normalized(ty) => {
                out.push(format!("column `{name}` is {have}, the route needs {ty}"))
            }
            Some(_) => {}
        }
    }
    for (name, ty) in existing {
        if !wanted.iter().any(|(n, _)| n == name) {
            out.push(format!(
                "column `{name}` ({ty}) is not written by the route"
            ));
        }
    }
    out
}

/// `T` of `Nullable(T)` (normalized text), and whether it was Nullable.
fn strip_nullable(type_text: &str) -> (String, bool) {
    let t = normalized(type_text);
    match t
        .strip_prefix("Nullable(")
        .and_then(|r| r.strip_suffix(')'))
    {
        Some(inner) => (inner.to_string(), true),
        None => (t, false),
    }
}

/// The canonical type of a ClickHouse base type, for the types a column
/// can be promoted between (see [`urutau_planner::evolution::promotes`]).
fn promotable(base: &str) -> Option<CanonicalType> {
    Some(match base {
        "Int32" => CanonicalType::Int32,
        "Int64" => CanonicalType::Int64,
        "Float32" => CanonicalType::Float32,
        "Float64" => CanonicalType::Float64,
        _ => {
            let (p, s) = base
                .strip_prefix("Decimal(")?
                .strip_suffix(')')?
                .split_once(',')?;
            CanonicalType::Decimal {
                precision: p.trim().parse().ok()?,
                scale: s.trim().parse().ok()?,
            }
        }
    })
}

/// The `ALTER TABLE` statements that evolve an existing table (`existing`:
/// its `(name, type)` columns in order) toward `target`
/// (`schema_changes = 'evolve'`): a column the table lacks is added
/// (Nullable, after the route's columns, before the reserved ones); a
/// column whose type the route widens in place (Int32 -> Int64, Float32 ->
/// Float64, a Decimal's precision at the same scale) is modified; a
/// column the route writes as nullable, or no longer writes, becomes
/// Nullable. Any other difference (a type narrower than the table's, or
/// of another kind) is an error naming the column (a key column's type
/// never changes: ClickHouse cannot alter a sorting key column).
pub fn evolution(
    database: &str,
    table: &str,
    existing: &[(String, String)],
    target: &TargetTable,
) -> Result<Vec<String>, Vec<String>> {
    let name = format!("{}.{}", ident(database), ident(table));
    let order = target.order_columns();
    let mut alters = Vec::new();
    let mut problems = Vec::new();
    let mut after = existing
        .iter()
        .take_while(|(n, _)| !RESERVED.contains(&n.as_str()))
        .last()
        .map(|(n, _)| n.clone());
    for c in &target.columns {
        let in_order = order.contains(&c.name.as_str());
        let Some((_, have)) = existing.iter().find(|(n, _)| *n == c.name) else {
            let place = match &after {
                Some(a) => format!(" AFTER {}", ident(a)),
                None => " FIRST".to_string(),
            };
            alters.push(format!(
                "ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {} {}{place}",
                ident(&c.name),
                column_type(&c.ty, !in_order)
            ));
            after = Some(c.name.clone());
            continue;
        };
        let (have_base, have_null) = strip_nullable(have);
        let (want_base, want_null) = strip_nullable(&column_type(&c.ty, c.nullable && !in_order));
        let nullable = have_null || want_null;
        let base = if have_base == want_base {
            have_base.clone()
        } else {
            match (promotable(&have_base), promotable(&want_base)) {
                (Some(h), Some(w)) if evolution::promotes(&h, &w) && !in_order => want_base,
                (Some(h), Some(w)) if evolution::promotes(&h, &w) => {
                    problems.push(format!(
                        "key column `{}` is {have} in the table and the route writes {want_base}: ClickHouse cannot change the type of a sorting key column",
                        c.name
                    ));
                    continue;
                }
                _ => {
                    problems.push(format!(
                        "column `{}` is {have} in the table, and the route writes {want_base}: {}",
                        c.name,
                        evolution::PROMOTION_RULE
                    ));
                    continue;
                }
            }
        };
        if nullable != have_null || base != have_base {
            let ty = if nullable {
                format!("Nullable({base})")
            } else {
                base
            };
            alters.push(format!(
                "ALTER TABLE {name} MODIFY COLUMN {} {ty}",
                ident(&c.name)
            ));
        }
    }
    // Columns the route no longer writes keep their data and read NULL
    // from now on (Array and Map cannot be Nullable: they read empty).
    for (n, have) in existing {
        if RESERVED.contains(&n.as_str()) || target.columns.iter().any(|c| &c.name == n) {
            continue;
        }
        let (base, nullable) = strip_nullable(have);
        if !nullable && !base.starts_with("Array(") && !base.starts_with("Map(") {
            alters.push(format!(
                "ALTER TABLE {name} MODIFY COLUMN {} Nullable({base})",
                ident(n)
            ));
        }
    }
    let reserved: Vec<(String, String)> = table_columns(target)
        .into_iter()
        .filter(|(n, _)| RESERVED.contains(&n.as_str()))
        .collect();
    let reserved_existing: Vec<(String, String)> = existing
        .iter()
        .filter(|(n, _)| RESERVED.contains(&n.as_str()))
        .cloned()
        .collect();
    problems.extend(column_problems(&reserved_existing, &reserved));
    if problems.is_empty() {
        Ok(alters)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urutau_planner::types::StructField;

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(ident("order"), "`order`");
        assert_eq!(ident("a`b\\c"), "`a\\`b\\\\c`");
        assert_eq!(literal("it's"), "'it\\'s'");
    }

    #[test]
    fn nested_types_map_natively() {
        let ty = CanonicalType::Struct(vec![
            StructField {
                name: "a b".into(),
                ty: CanonicalType::List(Box::new(CanonicalType::Int32)),
            },
            StructField {
                name: "m".into(),
                ty: CanonicalType::Map(
                    Box::new(CanonicalType::String),
                    Box::new(CanonicalType::Decimal {
                        precision: 12,
                        scale: 2,
                    }),
                ),
            },
        ]);
        assert_eq!(
            column_type(&ty, true),
            "Nullable(Tuple(`a b` Array(Nullable(Int32)), `m` Map(String, Nullable(Decimal(12, 2)))))"
        );
        assert_eq!(
            normalized(&column_type(&ty, false)),
            normalized(
                "Tuple(a b Array(Nullable(Int32)), m Map(String, Nullable(Decimal(12, 2))))"
            )
        );
        assert_eq!(
            column_type(&CanonicalType::List(Box::new(CanonicalType::Uuid)), true),
            "Array(Nullable(UUID))"
        );
    }

    #[test]
    fn problems_name_the_columns() {
        let wanted = vec![
            ("id".to_string(), "Int64".to_string()),
            ("v".to_string(), "Nullable(String)".to_string()),
        ];
        let existing = vec![
            ("id".to_string(), "Int32".to_string()),
            ("w".to_string(), "String".to_string()),
        ];
        let p = column_problems(&existing, &wanted);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("`id` is Int32"));
        assert!(p[1].contains("`v` (Nullable(String)) is missing"));
        assert!(p[2].contains("`w`"));
    }

    #[test]
    fn evolving_alters_the_table_in_place() {
        use urutau_planner::target::{ColumnOrigin, TargetColumn};
        let column = |name: &str, ty: &str, nullable| TargetColumn {
            name: name.into(),
            ty: CanonicalType::parse(ty, false).unwrap(),
            nullable,
            origin: ColumnOrigin::Data,
        };
        let target = TargetTable {
            name: vec!["t".into()],
            columns: vec![
                column("id", "BIGINT", false),
                column("n", "BIGINT", true),
                column("amount", "DECIMAL(12,2)", true),
                column("extra", "INT", true),
            ],
            key: vec!["id".into()],
            mode: WriteMode::Upsert,
            partition_by: vec![],
            workers: 1,
            schema_changes: Default::default(),
        };
        let existing: Vec<(String, String)> = [
            ("id", "Int64"),
            ("v", "String"),
            ("n", "Nullable(Int32)"),
            ("amount", "Nullable(Decimal(10, 2))"),
            ("position", "String"),
            ("seq", "UInt64"),
            ("is_deleted", "UInt8"),
        ]
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
        let alters = evolution("db", "t", &existing, &target).unwrap();
        assert_eq!(
            alters,
            vec![
                "ALTER TABLE `db`.`t` MODIFY COLUMN `n` Nullable(Int64)",
                "ALTER TABLE `db`.`t` MODIFY COLUMN `amount` Nullable(Decimal(12,2))",
                "ALTER TABLE `db`.`t` ADD COLUMN IF NOT EXISTS `extra` Nullable(Int32) AFTER `amount`",
                "ALTER TABLE `db`.`t` MODIFY COLUMN `v` Nullable(String)",
            ]
        );
        // Narrower than the table, or a key column's type: refused.
        let mut narrower = target.clone();
        narrower.columns[1] = column("n", "INT", true);
        let evolved: Vec<(String, String)> = existing
            .iter()
            .map(|(n, t)| match n.as_str() {
                "n" => (n.clone(), "Nullable(Int64)".to_string()),
                _ => (n.clone(), t.clone()),
            })
            .collect();
        let problems = evolution("db", "t", &evolved, &narrower).unwrap_err();
        assert!(
            problems[0].contains("`n` is Nullable(Int64)"),
            "{problems:?}"
        );
        let key32: Vec<(String, String)> = existing
            .iter()
            .map(|(n, t)| match n.as_str() {
                "id" => (n.clone(), "Int32".to_string()),
                _ => (n.clone(), t.clone()),
            })
            .collect();
        let problems = evolution("db", "t", &key32, &target).unwrap_err();
        assert!(problems[0].contains("sorting key"), "{problems:?}");
    }

    #[test]
    fn an_append_idempotent_table_replaces_by_its_coordinate() {
        use urutau_planner::target::{ColumnOrigin, TargetColumn};
        let column = |name: &str, ty, origin| TargetColumn {
            name: name.into(),
            ty,
            nullable: true,
            origin,
        };
        let meta = |m: &str| ColumnOrigin::Metadata(m.into());
        let target = TargetTable {
            name: vec!["log".into()],
            columns: vec![
                column("id", CanonicalType::Int64, ColumnOrigin::Data),
                column("seq_no", CanonicalType::Int64, meta("sequence")),
                column("topic", CanonicalType::String, meta("stream")),
                column("part", CanonicalType::Int32, meta("shard")),
            ],
            // A key does not make changes of one key collapse.
            key: vec!["id".into()],
            mode: WriteMode::AppendIdempotent,
            partition_by: vec![],
            workers: 1,
            schema_changes: Default::default(),
        };
        assert_eq!(target.order_columns(), ["topic", "part", "seq_no"]);
        let sql = create_table("db", "log", &target);
        assert!(sql.contains("ENGINE = ReplacingMergeTree(`seq`)"), "{sql}");
        assert!(
            sql.contains("ORDER BY (`topic`, `part`, `seq_no`)"),
            "{sql}"
        );
        assert!(sql.contains("`topic` String,"), "{sql}");
        assert!(sql.contains("`seq_no` Int64,"), "{sql}");
        assert!(sql.contains("`id` Nullable(Int64)"), "{sql}");
    }
}
