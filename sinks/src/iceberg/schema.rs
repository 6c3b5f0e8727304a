//! The one mapping from a route's target (canonical types) to an Iceberg
//! table — schema, identifier fields, partition spec, sort order — and the
//! check that an existing table matches; plus conforming Arrow batches to
//! the table's Arrow form (field ids, uuid as 16 bytes, uint64 as
//! decimal(20,0), `+00:00` timestamps, Iceberg's nested field names).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeBinaryBuilder, ListArray, MapArray, StructArray,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef as ArrowSchemaRef};
use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, NullOrder, PrimitiveType, Schema,
    SortDirection, SortField, SortOrder, StructType, Transform, Type, UnboundPartitionSpec,
};
use urutau_planner::partition::{PartitionField, Transform as RouteTransform};
use urutau_planner::spec::WriteMode;
use urutau_planner::target::{ColumnOrigin, TargetTable};
use urutau_planner::types::CanonicalType;

/// Assigns field ids depth-first while a schema is built.
struct Ids(i32);

impl Ids {
    fn next(&mut self) -> i32 {
        self.0 += 1;
        self.0
    }
}

/// The Iceberg type of a canonical type. `uint64` has no Iceberg type of its
/// own and becomes `decimal(20,0)`, which holds every value; `json` and
/// `unknown` (raw text) become `string`.
fn iceberg_type(ty: &CanonicalType, ids: &mut Ids) -> Type {
    use CanonicalType as C;
    let p = |p: PrimitiveType| Type::Primitive(p);
    match ty {
        C::Bool => p(PrimitiveType::Boolean),
        C::Int32 => p(PrimitiveType::Int),
        C::Int64 => p(PrimitiveType::Long),
        C::UInt64 => p(PrimitiveType::Decimal {
            precision: 20,
            scale: 0,
        }),
        C::Float32 => p(PrimitiveType::Float),
        C::Float64 => p(PrimitiveType::Double),
        C::Decimal { precision, scale } => p(PrimitiveType::Decimal {
            precision: *precision as u32,
            scale: *scale as u32,
        }),
        C::String | C::Json | C::Unknown(_) => p(PrimitiveType::String),
        C::Binary => p(PrimitiveType::Binary),
        C::Fixed(n) => p(PrimitiveType::Fixed(*n as u64)),
        C::Date => p(PrimitiveType::Date),
        C::Time => p(PrimitiveType::Time),
        C::Timestamp => p(PrimitiveType::Timestamp),
        C::TimestampTz => p(PrimitiveType::Timestamptz),
        C::Uuid => p(PrimitiveType::Uuid),
        C::Struct(fields) => {
            let ids_for: Vec<i32> = fields.iter().map(|_| ids.next()).collect();
            Type::Struct(StructType::new(
                fields
                    .iter()
                    .zip(ids_for)
                    .map(|(f, id)| {
                        NestedField::optional(id, &f.name, iceberg_type(&f.ty, ids)).into()
                    })
                    .collect(),
            ))
        }
        C::List(item) => {
            let id = ids.next();
            Type::List(ListType::new(
                NestedField::list_element(id, iceberg_type(item, ids), false).into(),
            ))
        }
        C::Map(k, v) => {
            let (kid, vid) = (ids.next(), ids.next());
            Type::Map(MapType::new(
                NestedField::map_key_element(kid, iceberg_type(k, ids)).into(),
                NestedField::map_value_element(vid, iceberg_type(v, ids), false).into(),
            ))
        }
    }
}

/// The Iceberg schema of a target table: its columns in order; an upsert
/// table's key columns marked as identifier fields (the values that
/// identify a row; an append table holds many rows per key, so it has
/// none).
pub fn table_schema(target: &TargetTable) -> iceberg::Result<Schema> {
    let mut ids = Ids(target.columns.len() as i32);
    let mut fields: Vec<NestedFieldRef> = Vec::new();
    let mut identifier = Vec::new();
    for (i, c) in target.columns.iter().enumerate() {
        let id = i as i32 + 1;
        let ty = iceberg_type(&c.ty, &mut ids);
        let is_key = target.mode == WriteMode::Upsert && target.key.contains(&c.name);
        if is_key {
            identifier.push(id);
        }
        fields.push(NestedField::new(id, &c.name, ty, !c.nullable).into());
    }
    let mut b = Schema::builder().with_fields(fields);
    if !identifier.is_empty() {
        b = b.with_identifier_field_ids(identifier);
    }
    b.build()
}

