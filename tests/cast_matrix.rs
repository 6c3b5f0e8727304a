//! The closed cast matrix, table-driven: every (from, to) pair of scalar
//! kinds is planned as a real route (`CAST(c AS T)` in pipeline SQL), the
//! accept/reject decision and its rule are checked, and every accepted pair
//! is run through the route's plan into the memory sink on edge data
//! (extremes, NULLs, negative zero, max decimal, pre-1970 times).

mod common;

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray,
    Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    Time64MicrosecondArray, TimestampMicrosecondArray, UInt64Array,
};
use futures::StreamExt;
use urutau_planner::context;
use urutau_planner::feed::RouteBatch;
use urutau_planner::types::Kind;
use urutau_sinks::memory::MemoryStore;

/// SQL type of each scalar kind, as a source column and as a cast target.
fn sql_type(kind: Kind, as_target: bool) -> &'static str {
    match kind {
        Kind::Bool => "BOOLEAN",
        Kind::Int32 => "INT",
        Kind::Int64 => "BIGINT",
        Kind::UInt64 => "UBIGINT",
        Kind::Float32 => "REAL",
        Kind::Float64 => "DOUBLE",
        Kind::Decimal if as_target => "DECIMAL(20,2)",
        Kind::Decimal => "DECIMAL(10,2)",
        Kind::String => "VARCHAR",
        Kind::Binary => "BYTEA",
        Kind::Fixed => "FIXED(4)",
        Kind::Date => "DATE",
        Kind::Time => "TIME",
        Kind::Timestamp => "TIMESTAMP",
        Kind::TimestampTz => "TIMESTAMPTZ",
        Kind::Uuid => "UUID",
        Kind::Json => "JSON",
        other => panic!("not scalar: {other}"),
    }
}

/// Rows: from; columns: to (order of `Kind::SCALARS`).
/// I identity, A accepted, N narrowing, P parsing, R reinterpretation
/// (assume_utc), B binary needs an encoding, X incompatible.
const MATRIX: [&str; 16] = [
    // bo i3 i6 u6 f3 f6 de st bi fx da ti ts tz uu js
    "I  X  X  X  X  X  X  A  X  X  X  X  X  X  X  X", // bool
    "X  I  A  N  N  A  A  A  X  X  X  X  X  X  X  X", // int32
    "X  N  I  N  N  N  N  A  X  X  X  X  X  X  X  X", // int64
    "X  N  N  I  N  N  N  A  X  X  X  X  X  X  X  X", // uint64
    "X  N  N  N  I  A  N  A  X  X  X  X  X  X  X  X", // float32
    "X  N  N  N  N  I  N  A  X  X  X  X  X  X  X  X", // float64
    "X  N  N  N  N  N  A  A  X  X  X  X  X  X  X  X", // decimal(10,2) -> decimal(20,2)
    "P  P  P  P  P  P  P  I  X  X  P  P  P  P  P  P", // string
    "X  X  X  X  X  X  X  B  I  N  X  X  X  X  X  X", // binary
    "X  X  X  X  X  X  X  B  A  I  X  X  X  X  X  X", // fixed(4)
    "X  X  X  X  X  X  X  A  X  X  I  X  A  R  X  X", // date
    "X  X  X  X  X  X  X  A  X  X  X  I  X  X  X  X", // time
    "X  X  X  X  X  X  X  A  X  X  N  N  I  R  X  X", // timestamp
    "X  X  X  X  X  X  X  A  X  X  N  N  A  I  X  X", // timestamptz
    "X  X  X  X  X  X  X  A  X  X  X  X  X  X  I  X", // uuid
    "X  X  X  X  X  X  X  A  X  X  X  X  X  X  X  I", // json
];

fn rule_of(letter: char) -> Option<&'static str> {
    match letter {
        'N' => Some("narrowing"),
        'P' => Some("parsing"),
        'R' => Some("reinterpretation"),
        'B' => Some("binary-encoding"),
        'X' => Some("incompatible"),
        _ => None,
    }
}

const T_MIN: i64 = -62_135_596_800_000_000; // 0001-01-01T00:00:00
const T_MAX: i64 = 253_402_300_799_999_999; // 9999-12-31T23:59:59.999999

