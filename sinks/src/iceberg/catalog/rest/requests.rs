//! The bodies of the REST requests the sink sends, as Iceberg Java's REST
//! types (which Polaris, Nessie, Gravitino and Iceberg's reference server
//! share) parse them.
//!
//! iceberg-catalog-rest 0.10.1 builds a create-table request whose partition
//! spec has no `spec-id` (the unbound spec of the `TableCreation`), which
//! Java's `PartitionSpecParser` refuses ("Cannot parse missing int:
//! spec-id"; apache/iceberg-rust#1567). The crate's request type itself is
//! right; what goes in it is made whole here: a new table's spec is spec 0.

use iceberg::TableCreation;
use iceberg_catalog_rest::CreateTableRequest;

/// The id of a new table's first (and default) partition spec.
const FIRST_SPEC_ID: i32 = 0;

/// The create-table request for `creation`, with the ids Java requires.
pub fn create_table(creation: TableCreation) -> CreateTableRequest {
    let spec = creation.partition_spec.map(|s| match s.spec_id() {
        Some(_) => s,
        None => s.with_spec_id(FIRST_SPEC_ID),
    });
    CreateTableRequest {
        name: creation.name,
        location: creation.location,
        schema: creation.schema,
        partition_spec: spec,
        write_order: creation.sort_order,
        stage_create: None,
        properties: creation.properties,
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{
        NestedField, NullOrder, PrimitiveType, Schema, SortDirection, SortField, SortOrder,
        Transform, Type, UnboundPartitionSpec,
    };

    use super::*;

    #[test]
    fn a_create_request_carries_every_id_java_requires() {
        let schema = Schema::builder()
            .with_schema_id(0)
            .with_identifier_field_ids([1])
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap();
        let spec = UnboundPartitionSpec::builder()
            .add_partition_field(1, "id_bucket", Transform::Bucket(8))
            .unwrap()
            .build();
        let order = SortOrder::builder()
            .with_order_id(1)
            .with_sort_field(
                SortField::builder()
                    .source_id(1)
                    .transform(Transform::Identity)
                    .direction(SortDirection::Ascending)
                    .null_order(NullOrder::First)
                    .build(),
            )
            .build(&schema)
            .unwrap();
        let creation = TableCreation::builder()
            .name("t".to_string())
            .schema(schema)
            .partition_spec(spec)
            .sort_order(order)
            .properties([("write.upsert.enabled".to_string(), "true".to_string())])
            .build();
        let json = serde_json::to_value(create_table(creation)).unwrap();
        assert_eq!(json["name"], "t");
        assert_eq!(json["partition-spec"]["spec-id"], 0, "{json}");
        let field = &json["partition-spec"]["fields"][0];
        assert_eq!(field["source-id"], 1);
        assert_eq!(field["transform"], "bucket[8]");
        assert_eq!(field["name"], "id_bucket");
        assert_eq!(json["schema"]["schema-id"], 0);
        assert_eq!(json["schema"]["fields"][0]["id"], 1);
        assert_eq!(json["schema"]["identifier-field-ids"][0], 1);
        assert_eq!(json["write-order"]["order-id"], 1);
        assert_eq!(json["write-order"]["fields"][0]["source-id"], 1);
        assert_eq!(
            json["write-order"]["fields"][0]["null-order"],
            "nulls-first"
        );
        assert_eq!(json["properties"]["write.upsert.enabled"], "true");
        assert!(json.get("stage-create").is_none());

        // A spec that has an id keeps it.
        let kept = create_table(
            TableCreation::builder()
                .name("u".to_string())
                .schema(Schema::builder().build().unwrap())
                .partition_spec(UnboundPartitionSpec::builder().with_spec_id(3).build())
                .build(),
        );
        assert_eq!(kept.partition_spec.unwrap().spec_id(), Some(3));
    }
}