/// The partition spec of `partition_by` over `schema`.
pub fn partition_spec(
    fields: &[PartitionField],
    schema: &Schema,
) -> iceberg::Result<UnboundPartitionSpec> {
    let mut b = UnboundPartitionSpec::builder();
    for f in fields {
        let source = schema.field_id_by_name(&f.column).ok_or_else(|| {
            iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!("partition column {} is not in the table", f.column),
            )
        })?;
        let (transform, name) = match f.transform {
            RouteTransform::Identity => (Transform::Identity, f.column.clone()),
            RouteTransform::Year => (Transform::Year, format!("{}_year", f.column)),
            RouteTransform::Month => (Transform::Month, format!("{}_month", f.column)),
            RouteTransform::Day => (Transform::Day, format!("{}_day", f.column)),
            RouteTransform::Hour => (Transform::Hour, format!("{}_hour", f.column)),
            RouteTransform::Bucket(n) => (Transform::Bucket(n), format!("{}_bucket", f.column)),
            RouteTransform::Truncate(n) => (Transform::Truncate(n), format!("{}_trunc", f.column)),
        };
        b = b.add_partition_field(source, name, transform)?;
    }
    Ok(b.build())
}

/// The table's sort order: by key, ascending; an `append-idempotent`
/// table's by the transport coordinate (stream, shard, sequence), the order
/// its rows arrive in, so duplicates (rows sharing one) would sit side by
/// side.
pub fn sort_order(target: &TargetTable, schema: &Schema) -> iceberg::Result<SortOrder> {
    let columns = target.order_columns();
    if columns.is_empty() {
        return Ok(SortOrder::unsorted_order());
    }
    let mut b = SortOrder::builder();
    b.with_order_id(1);
    for k in columns {
        if let Some(id) = schema.field_id_by_name(k) {
            b.with_sort_field(
                SortField::builder()
                    .source_id(id)
                    .transform(Transform::Identity)
                    .direction(SortDirection::Ascending)
                    .null_order(NullOrder::First)
                    .build(),
            );
        }
    }
    b.build(schema)
}

/// Types equal apart from field ids (ids are reassigned when a table is
/// created, and differ between tables anyway).
fn same_type(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Primitive(x), Type::Primitive(y)) => x == y,
        (Type::Struct(x), Type::Struct(y)) => {
            x.fields().len() == y.fields().len()
                && x.fields()
                    .iter()
                    .zip(y.fields())
                    .all(|(f, g)| f.name == g.name && same_type(&f.field_type, &g.field_type))
        }
        (Type::List(x), Type::List(y)) => {
            same_type(&x.element_field.field_type, &y.element_field.field_type)
        }
        (Type::Map(x), Type::Map(y)) => {
            same_type(&x.key_field.field_type, &y.key_field.field_type)
                && same_type(&x.value_field.field_type, &y.value_field.field_type)
        }
        _ => false,
    }
}

/// Checks an existing table against the route: same columns (names, types,
/// order), key columns required and the table's identifier fields. Returns
/// every difference, naming the columns.
pub fn check_existing(existing: &Schema, wanted: &Schema) -> Vec<String> {
    let mut problems = Vec::new();
    let have = existing.as_struct().fields();
    let want = wanted.as_struct().fields();
    for w in want {
        match have.iter().find(|h| h.name == w.name) {
            None => problems.push(format!(
                "column `{}` ({}) is missing from the table",
                w.name, w.field_type
            )),
            Some(h) if !same_type(&h.field_type, &w.field_type) => problems.push(format!(
                "column `{}` is {} in the table, and the route writes {}",
                w.name, h.field_type, w.field_type
            )),
            Some(h) if w.required && !h.required => {
                problems.push(format!("key column `{}` is optional in the table", w.name))
            }
            Some(_) => {}
        }
    }
    for h in have {
        if !want.iter().any(|w| w.name == h.name) {
            problems.push(format!(
                "the table has column `{}`, which the route does not write",
                h.name
            ));
        }
    }
    problems.extend(key_problems(existing, wanted));
    problems
}