/// Edge values of each source kind.
fn edge(kind: Kind) -> ArrayRef {
    match kind {
        Kind::Bool => Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
        Kind::Int32 => Arc::new(Int32Array::from(vec![
            Some(i32::MIN),
            Some(-1),
            Some(0),
            Some(i32::MAX),
            None,
        ])),
        Kind::Int64 => Arc::new(Int64Array::from(vec![
            Some(i64::MIN),
            Some(-1),
            Some(0),
            Some(i64::MAX),
            None,
        ])),
        Kind::UInt64 => Arc::new(UInt64Array::from(vec![
            Some(0),
            Some(1 << 63),
            Some(u64::MAX),
            None,
        ])),
        Kind::Float32 => Arc::new(Float32Array::from(vec![
            Some(-0.0),
            Some(0.1),
            Some(f32::MIN),
            Some(16_777_217.0),
            None,
        ])),
        Kind::Float64 => Arc::new(Float64Array::from(vec![
            Some(-0.0),
            Some(0.1),
            Some(f64::MAX),
            Some(5e-324),
            None,
        ])),
        Kind::Decimal => Arc::new(
            Decimal128Array::from(vec![
                Some(-9_999_999_999),
                Some(-1),
                Some(0),
                Some(9_999_999_999),
                None,
            ])
            .with_precision_and_scale(10, 2)
            .unwrap(),
        ),
        Kind::String => Arc::new(StringArray::from(vec![
            Some(""),
            Some("héllo"),
            Some("12"),
            None,
        ])),
        Kind::Binary => Arc::new(BinaryArray::from(vec![
            Some(&[0u8, 0xff][..]),
            Some(&[][..]),
            None,
        ])),
        Kind::Fixed => Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![
                    Some(vec![0xde, 0xad, 0xbe, 0xef]),
                    Some(vec![0, 0, 0, 0]),
                    None,
                ]
                .into_iter(),
                4,
            )
            .unwrap(),
        ),
        Kind::Date => Arc::new(Date32Array::from(vec![
            Some(-719_162),
            Some(-1),
            Some(0),
            Some(2_932_896),
            None,
        ])),
        Kind::Time => Arc::new(Time64MicrosecondArray::from(vec![
            Some(0),
            Some(86_399_999_999),
            None,
        ])),
        Kind::Timestamp => Arc::new(TimestampMicrosecondArray::from(vec![
            Some(T_MIN),
            Some(-1),
            Some(0),
            Some(T_MAX),
            None,
        ])),
        Kind::TimestampTz => Arc::new(
            TimestampMicrosecondArray::from(vec![
                Some(T_MIN),
                Some(-1),
                Some(0),
                Some(T_MAX),
                None,
            ])
            .with_timezone("UTC"),
        ),
        Kind::Uuid => Arc::new(StringArray::from(vec![
            Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            None,
        ])),
        Kind::Json => Arc::new(StringArray::from(vec![
            Some("{\"a\":[1,2]}"),
            Some("null"),
            None,
        ])),
        other => panic!("not scalar: {other}"),
    }
}

