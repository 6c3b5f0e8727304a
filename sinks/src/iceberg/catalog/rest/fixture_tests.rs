//! Every kind of request the sink sends a REST catalog, sent to Apache
//! Iceberg's reference REST server (its fixture, 1.10.0: Iceberg Java's own
//! request parsing, which Polaris, Nessie and Gravitino share) and checked
//! against what the server then holds: table creation (partitioned, with a
//! sort order), `add-spec` + `set-default-spec`, `add-schema` +
//! `set-current-schema`, property-only commits, and a stale commit refused
//! as a conflict. (Row deltas, the staging branch and maintenance go
//! through the same commit path in tests/iceberg.rs.)
//!
//! Test harness: the fixture is fetched by tests/harness/iceberg-rest-fetch
//! (`URUTAU_TEST_ICEBERG_REST`) and started here on 127.0.0.1; without it
//! these tests fail and say what to run.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iceberg::spec::{
    NestedField, NullOrder, PrimitiveType, Schema, SortDirection, SortField, SortOrder, Transform,
    Type, UnboundPartitionSpec,
};
use iceberg::{TableCreation, TableIdent};

use super::{RestCatalogConn, RestConfig};
use crate::iceberg::catalog::Outcome;
use crate::iceberg::commit;

/// The fixture, killed when dropped.
struct Fixture {
    child: Child,
    uri: String,
    warehouse: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path) -> Fixture {
    let home = std::env::var("URUTAU_TEST_ICEBERG_REST")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/tmp/urutau-iceberg-rest"));
    assert!(
        home.join("classes/org/apache/iceberg/rest/LoopbackRESTCatalogServer.class")
            .exists(),
        "Iceberg's REST catalog fixture is not installed under {}: run tests/harness/iceberg-rest-fetch (needs a Java 17 JDK and Maven; scripts/test runs it)",
        home.display()
    );
    let warehouse = dir.join("warehouse");
    std::fs::create_dir_all(&warehouse).unwrap();
    let log = dir.join("iceberg-rest.log");
    let mut child = Command::new("java")
        .args([
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ])
        .arg(format!("{0}/lib/*:{0}/classes", home.display()))
        .arg("org.apache.iceberg.rest.LoopbackRESTCatalogServer")
        .env(
            "CATALOG_WAREHOUSE",
            format!("file://{}", warehouse.display()),
        )
        .env(
            "CATALOG_URI",
            format!("jdbc:sqlite:{}", dir.join("catalog.db").display()),
        )
        .env(
            "CATALOG_CATALOG__IMPL",
            "org.apache.iceberg.jdbc.JdbcCatalog",
        )
        .env("CATALOG_IO__IMPL", "org.apache.iceberg.hadoop.HadoopFileIO")
        .env("CATALOG_REST_PORT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("java runs (install a Java 17 JDK)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok));
        for _ in lines {}
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
    let Some(addr) = line
        .as_deref()
        .and_then(|l| l.strip_prefix("listening on "))
    else {
        let _ = child.kill();
        panic!(
            "the REST catalog fixture did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    Fixture {
        uri: format!("http://{addr}"),
        child,
        warehouse,
    }
}

async fn connect(f: &Fixture) -> RestCatalogConn {
    RestCatalogConn::connect(
        RestConfig {
            uri: f.uri.clone(),
            warehouse: format!("file://{}", f.warehouse.display()),
            client_id: None,
            client_secret: None,
            scope: None,
            token: None,
            s3_endpoint: None,
            s3_region: None,
            s3_path_style: None,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            ca_cert: None,
        },
        "test",
    )
    .await
    .unwrap()
}

fn schema() -> Schema {
    Schema::builder()
        .with_schema_id(0)
        .with_identifier_field_ids([1])
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "at", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(
                4,
                "amount",
                Type::Primitive(PrimitiveType::Decimal {
                    precision: 12,
                    scale: 2,
                }),
            )
            .into(),
        ])
        .build()
        .unwrap()
}

fn committed(outcome: Outcome) -> iceberg::table::Table {
    match outcome {
        Outcome::Committed(t) => t,
        Outcome::Conflict => panic!("the reference server refused the commit as a conflict"),
        Outcome::Unknown(e) => panic!("the reference server refused the commit: {e}"),
    }
}