/// How an existing table's identifier fields differ from the key of the
/// route's schema `wanted`, one message each.
fn key_problems(existing: &Schema, wanted: &Schema) -> Vec<String> {
    let names = |s: &Schema| -> Vec<String> {
        let mut v: Vec<String> = s
            .identifier_field_ids()
            .filter_map(|id| s.name_by_field_id(id).map(str::to_string))
            .collect();
        v.sort();
        v
    };
    let (hk, wk) = (names(existing), names(wanted));
    if hk.is_empty() && !wk.is_empty() {
        vec![format!(
            "the table has no identifier fields (an append table holds many rows per key), and the upsert route's key is [{}]",
            wk.join(", ")
        )]
    } else if hk != wk && !wk.is_empty() {
        vec![format!(
            "the table's identifier fields are [{}], the route's key is [{}]",
            hk.join(", "),
            wk.join(", ")
        )]
    } else {
        Vec::new()
    }
}

/// An existing table evolved toward a route ([`evolve`]).
#[derive(Debug)]
pub struct Evolved {
    /// The table's next schema (new field ids above the table's last
    /// one; every kept field keeps its id).
    pub schema: Schema,
    /// What changed, one entry per column, for the log.
    pub changes: Vec<String>,
}

/// The Iceberg type a promotion of `from` to canonical `to` gives, when
/// `from` is a primitive that `to` promotes in place (see
/// [`urutau_planner::evolution::promotes`]).
fn promoted(from: &Type, to: &Type) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (Type::Primitive(a), Type::Primitive(b)) => match (a, b) {
            (P::Int, P::Long) | (P::Float, P::Double) => true,
            (
                P::Decimal {
                    precision: p1,
                    scale: s1,
                },
                P::Decimal {
                    precision: p2,
                    scale: s2,
                },
            ) => s1 == s2 && p2 > p1,
            _ => false,
        },
        _ => false,
    }
}