/// The converted values each accepted pair must produce (rendered by Arrow's
/// display; NULL stays NULL). Identities are checked against the input.
fn expected(from: Kind, to: Kind) -> Option<Vec<&'static str>> {
    use Kind as K;
    Some(match (from, to) {
        (K::Bool, K::String) => vec!["true", "false", "NULL"],
        (K::Int32, K::Int64) => vec!["-2147483648", "-1", "0", "2147483647", "NULL"],
        (K::Int32, K::Float64) => vec!["-2147483648.0", "-1.0", "0.0", "2147483647.0", "NULL"],
        (K::Int32, K::Decimal) => vec!["-2147483648.00", "-1.00", "0.00", "2147483647.00", "NULL"],
        (K::Int32, K::String) => vec!["-2147483648", "-1", "0", "2147483647", "NULL"],
        (K::Int64, K::String) => vec![
            "-9223372036854775808",
            "-1",
            "0",
            "9223372036854775807",
            "NULL",
        ],
        (K::UInt64, K::String) => vec!["0", "9223372036854775808", "18446744073709551615", "NULL"],
        (K::Float32, K::Float64) => vec![
            "-0.0",
            "0.10000000149011612",
            "-3.4028234663852886e38",
            "16777216.0",
            "NULL",
        ],
        (K::Float32, K::String) => vec!["-0.0", "0.1", "-3.4028235e38", "16777216.0", "NULL"],
        (K::Float64, K::String) => vec!["-0.0", "0.1", "1.7976931348623157e308", "5e-324", "NULL"],
        (K::Decimal, K::Decimal) => vec!["-99999999.99", "-0.01", "0.00", "99999999.99", "NULL"],
        (K::Decimal, K::String) => vec!["-99999999.99", "-0.01", "0.00", "99999999.99", "NULL"],
        (K::Fixed, K::Binary) => vec!["deadbeef", "00000000", "NULL"],
        (K::Date, K::String) => vec![
            "0001-01-01",
            "1969-12-31",
            "1970-01-01",
            "9999-12-31",
            "NULL",
        ],
        (K::Date, K::Timestamp) => vec![
            "0001-01-01T00:00:00",
            "1969-12-31T00:00:00",
            "1970-01-01T00:00:00",
            "9999-12-31T00:00:00",
            "NULL",
        ],
        (K::Time, K::String) => vec!["00:00:00", "23:59:59.999999", "NULL"],
        (K::Timestamp, K::String) => vec![
            "0001-01-01T00:00:00",
            "1969-12-31T23:59:59.999999",
            "1970-01-01T00:00:00",
            "9999-12-31T23:59:59.999999",
            "NULL",
        ],
        (K::TimestampTz, K::String) => vec![
            "0001-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999Z",
            "NULL",
        ],
        (K::TimestampTz, K::Timestamp) => vec![
            "0001-01-01T00:00:00",
            "1969-12-31T23:59:59.999999",
            "1970-01-01T00:00:00",
            "9999-12-31T23:59:59.999999",
            "NULL",
        ],
        (K::Uuid, K::String) => vec!["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "NULL"],
        (K::Json, K::String) => vec!["{\"a\":[1,2]}", "null", "NULL"],
        _ => return None,
    })
}

fn pipeline(store: &str, from_type: &str, select: &str) -> String {
    format!(
        "CREATE SOURCE s FROM file WITH (path = '/dev/null');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE s.t (k BIGINT NOT NULL, c {from_type}, PRIMARY KEY (k));
         CREATE TABLE m.t WITH (write_mode = 'append') AS SELECT k, {select} AS c FROM s.t;"
    )
}

/// Runs `values` through the planned route and returns what the sink holds
/// in column `c`.
async fn run_route(
    plan: &urutau_planner::plan::PipelinePlan,
    store: &str,
    values: ArrayRef,
) -> Result<Vec<String>, String> {
    let route = &plan.routes[0];
    route
        .sink
        .ensure_table(&route.target)
        .await
        .map_err(|e| e.to_string())?;
    let n = values.len();
    let schema = Arc::clone(&route.bound.scan_schema);
    let mut columns: Vec<ArrayRef> =
        vec![Arc::new(Int64Array::from_iter_values(0..n as i64)), values];
    columns.push(Arc::new(StringArray::from(vec![context::OP_INSERT; n])));
    columns.push(Arc::new(BooleanArray::from(vec![false; n])));
    columns.push(Arc::new(StringArray::from(vec!["1"; n])));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(vec![None; n]).with_timezone("UTC"),
    ));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(vec![0; n]).with_timezone("UTC"),
    ));
    columns.push(Arc::new(StringArray::from(vec![context::PHASE_STREAM; n])));
    columns.push(Arc::new(StringArray::from(vec!["t"; n])));
    // The file source's coordinate: one file, one shard, a line each.
    columns.push(Arc::new(StringArray::from(vec!["f.jsonl"; n])));
    columns.push(Arc::new(Int32Array::from(vec![0; n])));
    columns.push(Arc::new(Int64Array::from_iter_values(0..n as i64)));
    let batch = RecordBatch::try_new(schema, columns).map_err(|e| e.to_string())?;
    let tx = route.feed.connect(1);
    tx.send(RouteBatch {
        batch,
        end: "1".into(),
        open_transaction: false,
        may_defer: false,
    })
    .await
    .unwrap();
    drop(tx);
    let mut stream = route
        .physical
        .execute(0, Arc::new(datafusion::execution::TaskContext::default()))
        .map_err(|e| e.to_string())?;
    while let Some(item) = stream.next().await {
        item.map_err(|e| e.strip_backtrace())?;
    }
    let table = MemoryStore::named(store).table("t").ok_or("no table")?;
    Ok(table.rows.into_iter().map(|r| r[1].clone()).collect())
}

fn render(values: &ArrayRef) -> Vec<String> {
    (0..values.len())
        .map(|i| {
            if values.is_null(i) {
                "NULL".to_string()
            } else {
                arrow::util::display::array_value_to_string(values, i).unwrap()
            }
        })
        .collect()
}