#[tokio::test]
async fn the_reference_server_accepts_every_request_the_sink_sends() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = start(dir.path());
    let conn = connect(&fixture).await;
    let ident = TableIdent::from_strs(["bronze", "events"]).unwrap();
    assert!(conn.load(&ident).await.unwrap().is_none());

    // Creation: partitioned by bucket(8, id) and day(at), sorted by id.
    let schema = schema();
    let spec = UnboundPartitionSpec::builder()
        .add_partition_field(1, "id_bucket", Transform::Bucket(8))
        .unwrap()
        .add_partition_field(3, "at_day", Transform::Day)
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
        .name("events".to_string())
        .schema(schema)
        .partition_spec(spec)
        .sort_order(order)
        .properties([("write.upsert.enabled".to_string(), "true".to_string())])
        .build();
    let table = conn.create(&ident, creation).await.unwrap();
    let md = table.metadata();
    assert!(
        md.location()
            .starts_with(&format!("file://{}", fixture.warehouse.display())),
        "{}",
        md.location()
    );
    assert_eq!(md.default_partition_spec().fields().len(), 2);
    assert_eq!(md.default_sort_order().order_id, 1);
    assert_eq!(
        md.properties()
            .get("write.upsert.enabled")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(md.current_schema().identifier_field_ids().count(), 1);
    // Creating it again (another writer was first): the existing table.
    let again = conn
        .create(
            &ident,
            TableCreation::builder()
                .name("events".to_string())
                .schema(self::schema())
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(again.metadata().uuid(), md.uuid());

    // add-spec + set-default-spec: an unpartitioned spec made the default,
    // then the first spec again.
    let result = commit::next_metadata(&table)
        .and_then(|b| b.add_partition_spec(UnboundPartitionSpec::builder().build()))
        .and_then(|b| b.set_default_partition_spec(-1))
        .and_then(|b| b.build())
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert!(table.metadata().default_partition_spec().is_unpartitioned());
    assert_eq!(table.metadata().partition_specs_iter().count(), 2);
    let result = commit::next_metadata(&table)
        .and_then(|b| b.set_default_partition_spec(0))
        .and_then(|b| b.build())
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert_eq!(table.metadata().default_partition_spec_id(), 0);

    // add-schema + set-current-schema: a new optional column.
    let current = table.metadata().current_schema();
    let mut fields: Vec<_> = current.as_struct().fields().to_vec();
    let next_id = table.metadata().last_column_id() + 1;
    fields
        .push(NestedField::optional(next_id, "extra", Type::Primitive(PrimitiveType::Int)).into());
    let evolved = Schema::builder()
        .with_identifier_field_ids(current.identifier_field_ids())
        .with_fields(fields)
        .build()
        .unwrap();
    let result = commit::next_metadata(&table)
        .and_then(|b| b.add_current_schema(evolved))
        .and_then(|b| b.build())
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert!(
        table
            .metadata()
            .current_schema()
            .field_by_name("extra")
            .is_some()
    );
    assert_eq!(table.metadata().schemas_iter().count(), 2);

    // Properties only: set, then remove.
    let props = HashMap::from([
        (commit::POSITION_KEY.to_string(), "42".to_string()),
        ("x".to_string(), "1".to_string()),
    ]);
    let result = commit::next_metadata(&table)
        .and_then(|b| b.set_properties(props))
        .and_then(|b| b.build())
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    let result = commit::next_metadata(&table)
        .and_then(|b| b.remove_properties(&["x".to_string()]))
        .and_then(|b| b.build())
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);

    // What the server holds now, loaded anew.
    let loaded = conn.load(&ident).await.unwrap().unwrap();
    let md = loaded.metadata();
    assert_eq!(loaded.metadata_location(), table.metadata_location());
    assert_eq!(
        md.properties()
            .get(commit::POSITION_KEY)
            .map(String::as_str),
        Some("42")
    );
    assert!(!md.properties().contains_key("x"));
    assert!(md.current_schema().field_by_name("extra").is_some());
    assert_eq!(md.default_partition_spec_id(), 0);

    // Row deltas (empty: a manifest list and the position): one staged
    // on the staging branch (set-snapshot-ref of another branch), the
    // staging branch removed (remove-snapshot-ref), one onto main.
    let delta = |position: &str, staged: bool| commit::RowDelta {
        data_files: vec![],
        delete_files: vec![],
        delete_spec: table.metadata().default_partition_spec().clone(),
        position: position.to_string(),
        commit_id: uuid::Uuid::now_v7().to_string(),
        staged,
        own_staging: None,
    };
    let result = commit::build_row_delta(&table, &delta("", true))
        .await
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert!(commit::has_staging(table.metadata()));
    let result = commit::discard_staging(&table).unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert!(!commit::has_staging(table.metadata()));
    let result = commit::build_row_delta(&table, &delta("43", false))
        .await
        .unwrap();
    let before = table.clone();
    let table = committed(conn.commit(&table, result, &[]).await);
    let first = table.metadata().current_snapshot_id().unwrap();
    assert_eq!(
        commit::committed_position(table.metadata()).as_deref(),
        Some("43")
    );

    // A commit built on the table before that snapshot: a conflict, and
    // nothing of it lands.
    let result = commit::build_row_delta(&before, &delta("44", false))
        .await
        .unwrap();
    assert!(matches!(
        conn.commit(&before, result, &[]).await,
        Outcome::Conflict
    ));
    let loaded = conn.load(&ident).await.unwrap().unwrap();
    assert_eq!(loaded.metadata_location(), table.metadata_location());

    // On a local warehouse the directories of the files a commit adds are
    // synced before it is sent: one that is not there (its file was never
    // written) fails the commit before the catalog sees it.
    let missing = format!(
        "{}/data/never=written/x.parquet",
        table.metadata().location()
    );
    let result = commit::build_row_delta(&table, &delta("46", false))
        .await
        .unwrap();
    match conn
        .commit(&table, result, std::slice::from_ref(&missing))
        .await
    {
        Outcome::Unknown(e) => assert!(e.to_string().contains("syncing"), "{e}"),
        _ => panic!("a commit whose files are not on disk was sent"),
    }
    let loaded = conn.load(&ident).await.unwrap().unwrap();
    assert_eq!(loaded.metadata_location(), table.metadata_location());

    // remove-snapshots (expiry): a second snapshot, then the first removed.
    let result = commit::build_row_delta(&table, &delta("45", false))
        .await
        .unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    let result = crate::iceberg::expiry::build_expiry(&table, &[first]).unwrap();
    let table = committed(conn.commit(&table, result, &[]).await);
    assert!(table.metadata().snapshot_by_id(first).is_none());
    assert_eq!(
        commit::committed_position(table.metadata()).as_deref(),
        Some("45")
    );
}