/// The schema an existing table (`existing`, whose highest field id ever
/// assigned is `last_column_id`) evolves to so `target` can write it, as
/// Iceberg's schema evolution allows (`schema_changes = 'evolve'`):
/// - a column the table lacks is added, optional, with a new field id,
///   before the metadata columns (which stay at the end);
/// - a column whose type `target` widens in place (int -> long, float ->
///   double, decimal precision up) is promoted, keeping its id;
/// - a required column the route writes as nullable, or no longer writes
///   at all (dropped at the source), becomes optional;
/// - columns the route no longer writes stay (data is never dropped).
///
/// `Ok(None)`: the table already fits. Any other difference (a type that
/// cannot be promoted, one narrower than the table's, a different key) is
/// an error naming each column.
pub fn evolve(
    existing: &Schema,
    last_column_id: i32,
    target: &TargetTable,
) -> Result<Option<Evolved>, Vec<String>> {
    let wanted = table_schema(target).map_err(|e| vec![e.to_string()])?;
    let mut problems = Vec::new();
    let mut changes = Vec::new();
    let mut ids = Ids(last_column_id.max(existing.highest_field_id()));
    let have = existing.as_struct().fields();
    let is_metadata = |name: &str| {
        target
            .columns
            .iter()
            .any(|c| c.name == name && matches!(c.origin, ColumnOrigin::Metadata(_)))
    };
    // Existing fields, evolved in place.
    let mut kept: Vec<NestedFieldRef> = Vec::with_capacity(have.len());
    for h in have {
        let Some(w) = wanted
            .as_struct()
            .fields()
            .iter()
            .find(|w| w.name == h.name)
        else {
            if h.required {
                changes.push(format!("{} (no longer written) is now optional", h.name));
                kept.push(relaxed(h));
            } else {
                kept.push(Arc::clone(h));
            }
            continue;
        };
        let mut field = Arc::clone(h);
        if !same_type(&h.field_type, &w.field_type) {
            if promoted(&h.field_type, &w.field_type) {
                changes.push(format!(
                    "{} promoted from {} to {}",
                    h.name, h.field_type, w.field_type
                ));
                field = Arc::new(NestedField::new(
                    h.id,
                    &h.name,
                    (*w.field_type).clone(),
                    h.required,
                ));
            } else {
                // Narrower than the table (the source narrowed the column)
                // or of another kind: neither can be followed.
                problems.push(format!(
                    "column `{}` is {} in the table, and the route writes {}: {}",
                    w.name,
                    h.field_type,
                    w.field_type,
                    urutau_planner::evolution::PROMOTION_RULE
                ));
                continue;
            }
        }
        if field.required && !w.required {
            changes.push(format!("{} is now optional", h.name));
            field = relaxed(&field);
        }
        if w.required && !field.required {
            problems.push(format!("key column `{}` is optional in the table", w.name));
        }
        kept.push(field);
    }
    // New fields: data columns before the metadata columns, new metadata
    // columns at the end.
    let mut added_data = Vec::new();
    let mut added_metadata = Vec::new();
    for c in &target.columns {
        if have.iter().any(|h| h.name == c.name) {
            continue;
        }
        let id = ids.next();
        let ty = iceberg_type(&c.ty, &mut ids);
        changes.push(format!("{} ({ty}) added", c.name));
        let field: NestedFieldRef = NestedField::optional(id, &c.name, ty).into();
        match c.origin {
            ColumnOrigin::Metadata(_) => added_metadata.push(field),
            ColumnOrigin::Data => added_data.push(field),
        }
    }
    let first_metadata = kept
        .iter()
        .position(|f| is_metadata(&f.name))
        .unwrap_or(kept.len());
    let mut fields = kept;
    fields.splice(first_metadata..first_metadata, added_data);
    fields.extend(added_metadata);
    // The key stays the key.
    problems.extend(key_problems(existing, &wanted));
    if !problems.is_empty() {
        return Err(problems);
    }
    if changes.is_empty() {
        return Ok(None);
    }
    let mut b = Schema::builder().with_fields(fields);
    let identifier: Vec<i32> = existing.identifier_field_ids().collect();
    if !identifier.is_empty() {
        b = b.with_identifier_field_ids(identifier);
    }
    let schema = b.build().map_err(|e| vec![e.to_string()])?;
    Ok(Some(Evolved { schema, changes }))
}

/// `field`, optional.
fn relaxed(field: &NestedFieldRef) -> NestedFieldRef {
    Arc::new(NestedField::new(
        field.id,
        &field.name,
        (*field.field_type).clone(),
        false,
    ))
}

