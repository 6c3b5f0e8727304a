//! Scalar functions the pipeline language adds to DataFusion's:
//! `assume_utc(ts)` (the one temporal reinterpretation of the cast matrix),
//! `to_hex(b)` / `to_base64(b)` (binary to text with a chosen encoding), and
//! `to_json(nested)` (how a nested value becomes text).

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, TimeUnit};
use base64::Engine as _;
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::types::UTC;

/// Every function the planner registers.
pub fn all() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(AssumeUtc::new())),
        Arc::new(ScalarUDF::from(BinaryToText::new(Encoding::Hex))),
        Arc::new(ScalarUDF::from(BinaryToText::new(Encoding::Base64))),
        Arc::new(ScalarUDF::from(ToJson::new())),
    ]
}

/// `assume_utc(ts)`: a zone-less timestamp asserted to be UTC. The stored
/// value (microseconds) is kept; only the zone marker is added.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AssumeUtc {
    signature: Signature,
}

impl AssumeUtc {
    /// The function's SQL name.
    pub const NAME: &'static str = "assume_utc";

    pub fn new() -> Self {
        AssumeUtc {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl Default for AssumeUtc {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for AssumeUtc {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [DataType::Timestamp(_, None)] => Ok(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some(Arc::from(UTC)),
            )),
            [other] => plan_err!("assume_utc takes a TIMESTAMP (without time zone), found {other}"),
            _ => plan_err!("assume_utc takes one argument"),
        }
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let target = DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC)));
        // Casting a zone-less timestamp to UTC keeps the stored value: it is
        // a reinterpretation, not a conversion.
        match &args.args[0] {
            ColumnarValue::Array(a) => {
                let micros = cast(a, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
                Ok(ColumnarValue::Array(cast(&micros, &target)?))
            }
            ColumnarValue::Scalar(s) => {
                let a = s.to_array()?;
                let micros = cast(&a, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
                Ok(ColumnarValue::Scalar(
                    datafusion::common::ScalarValue::try_from_array(&cast(&micros, &target)?, 0)?,
                ))
            }
        }
    }
}

/// Text encodings of binary values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Hex,
    Base64,
}

/// `to_hex(b)` / `to_base64(b)`: binary (or fixed) values as text. `to_hex`
/// also keeps DataFusion's integer form (two's complement hex).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct BinaryToText {
    encoding: Encoding,
    signature: Signature,
}

impl BinaryToText {
    /// The function for one encoding.
    pub fn new(encoding: Encoding) -> Self {
        BinaryToText {
            encoding,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

fn encode_bytes(encoding: Encoding, bytes: &[u8]) -> String {
    match encoding {
        Encoding::Hex => hex::encode(bytes),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

impl ScalarUDFImpl for BinaryToText {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        match self.encoding {
            Encoding::Hex => "to_hex",
            Encoding::Base64 => "to_base64",
        }
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match (self.encoding, args) {
            (
                _,
                [
                    DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_),
                ],
            ) => Ok(DataType::Utf8),
            (Encoding::Hex, [t]) if t.is_integer() => Ok(DataType::Utf8),
            (_, [other]) => plan_err!("{} takes a binary value, found {other}", self.name()),
            _ => plan_err!("{} takes one argument", self.name()),
        }
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let a = &arrays[0];
        let mut out = StringBuilder::with_capacity(a.len(), a.len() * 16);
        match a.data_type() {
            DataType::FixedSizeBinary(_) => {
                let b = a.as_fixed_size_binary();
                for i in 0..b.len() {
                    if b.is_null(i) {
                        out.append_null();
                    } else {
                        out.append_value(encode_bytes(self.encoding, b.value(i)));
                    }
                }
            }
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                let b = cast(a, &DataType::Binary)?;
                let b = b.as_binary::<i32>();
                for i in 0..b.len() {
                    if b.is_null(i) {
                        out.append_null();
                    } else {
                        out.append_value(encode_bytes(self.encoding, b.value(i)));
                    }
                }
            }
            t if t.is_integer() => {
                let v = cast(a, &DataType::Int64)?;
                let v = v.as_primitive::<arrow::datatypes::Int64Type>();
                for i in 0..v.len() {
                    if v.is_null(i) {
                        out.append_null();
                    } else {
                        out.append_value(format!("{:x}", v.value(i)));
                    }
                }
            }
            other => return exec_err!("{} cannot encode {other}", self.name()),
        }
        let result: ArrayRef = Arc::new(out.finish());
        scalar_if_all_scalar(&args.args, result)
    }
}

/// `to_json(v)`: a nested (struct, list, map) value as JSON text; NULL stays
/// NULL. This is how the cast matrix turns nested values into strings.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToJson {
    signature: Signature,
}

impl ToJson {
    /// The function's SQL name.
    pub const NAME: &'static str = "to_json";

    pub fn new() -> Self {
        ToJson {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl Default for ToJson {
    fn default() -> Self {
        Self::new()
    }
}

impl ScalarUDFImpl for ToJson {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        Self::NAME
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let result: ArrayRef = Arc::new(json_text(&arrays[0], &args.arg_fields[0])?);
        scalar_if_all_scalar(&args.args, result)
    }
}

/// Renders every value of `array` as JSON text (NULL -> NULL). Nested NULLs
/// are written as explicit `null`s.
pub fn json_text(array: &ArrayRef, field: &FieldRef) -> Result<arrow::array::StringArray> {
    let options = arrow::json::writer::EncoderOptions::default().with_explicit_nulls(true);
    let mut encoder = arrow::json::writer::make_encoder(field, array.as_ref(), &options)?;
    let mut out = StringBuilder::with_capacity(array.len(), array.len() * 32);
    let mut buf = Vec::with_capacity(64);
    for i in 0..array.len() {
        if array.is_null(i) {
            out.append_null();
            continue;
        }
        buf.clear();
        encoder.encode(i, &mut buf);
        match std::str::from_utf8(&buf) {
            Ok(s) => out.append_value(s),
            Err(e) => return exec_err!("to_json produced invalid UTF-8: {e}"),
        }
    }
    Ok(out.finish())
}

fn scalar_if_all_scalar(args: &[ColumnarValue], result: ArrayRef) -> Result<ColumnarValue> {
    if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
        Ok(ColumnarValue::Scalar(
            datafusion::common::ScalarValue::try_from_array(&result, 0)?,
        ))
    } else {
        Ok(ColumnarValue::Array(result))
    }
}

/// Stand-in for a `CAST` while a route's SQL is turned into DataFusion
/// expressions: the binder replaces `CAST(e AS T)` by `__urutau_cast_<i>(e)`
/// so it keeps the canonical target type `T` (which Arrow alone cannot tell
/// apart, e.g. UUID from VARCHAR), checks it against the closed matrix, and
/// then replaces the stand-in by the real expression. It never executes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CastPlaceholder {
    name: String,
    target: DataType,
    signature: Signature,
}

impl CastPlaceholder {
    /// Name prefix of the stand-ins.
    pub const PREFIX: &'static str = "__urutau_cast_";

    /// The stand-in for the `index`-th cast, returning `target`.
    pub fn new(index: usize, target: DataType) -> Self {
        CastPlaceholder {
            name: format!("{}{index}", Self::PREFIX),
            target,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }

    /// The index encoded in a stand-in's name.
    pub fn index_of(name: &str) -> Option<usize> {
        name.strip_prefix(Self::PREFIX)?.parse().ok()
    }
}

impl ScalarUDFImpl for CastPlaceholder {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(self.target.clone())
    }
    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        datafusion::common::internal_err!("a cast stand-in reached execution")
    }
}