#[tokio::test]
async fn every_pair_of_scalar_kinds() {
    let mut failures = Vec::new();
    let mut accepted = 0;
    for (fi, from) in Kind::SCALARS.iter().enumerate() {
        let letters: Vec<char> = MATRIX[fi]
            .split_whitespace()
            .map(|s| s.chars().next().unwrap())
            .collect();
        assert_eq!(letters.len(), 16);
        for (ti, to) in Kind::SCALARS.iter().enumerate() {
            let letter = letters[ti];
            let store = common::unique("cast");
            let text = pipeline(
                &store,
                sql_type(*from, false),
                &format!("CAST(c AS {})", sql_type(*to, true)),
            );
            let planned = common::plan_sql(&text).await;
            match (rule_of(letter), planned) {
                (Some(rule), Err(d)) => {
                    let found = d.errors().any(|e| {
                        e.rule
                            .as_deref()
                            .is_some_and(|r| r.starts_with(&format!("{rule}:")))
                            && e.message.contains("cannot cast c from")
                    });
                    if !found {
                        failures.push(format!(
                            "{from} -> {to}: expected rule {rule}, got {}",
                            common::show(&d)
                        ));
                    }
                }
                (Some(rule), Ok(_)) => {
                    failures.push(format!("{from} -> {to}: accepted, expected {rule}"))
                }
                (None, Err(d)) => {
                    failures.push(format!("{from} -> {to}: rejected: {}", common::show(&d)))
                }
                (None, Ok(plan)) => {
                    accepted += 1;
                    let input = edge(*from);
                    let got = match run_route(&plan, &store, Arc::clone(&input)).await {
                        Ok(v) => v,
                        Err(e) => {
                            failures.push(format!("{from} -> {to}: run failed: {e}"));
                            continue;
                        }
                    };
                    let want: Vec<String> = if letter == 'I' {
                        render(&input)
                    } else {
                        match expected(*from, *to) {
                            Some(v) => v.into_iter().map(String::from).collect(),
                            None => {
                                failures.push(format!(
                                    "{from} -> {to}: no expected values; got {got:?}"
                                ));
                                continue;
                            }
                        }
                    };
                    if got != want {
                        failures.push(format!("{from} -> {to}: got {got:?}, want {want:?}"));
                    }
                }
            }
            MemoryStore::drop_named(&store);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // 15 identities (decimal(10,2) -> decimal(20,2) is a widening, not one)
    // and 21 accepted conversions.
    assert_eq!(accepted, 15 + 21, "identities plus accepted conversions");
}

/// Parametric edges: decimal widening needs room on both sides of the point,
/// integers need enough integer digits, uint64 fits decimal(20,0) exactly.
#[tokio::test]
async fn parametric_decimal_and_fixed_rules() {
    let cases: [(&str, &str, Option<&str>); 7] = [
        ("BIGINT", "DECIMAL(21,2)", None),
        ("BIGINT", "DECIMAL(20,2)", Some("narrowing")),
        ("UBIGINT", "DECIMAL(20,0)", None),
        ("DECIMAL(10,2)", "DECIMAL(12,4)", None),
        ("DECIMAL(10,2)", "DECIMAL(10,3)", Some("narrowing")),
        ("FIXED(4)", "FIXED(8)", Some("incompatible")),
        ("DECIMAL(38,0)", "VARCHAR", None),
    ];
    for (from, to, rule) in cases {
        let store = common::unique("param");
        let r = common::plan_sql(&pipeline(&store, from, &format!("CAST(c AS {to})"))).await;
        match (rule, r) {
            (None, Ok(_)) => {}
            (Some(rule), Err(d)) => assert!(
                d.errors()
                    .any(|e| e.rule.as_deref().is_some_and(|r| r.starts_with(rule))),
                "{from} -> {to}: {}",
                common::show(&d)
            ),
            (rule, r) => panic!("{from} -> {to}: expected {rule:?}, got ok={}", r.is_ok()),
        }
    }
    // Max decimal and the full uint64 range convert exactly.
    let store = common::unique("param");
    let plan = common::plan_sql(&pipeline(&store, "DECIMAL(38,0)", "CAST(c AS VARCHAR)"))
        .await
        .unwrap();
    let max = Arc::new(
        Decimal128Array::from(vec![
            Some(99_999_999_999_999_999_999_999_999_999_999_999_999i128),
            None,
        ])
        .with_precision_and_scale(38, 0)
        .unwrap(),
    ) as ArrayRef;
    assert_eq!(
        run_route(&plan, &store, max).await.unwrap(),
        vec!["99999999999999999999999999999999999999", "NULL"]
    );
    let store = common::unique("param");
    let plan = common::plan_sql(&pipeline(&store, "UBIGINT", "CAST(c AS DECIMAL(20,0))"))
        .await
        .unwrap();
    assert_eq!(
        run_route(&plan, &store, edge(Kind::UInt64)).await.unwrap(),
        vec!["0", "9223372036854775808", "18446744073709551615", "NULL"]
    );
}

/// `assume_utc` is the one temporal reinterpretation: the stored value is
/// kept and marked UTC; it takes TIMESTAMP only.
#[tokio::test]
async fn assume_utc_reinterprets_without_converting() {
    let store = common::unique("utc");
    let plan = common::plan_sql(&pipeline(&store, "TIMESTAMP", "assume_utc(c)"))
        .await
        .unwrap();
    assert_eq!(
        plan.routes[0].target.columns[1].ty,
        urutau_planner::types::CanonicalType::TimestampTz
    );
    assert_eq!(
        run_route(&plan, &store, edge(Kind::Timestamp))
            .await
            .unwrap(),
        vec![
            "0001-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999Z",
            "NULL"
        ]
    );
    let Err(err) = common::plan_sql(&pipeline(
        &common::unique("utc"),
        "TIMESTAMPTZ",
        "assume_utc(c)",
    ))
    .await
    else {
        panic!("assume_utc of a timestamptz must be rejected");
    };
    assert!(
        common::show(&err).contains("assume_utc(c) needs a TIMESTAMP"),
        "{}",
        common::show(&err)
    );
}

/// A column whose source type has no canonical mapping bypasses the matrix:
/// its raw text becomes the declared type at run time; a value that does not
/// convert stops the route.
#[tokio::test]
async fn unknown_types_bypass_the_matrix() {
    let store = common::unique("bypass");
    let plan = common::plan_sql(&pipeline(&store, "MONEY", "CAST(c AS DECIMAL(20,2))"))
        .await
        .unwrap();
    assert!(
        plan.warnings.warnings().next().is_none()
            || plan
                .warnings
                .warnings()
                .all(|w| !w.message.contains("raw text")),
        "a cast unknown column is typed, not raw"
    );
    let text = Arc::new(StringArray::from(vec![Some("123.45"), Some("-0.5"), None])) as ArrayRef;
    assert_eq!(
        run_route(&plan, &store, text).await.unwrap(),
        vec!["123.45", "-0.50", "NULL"]
    );

    let store = common::unique("bypass");
    let plan = common::plan_sql(&pipeline(&store, "MONEY", "CAST(c AS DECIMAL(20,2))"))
        .await
        .unwrap();
    let bad = Arc::new(StringArray::from(vec![Some("$12")])) as ArrayRef;
    let err = run_route(&plan, &store, bad).await.unwrap_err();
    assert!(err.contains("$12"), "{err}");

    // Uncast, it lands as its raw text, with a warning.
    let store = common::unique("bypass");
    let plan = common::plan_sql(&pipeline(&store, "MONEY", "c"))
        .await
        .unwrap();
    assert!(
        plan.warnings
            .warnings()
            .any(|w| w.message.contains("raw text"))
    );
    assert_eq!(
        plan.routes[0].target.columns[1].ty,
        urutau_planner::types::CanonicalType::Unknown("MONEY".into())
    );
}

/// Nested values: element-wise widening; to text as JSON.
#[tokio::test]
async fn nested_values_cast_to_json_text() {
    let store = common::unique("nested");
    let plan = common::plan_sql(&pipeline(&store, "LIST<INT>", "CAST(c AS JSON)"))
        .await
        .unwrap();
    let list = Arc::new(arrow::array::ListArray::from_iter_primitive::<
        arrow::datatypes::Int32Type,
        _,
        _,
    >(vec![
        Some(vec![Some(1), None, Some(3)]),
        Some(vec![]),
        None,
    ])) as ArrayRef;
    assert_eq!(
        run_route(&plan, &store, list).await.unwrap(),
        vec!["[1,null,3]", "[]", "NULL"]
    );
}