/// Rebuilds `array` with exactly the Arrow type `target` (the table's form):
/// nested field names and ids, uuid text as 16 bytes, uint64 as decimal,
/// the timestamp zone string, binary width.
pub fn conform(array: &ArrayRef, target: &DataType) -> Result<ArrayRef, String> {
    if array.data_type() == target {
        return Ok(Arc::clone(array));
    }
    match (array.data_type(), target) {
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let s = array.as_struct();
            let columns = s
                .columns()
                .iter()
                .zip(fields.iter())
                .map(|(c, f)| conform(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(
                StructArray::try_new(fields.clone(), columns, s.nulls().cloned())
                    .map_err(|e| e.to_string())?,
            ))
        }
        (DataType::List(_), DataType::List(field)) => {
            let l = array.as_list::<i32>();
            let values = conform(l.values(), field.data_type())?;
            Ok(Arc::new(
                ListArray::try_new(
                    Arc::clone(field),
                    l.offsets().clone(),
                    values,
                    l.nulls().cloned(),
                )
                .map_err(|e| e.to_string())?,
            ))
        }
        (DataType::Map(_, _), DataType::Map(entries, sorted)) => {
            let m = array.as_map();
            let entries_array: ArrayRef = Arc::new(m.entries().clone());
            let conformed = conform(&entries_array, entries.data_type())?;
            Ok(Arc::new(
                MapArray::try_new(
                    Arc::clone(entries),
                    m.offsets().clone(),
                    conformed.as_struct().clone(),
                    m.nulls().cloned(),
                    *sorted,
                )
                .map_err(|e| e.to_string())?,
            ))
        }
        // uuid travels as canonical text.
        (DataType::Utf8, DataType::FixedSizeBinary(16)) => {
            let s = array.as_string::<i32>();
            let mut b = FixedSizeBinaryBuilder::with_capacity(s.len(), 16);
            for i in 0..s.len() {
                if s.is_null(i) {
                    b.append_null();
                } else {
                    let u = uuid::Uuid::parse_str(s.value(i))
                        .map_err(|_| format!("`{}` is not a uuid", s.value(i)))?;
                    b.append_value(u.as_bytes()).map_err(|e| e.to_string())?;
                }
            }
            Ok(Arc::new(b.finish()))
        }
        // The same instants; only the zone's spelling differs ("UTC" vs "+00:00").
        (DataType::Timestamp(u1, Some(_)), DataType::Timestamp(u2, Some(tz))) if u1 == u2 => {
            let data = array
                .to_data()
                .into_builder()
                .data_type(DataType::Timestamp(*u2, Some(Arc::clone(tz))));
            Ok(arrow::array::make_array(
                data.build().map_err(|e| e.to_string())?,
            ))
        }
        _ => cast(array, target).map_err(|e| e.to_string()),
    }
}

