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
use urutau_planner::target::TargetTable;
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
        problems.push(format!(
            "the table has no identifier fields (an append table holds many rows per key), and the upsert route's key is [{}]",
            wk.join(", ")
        ));
    } else if hk != wk && !wk.is_empty() {
        problems.push(format!(
            "the table's identifier fields are [{}], the route's key is [{}]",
            hk.join(", "),
            wk.join(", ")
        ));
    }
    problems
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
    use urutau_planner::target::{ColumnOrigin, TargetColumn};

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