/// The table's Arrow schema with its key columns only (for equality
/// deletes), keeping their field ids.
pub fn key_schema(table_arrow: &ArrowSchemaRef, key_indices: &[usize]) -> ArrowSchemaRef {
    let fields: Vec<Field> = key_indices
        .iter()
        .map(|i| table_arrow.field(*i).as_ref().clone())
        .collect();
    Arc::new(ArrowSchema::new(fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use urutau_planner::target::TargetColumn;

    fn target(cols: &[(&str, &str, bool)], key: &[&str]) -> TargetTable {
        TargetTable {
            name: vec!["ns".into(), "t".into()],
            columns: cols
                .iter()
                .map(|(n, t, nullable)| TargetColumn {
                    name: n.to_string(),
                    ty: CanonicalType::parse(t, false).unwrap(),
                    nullable: *nullable,
                    origin: ColumnOrigin::Data,
                })
                .collect(),
            key: key.iter().map(|k| k.to_string()).collect(),
            mode: WriteMode::Upsert,
            partition_by: vec![],
            workers: 1,
            schema_changes: Default::default(),
        }
    }

    #[test]
    fn only_an_upsert_table_has_identifier_fields() {
        let mut t = target(&[("id", "BIGINT", false), ("v", "VARCHAR", true)], &["id"]);
        for mode in [WriteMode::Append, WriteMode::AppendIdempotent] {
            t.mode = mode;
            let s = table_schema(&t).unwrap();
            assert_eq!(
                s.identifier_field_ids().count(),
                0,
                "{mode}: many rows per key"
            );
            assert!(
                s.as_struct().fields()[0].required,
                "NOT NULL stays required"
            );
        }
    }

    #[test]
    fn an_append_table_cannot_become_an_upsert_table() {
        let mut t = target(&[("id", "BIGINT", false), ("v", "VARCHAR", true)], &["id"]);
        let upsert = table_schema(&t).unwrap();
        t.mode = WriteMode::Append;
        let append = table_schema(&t).unwrap();
        let problems = check_existing(&append, &upsert);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no identifier fields"), "{problems:?}");
        // An append route on a keyed table is accepted: append tables made
        // before they stopped declaring identifier fields have them.
        assert!(check_existing(&upsert, &append).is_empty());
    }

    #[test]
    fn evolving_adds_promotes_and_relaxes_keeping_field_ids() {
        let mut t = target(
            &[
                ("id", "BIGINT", false),
                ("v", "VARCHAR", false),
                ("n", "INT", true),
                ("committed_at", "TIMESTAMPTZ", true),
            ],
            &["id"],
        );
        t.columns[3].origin = ColumnOrigin::Metadata("commit_ts".into());
        let before = table_schema(&t).unwrap();
        assert!(evolve(&before, 4, &t).unwrap().is_none(), "nothing to do");
        // The source widened n, dropped v and added extra (a list, whose
        // element takes an id too); the route now reads them so.
        let mut after = t.clone();
        after.columns.remove(1);
        after.columns[1].ty = CanonicalType::Int64;
        after.columns.insert(
            2,
            TargetColumn {
                name: "extra".into(),
                ty: CanonicalType::parse("LIST<INT>", false).unwrap(),
                nullable: true,
                origin: ColumnOrigin::Data,
            },
        );
        let e = evolve(&before, 4, &after).unwrap().unwrap();
        let f = e.schema.as_struct().fields();
        let shape: Vec<(i32, &str, String, bool)> = f
            .iter()
            .map(|f| (f.id, f.name.as_str(), f.field_type.to_string(), f.required))
            .collect();
        assert_eq!(shape[0], (1, "id", "long".into(), true));
        assert_eq!(shape[1], (2, "v", "string".into(), false), "kept, optional");
        assert_eq!(
            shape[2],
            (3, "n", "long".into(), false),
            "promoted in place"
        );
        assert_eq!(shape[3].0, 5, "a new id above the last");
        assert_eq!(shape[3].1, "extra", "before the metadata columns");
        assert_eq!(shape[4], (4, "committed_at", "timestamptz".into(), false));
        assert_eq!(e.schema.highest_field_id(), 6, "the element's id");
        assert_eq!(e.schema.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        assert_eq!(e.changes.len(), 3, "{:?}", e.changes);
        // Evolved, the table fits the route.
        assert!(evolve(&e.schema, 6, &after).unwrap().is_none());
    }

    #[test]
    fn narrowing_or_changing_a_type_cannot_be_evolved() {
        let t = target(&[("id", "BIGINT", false), ("n", "BIGINT", true)], &["id"]);
        let table = table_schema(&t).unwrap();
        for ty in ["INT", "VARCHAR"] {
            let mut narrower = t.clone();
            narrower.columns[1].ty = CanonicalType::parse(ty, false).unwrap();
            let problems = evolve(&table, 2, &narrower).unwrap_err();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].contains("column `n` is long in the table"),
                "{problems:?}"
            );
            assert!(problems[0].contains("may only widen"), "{problems:?}");
        }
        let mut other_key = t.clone();
        other_key.key = vec!["n".into()];
        other_key.columns[1].nullable = false;
        let problems = evolve(&table, 2, &other_key).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("identifier fields are [id]")),
            "{problems:?}"
        );
    }

    #[test]
    fn maps_every_kind() {
        let t = target(
            &[
                ("id", "BIGINT", false),
                ("u", "UBIGINT", true),
                ("m", "MAP<VARCHAR, LIST<INT>>", true),
                ("s", "STRUCT<a UUID, b JSON>", true),
                ("f", "FIXED(3)", true),
            ],
            &["id"],
        );
        let s = table_schema(&t).unwrap();
        assert_eq!(s.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        let f = s.as_struct().fields();
        assert!(f[0].required);
        assert_eq!(f[1].field_type.to_string(), "decimal(20, 0)");
        assert_eq!(f[4].field_type.to_string(), "fixed(3)");
        assert!(matches!(&*f[2].field_type, Type::Map(_)));
        assert!(check_existing(&s, &s).is_empty());
        let other = table_schema(&target(&[("id", "INT", false)], &["id"])).unwrap();
        let problems = check_existing(&other, &s);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("column `id` is int in the table")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("column `u`")),
            "{problems:?}"
        );
    }
}
