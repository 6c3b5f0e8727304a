//! A decoder for PostgreSQL's `pgoutput` logical replication protocol,
//! version 1.
//!
//! The replication client (`pgwire-replication`) hands us the payload of
//! each `XLogData` message as raw bytes; it recognises transaction
//! boundaries (Begin/Commit) itself but leaves the row changes — Relation,
//! Insert, Update, Delete, Truncate, … — undecoded. This module turns one
//! such payload into a [`Message`].
//!
//! The decoder is strict and never panics: every read is bounds-checked, a
//! message that is truncated, carries an unknown sub-tag, a string without
//! its terminating NUL or that is not UTF-8, or has bytes left over after
//! its last field is a [`DecodeError`] naming the message kind and what was
//! expected. Column values are zero-copy slices of the input [`Bytes`].
//!
//! Only protocol version 1 is understood: streaming messages ('S', 'E',
//! 'A', 'c' and friends, from version 2 on) decode as [`Message::Unknown`].
//!
//! Format reference: "Logical Replication Message Formats" in the
//! PostgreSQL documentation. All integers are big-endian; strings are
//! NUL-terminated.

use std::fmt;

use bytes::Bytes;

/// One column of a Relation message.
#[derive(Debug, Clone, PartialEq)]
pub struct RelationColumn {
    /// Whether the column is part of the replica identity key (flags bit 1).
    pub key: bool,
    /// Column name.
    pub name: String,
    /// OID of the column's data type.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`), -1 when there is none.
    pub type_modifier: i32,
}

/// A Relation ('R') message: the shape of a table, sent before the first
/// change to it in a session and again whenever it changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    /// OID of the relation; row messages refer to it.
    pub id: u32,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting: `b'd'` (default), `b'n'` (nothing),
    /// `b'f'` (full) or `b'i'` (index).
    pub replica_identity: u8,
    /// The columns, in order.
    pub columns: Vec<RelationColumn>,
}

/// One value of a TupleData.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// 'n': SQL NULL.
    Null,
    /// 'u': an unchanged TOASTed value (not sent).
    Unchanged,
    /// 't': the value in text format.
    Text(Bytes),
    /// 'b': the value in binary format.
    Binary(Bytes),
}

/// A TupleData: one row's values, one [`Cell`] per column.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuple(pub Vec<Cell>);

/// One decoded `pgoutput` message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// 'B': a transaction begins.
    Begin {
        /// LSN of the transaction's commit record.
        final_lsn: u64,
        /// Commit time, microseconds since 2000-01-01 00:00 UTC (as sent).
        commit_time_micros: i64,
        /// Transaction id.
        xid: u32,
    },
    /// 'C': a transaction commits.
    Commit {
        /// Flags (currently unused by PostgreSQL).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: u64,
        /// End LSN of the transaction.
        end_lsn: u64,
        /// Commit time, microseconds since 2000-01-01 00:00 UTC (as sent).
        commit_time_micros: i64,
    },
    /// 'O': the transaction came from another replication origin.
    Origin {
        /// LSN of the commit on the origin server.
        lsn: u64,
        /// Origin name.
        name: String,
    },
    /// 'R': a table's description.
    Relation(Relation),
    /// 'Y': a data type's description.
    Type {
        /// OID of the type.
        id: u32,
        /// Schema name (empty for `pg_catalog`).
        namespace: String,
        /// Type name.
        name: String,
    },
    /// 'I': a row was inserted.
    Insert {
        /// OID of the relation.
        relation: u32,
        /// The new row.
        new: Tuple,
    },
    /// 'U': a row was updated.
    ///
    /// `old` is the 'O' (full old row, REPLICA IDENTITY FULL) or 'K' (key only) tuple when sent.
    Update {
        /// OID of the relation.
        relation: u32,
        /// The old row or key, when the server sent one.
        old: Option<Tuple>,
        /// Whether `old` is a key-only ('K') tuple rather than a full row ('O').
        old_is_key_only: bool,
        /// The new row.
        new: Tuple,
    },
    /// 'D': a row was deleted.
    Delete {
        /// OID of the relation.
        relation: u32,
        /// The old row ('O') or its key ('K').
        old: Tuple,
        /// Whether `old` is a key-only ('K') tuple rather than a full row ('O').
        old_is_key_only: bool,
    },
    /// 'T': tables were truncated.
    Truncate {
        /// OIDs of the truncated relations.
        relations: Vec<u32>,
        /// `TRUNCATE ... CASCADE` (option bit 1).
        cascade: bool,
        /// `TRUNCATE ... RESTART IDENTITY` (option bit 2).
        restart_identity: bool,
    },
    /// 'M': a logical decoding message (`pg_logical_emit_message`).
    LogicalMessage {
        /// Whether the message is transactional (flags bit 1).
        transactional: bool,
        /// LSN of the message.
        lsn: u64,
        /// The message's prefix.
        prefix: String,
        /// The message's content.
        content: Bytes,
    },
    /// A message type this decoder does not know (the tag byte).
    Unknown(u8),
}

/// A payload that is not a well-formed `pgoutput` v1 message.
#[derive(Debug, thiserror::Error)]
#[error("pgoutput: {0}")]
pub struct DecodeError(pub String);

/// Decodes one `pgoutput` message (the payload of an `XLogData` message).
///
/// Text and binary column values are zero-copy slices of `data`. An empty,
/// truncated or malformed payload, or one with bytes left over, is an
/// error; a tag byte this decoder does not know is [`Message::Unknown`].
pub fn decode(data: &Bytes) -> Result<Message, DecodeError> {
    let Some(&tag) = data.first() else {
        return Err(DecodeError("empty message (expected a tag byte)".into()));
    };
    let kind = match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        _ => return Ok(Message::Unknown(tag)),
    };
    let mut r = Reader { data, pos: 1, kind };
    let message = match tag {
        b'B' => Message::Begin {
            final_lsn: r.u64("final LSN")?,
            commit_time_micros: r.i64("commit timestamp")?,
            xid: r.u32("xid")?,
        },
        b'C' => Message::Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.u64("commit LSN")?,
            end_lsn: r.u64("end LSN")?,
            commit_time_micros: r.i64("commit timestamp")?,
        },
        b'O' => Message::Origin {
            lsn: r.u64("origin LSN")?,
            name: r.string("origin name")?,
        },
        b'R' => Message::Relation(relation(&mut r)?),
        b'Y' => Message::Type {
            id: r.u32("type OID")?,
            namespace: r.string("namespace")?,
            name: r.string("type name")?,
        },
        b'I' => {
            let relation = r.u32("relation OID")?;
            r.expect_tag(b'N', "'N' (new tuple)")?;
            Message::Insert {
                relation,
                new: tuple(&mut r, "new tuple")?,
            }
        }
        b'U' => {
            let relation = r.u32("relation OID")?;
            let (old, old_is_key_only) = match r.u8("'K', 'O' or 'N' tuple tag")? {
                b'N' => (None, false),
                sub @ (b'K' | b'O') => {
                    let key_only = sub == b'K';
                    let old = tuple(&mut r, if key_only { "key tuple" } else { "old tuple" })?;
                    r.expect_tag(b'N', "'N' (new tuple)")?;
                    (Some(old), key_only)
                }
                other => return Err(r.bad_tag(other, "'K', 'O' or 'N' tuple tag")),
            };
            Message::Update {
                relation,
                old,
                old_is_key_only,
                new: tuple(&mut r, "new tuple")?,
            }
        }
        b'D' => {
            let relation = r.u32("relation OID")?;
            let old_is_key_only = match r.u8("'K' or 'O' tuple tag")? {
                b'K' => true,
                b'O' => false,
                other => return Err(r.bad_tag(other, "'K' or 'O' tuple tag")),
            };
            let old = tuple(
                &mut r,
                if old_is_key_only {
                    "key tuple"
                } else {
                    "old tuple"
                },
            )?;
            Message::Delete {
                relation,
                old,
                old_is_key_only,
            }
        }
        b'T' => {
            let count = r.u32("relation count")?;
            let options = r.u8("options")?;
            // Check the whole list is there before allocating for it.
            let needed = u64::from(count) * 4;
            if needed > r.remaining() as u64 {
                return Err(r.err(format!(
                    "truncated: expected {count} relation OIDs ({needed} bytes), {} bytes left",
                    r.remaining()
                )));
            }
            let relations = (0..count)
                .map(|_| r.u32("relation OID"))
                .collect::<Result<Vec<_>, _>>()?;
            Message::Truncate {
                relations,
                cascade: options & 1 != 0,
                restart_identity: options & 2 != 0,
            }
        }
        b'M' => {
            let flags = r.u8("flags")?;
            let lsn = r.u64("message LSN")?;
            let prefix = r.string("prefix")?;
            let len = r.len("content length")?;
            Message::LogicalMessage {
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: r.bytes(len, "content")?,
            }
        }
        _ => return Ok(Message::Unknown(tag)),
    };
    r.finish()?;
    Ok(message)
}

/// The body of a Relation message, after the tag.
fn relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let id = r.u32("relation OID")?;
    let namespace = r.string("namespace")?;
    let name = r.string("relation name")?;
    let replica_identity = r.u8("replica identity")?;
    let count = r.u16("column count")?;
    // Each column takes at least 10 bytes; don't trust the count further
    // than the input for the allocation.
    let mut columns = Vec::with_capacity(usize::from(count).min(r.remaining() / 10));
    for _ in 0..count {
        let flags = r.u8("column flags")?;
        columns.push(RelationColumn {
            key: flags & 1 != 0,
            name: r.string("column name")?,
            type_oid: r.u32("column type OID")?,
            type_modifier: r.i32("column type modifier")?,
        });
    }
    Ok(Relation {
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

/// A TupleData: a column count, then one tagged value per column.
fn tuple(r: &mut Reader<'_>, which: &str) -> Result<Tuple, DecodeError> {
    // Labels are formatted only when an error needs them (this is the
    // per-row path).
    let count = r.u16(format_args!("{which} column count"))?;
    // Each cell takes at least its tag byte.
    let mut cells = Vec::with_capacity(usize::from(count).min(r.remaining()));
    for i in 0..count {
        let what = ColumnLabel { which, i };
        let cell = match r.u8(format_args!("{what} tag"))? {
            b'n' => Cell::Null,
            b'u' => Cell::Unchanged,
            b't' => {
                let len = r.len(format_args!("{what} length"))?;
                Cell::Text(r.bytes(len, format_args!("{what} text value"))?)
            }
            b'b' => {
                let len = r.len(format_args!("{what} length"))?;
                Cell::Binary(r.bytes(len, format_args!("{what} binary value"))?)
            }
            other => {
                return Err(r.bad_tag(other, &format!("{what} tag 'n', 'u', 't' or 'b'")));
            }
        };
        cells.push(cell);
    }
    Ok(Tuple(cells))
}

/// "new tuple column 3", for errors.
#[derive(Clone, Copy)]
struct ColumnLabel<'a> {
    which: &'a str,
    i: u16,
}

impl fmt::Display for ColumnLabel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} column {}", self.which, self.i)
    }
}

/// A bounds-checked big-endian cursor over one message.
struct Reader<'a> {
    data: &'a Bytes,
    pos: usize,
    /// The message kind, for errors.
    kind: &'static str,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn err(&self, detail: String) -> DecodeError {
        DecodeError(format!("{} message: {detail}", self.kind))
    }

    /// The error for a sub-tag byte that was read but is not one expected.
    fn bad_tag(&self, got: u8, expected: &str) -> DecodeError {
        self.err(format!(
            "expected {expected} at offset {}, got {}",
            self.pos - 1,
            show_byte(got)
        ))
    }

    /// The next `n` bytes, advancing past them.
    fn take(&mut self, n: usize, what: impl fmt::Display + Copy) -> Result<&[u8], DecodeError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: expected {what} ({n} bytes) at offset {}, {} bytes left",
                self.pos,
                self.remaining()
            )));
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.data[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl fmt::Display + Copy,
    ) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u8(&mut self, what: impl fmt::Display + Copy) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: impl fmt::Display + Copy) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: impl fmt::Display + Copy) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: impl fmt::Display + Copy) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl fmt::Display + Copy) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: impl fmt::Display + Copy) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// An Int32 byte length, which must not be negative.
    fn len(&mut self, what: impl fmt::Display + Copy) -> Result<usize, DecodeError> {
        let at = self.pos;
        let len = self.i32(what)?;
        usize::try_from(len).map_err(|_| {
            self.err(format!(
                "expected {what} at offset {at}, got negative {len}"
            ))
        })
    }

    /// The next `n` bytes as a zero-copy slice of the input.
    fn bytes(&mut self, n: usize, what: impl fmt::Display + Copy) -> Result<Bytes, DecodeError> {
        let start = self.pos;
        self.take(n, what)?;
        Ok(self.data.slice(start..self.pos))
    }

    /// A NUL-terminated UTF-8 string.
    fn string(&mut self, what: impl fmt::Display + Copy) -> Result<String, DecodeError> {
        let start = self.pos;
        let rest = &self.data[start..];
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return Err(self.err(format!(
                "truncated: expected NUL-terminated {what} at offset {start}, no NUL in the {} bytes left",
                rest.len()
            )));
        };
        let text = std::str::from_utf8(&rest[..nul]).map_err(|e| {
            self.err(format!(
                "expected UTF-8 {what} at offset {start}, got invalid bytes ({e})"
            ))
        })?;
        let text = text.to_owned();
        self.pos += nul + 1;
        Ok(text)
    }

    /// Reads a byte that must be `tag`.
    fn expect_tag(&mut self, tag: u8, expected: &str) -> Result<(), DecodeError> {
        let got = self.u8(expected)?;
        if got == tag {
            Ok(())
        } else {
            Err(self.bad_tag(got, expected))
        }
    }

    /// The message must end here.
    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.err(format!(
                "expected end of message at offset {}, got {n} trailing bytes",
                self.pos
            ))),
        }
    }
}

/// A byte for an error message: the character when printable ASCII.
fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}' (0x{b:02x})", b as char)
    } else {
        format!("0x{b:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- builders -------------------------------------------------------

    /// A message under construction, byte by byte.
    struct Msg(Vec<u8>);

    impl Msg {
        fn new(tag: u8) -> Self {
            Msg(vec![tag])
        }
        fn u8(mut self, v: u8) -> Self {
            self.0.push(v);
            self
        }
        fn u16(mut self, v: u16) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn u32(mut self, v: u32) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn i32(mut self, v: i32) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn i64(mut self, v: i64) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn raw(mut self, v: &[u8]) -> Self {
            self.0.extend_from_slice(v);
            self
        }
        fn string(self, s: &str) -> Self {
            self.raw(s.as_bytes()).u8(0)
        }
        /// A TupleData of these cells.
        fn tuple(mut self, cells: &[Cell]) -> Self {
            self = self.u16(cells.len() as u16);
            for cell in cells {
                self = match cell {
                    Cell::Null => self.u8(b'n'),
                    Cell::Unchanged => self.u8(b'u'),
                    Cell::Text(v) => self.u8(b't').i32(v.len() as i32).raw(v),
                    Cell::Binary(v) => self.u8(b'b').i32(v.len() as i32).raw(v),
                };
            }
            self
        }
        fn bytes(self) -> Bytes {
            Bytes::from(self.0)
        }
    }

    fn text(s: &str) -> Cell {
        Cell::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn binary(v: &[u8]) -> Cell {
        Cell::Binary(Bytes::copy_from_slice(v))
    }

    fn ok(data: &Bytes) -> Message {
        match decode(data) {
            Ok(m) => m,
            Err(e) => panic!("decode failed: {e}"),
        }
    }

    fn err(data: &[u8]) -> String {
        match decode(&Bytes::copy_from_slice(data)) {
            Ok(m) => panic!("expected an error for {data:?}, got {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Every strict prefix of a valid message is an error naming the kind.
    fn assert_prefixes_fail(full: &Bytes, kind: &str) {
        assert!(decode(full).is_ok(), "the full {kind} message decodes");
        for n in 0..full.len() {
            let e = err(&full[..n]);
            assert!(e.starts_with("pgoutput: "), "{e}");
            if n > 0 {
                assert!(e.contains(kind), "prefix {n} of {kind}: {e}");
            }
        }
    }

    // ---- sample messages ------------------------------------------------

    fn sample_begin() -> Bytes {
        Msg::new(b'B')
            .u64(0x0000_0001_0000_0AB0)
            .i64(765_432_100_000_000)
            .u32(4711)
            .bytes()
    }

    fn sample_commit() -> Bytes {
        Msg::new(b'C')
            .u8(0)
            .u64(0x16B_3748)
            .u64(0x16B_3778)
            .i64(-5)
            .bytes()
    }

    fn sample_origin() -> Bytes {
        Msg::new(b'O').u64(0xDEAD_BEEF).string("upstream").bytes()
    }

    fn sample_relation() -> Bytes {
        Msg::new(b'R')
            .u32(16_385)
            .string("public")
            .string("orders")
            .u8(b'd')
            .u16(3)
            .u8(1)
            .string("id")
            .u32(23)
            .i32(-1)
            .u8(0)
            .string("note")
            .u32(1043)
            .i32(68)
            .u8(1)
            .string("region")
            .u32(25)
            .i32(-1)
            .bytes()
    }

    fn sample_type() -> Bytes {
        Msg::new(b'Y')
            .u32(90_001)
            .string("shop")
            .string("mood")
            .bytes()
    }

    fn row_cells() -> Vec<Cell> {
        vec![
            Cell::Null,
            text("héllo"),
            Cell::Unchanged,
            binary(&[0, 0, 0, 42]),
            text(""),
        ]
    }

    fn sample_insert() -> Bytes {
        Msg::new(b'I')
            .u32(16_385)
            .u8(b'N')
            .tuple(&row_cells())
            .bytes()
    }

    fn sample_update(old_tag: Option<u8>) -> Bytes {
        let mut m = Msg::new(b'U').u32(7);
        if let Some(tag) = old_tag {
            m = m.u8(tag).tuple(&[text("1"), text("old")]);
        }
        m.u8(b'N').tuple(&[text("1"), text("new")]).bytes()
    }

    fn sample_delete(tag: u8) -> Bytes {
        Msg::new(b'D')
            .u32(7)
            .u8(tag)
            .tuple(&[text("1"), Cell::Null])
            .bytes()
    }

    fn sample_truncate(options: u8) -> Bytes {
        Msg::new(b'T')
            .u32(3)
            .u8(options)
            .u32(100)
            .u32(200)
            .u32(300)
            .bytes()
    }

    fn sample_message(flags: u8) -> Bytes {
        Msg::new(b'M')
            .u8(flags)
            .u64(0x0000_0002_0000_0010)
            .string("urutau.test")
            .i32(5)
            .raw(b"hi\0yo")
            .bytes()
    }

    // ---- happy paths ----------------------------------------------------

    #[test]
    fn begin() {
        assert_eq!(
            ok(&sample_begin()),
            Message::Begin {
                final_lsn: 0x0000_0001_0000_0AB0,
                commit_time_micros: 765_432_100_000_000,
                xid: 4711,
            }
        );
    }

    #[test]
    fn commit() {
        assert_eq!(
            ok(&sample_commit()),
            Message::Commit {
                flags: 0,
                commit_lsn: 0x16B_3748,
                end_lsn: 0x16B_3778,
                commit_time_micros: -5,
            }
        );
    }

    #[test]
    fn origin() {
        assert_eq!(
            ok(&sample_origin()),
            Message::Origin {
                lsn: 0xDEAD_BEEF,
                name: "upstream".into(),
            }
        );
    }

    #[test]
    fn relation_with_key_flags() {
        assert_eq!(
            ok(&sample_relation()),
            Message::Relation(Relation {
                id: 16_385,
                namespace: "public".into(),
                name: "orders".into(),
                replica_identity: b'd',
                columns: vec![
                    RelationColumn {
                        key: true,
                        name: "id".into(),
                        type_oid: 23,
                        type_modifier: -1,
                    },
                    RelationColumn {
                        key: false,
                        name: "note".into(),
                        type_oid: 1043,
                        type_modifier: 68,
                    },
                    RelationColumn {
                        key: true,
                        name: "region".into(),
                        type_oid: 25,
                        type_modifier: -1,
                    },
                ],
            })
        );
    }

    #[test]
    fn relation_with_no_columns_and_empty_namespace() {
        let data = Msg::new(b'R')
            .u32(1)
            .string("")
            .string("t")
            .u8(b'n')
            .u16(0)
            .bytes();
        assert_eq!(
            ok(&data),
            Message::Relation(Relation {
                id: 1,
                namespace: String::new(),
                name: "t".into(),
                replica_identity: b'n',
                columns: vec![],
            })
        );
    }

    #[test]
    fn type_message() {
        assert_eq!(
            ok(&sample_type()),
            Message::Type {
                id: 90_001,
                namespace: "shop".into(),
                name: "mood".into(),
            }
        );
    }

    #[test]
    fn insert_with_every_cell_kind() {
        assert_eq!(
            ok(&sample_insert()),
            Message::Insert {
                relation: 16_385,
                new: Tuple(row_cells()),
            }
        );
    }

    #[test]
    fn cell_values_are_slices_of_the_input() {
        let data = sample_insert();
        let range = data.as_ptr_range();
        let Message::Insert { new, .. } = ok(&data) else {
            panic!("not an insert");
        };
        let mut seen = 0;
        for cell in &new.0 {
            if let Cell::Text(v) | Cell::Binary(v) = cell
                && !v.is_empty()
            {
                assert!(range.contains(&v.as_ptr()), "{cell:?} is not a slice");
                seen += 1;
            }
        }
        assert_eq!(seen, 2);
    }

    #[test]
    fn update_with_full_old_row() {
        assert_eq!(
            ok(&sample_update(Some(b'O'))),
            Message::Update {
                relation: 7,
                old: Some(Tuple(vec![text("1"), text("old")])),
                old_is_key_only: false,
                new: Tuple(vec![text("1"), text("new")]),
            }
        );
    }

    #[test]
    fn update_with_key() {
        assert_eq!(
            ok(&sample_update(Some(b'K'))),
            Message::Update {
                relation: 7,
                old: Some(Tuple(vec![text("1"), text("old")])),
                old_is_key_only: true,
                new: Tuple(vec![text("1"), text("new")]),
            }
        );
    }

    #[test]
    fn update_without_old() {
        assert_eq!(
            ok(&sample_update(None)),
            Message::Update {
                relation: 7,
                old: None,
                old_is_key_only: false,
                new: Tuple(vec![text("1"), text("new")]),
            }
        );
    }

    #[test]
    fn delete_with_key_and_with_old_row() {
        for (tag, key_only) in [(b'K', true), (b'O', false)] {
            assert_eq!(
                ok(&sample_delete(tag)),
                Message::Delete {
                    relation: 7,
                    old: Tuple(vec![text("1"), Cell::Null]),
                    old_is_key_only: key_only,
                }
            );
        }
    }

    #[test]
    fn truncate_options() {
        for (options, cascade, restart_identity) in [
            (0, false, false),
            (1, true, false),
            (2, false, true),
            (3, true, true),
        ] {
            assert_eq!(
                ok(&sample_truncate(options)),
                Message::Truncate {
                    relations: vec![100, 200, 300],
                    cascade,
                    restart_identity,
                }
            );
        }
    }

    #[test]
    fn logical_message() {
        for (flags, transactional) in [(1, true), (0, false)] {
            assert_eq!(
                ok(&sample_message(flags)),
                Message::LogicalMessage {
                    transactional,
                    lsn: 0x0000_0002_0000_0010,
                    prefix: "urutau.test".into(),
                    content: Bytes::from_static(b"hi\0yo"),
                }
            );
        }
    }

    #[test]
    fn unknown_tags() {
        // Streaming (protocol v2+) and anything else are not decoded.
        for tag in [b'S', b'E', b'A', b'c', b'P', b'K', b'r', b'Z', 0, 0xFF] {
            assert_eq!(ok(&Bytes::from(vec![tag])), Message::Unknown(tag));
            assert_eq!(ok(&Bytes::from(vec![tag, 1, 2, 3])), Message::Unknown(tag));
        }
    }

    // ---- malformed input ------------------------------------------------

    #[test]
    fn empty_input_is_an_error() {
        assert!(err(&[]).contains("empty message"));
    }

    #[test]
    fn truncated_messages_of_every_kind_fail() {
        let cases = [
            (sample_begin(), "Begin"),
            (sample_commit(), "Commit"),
            (sample_origin(), "Origin"),
            (sample_relation(), "Relation"),
            (sample_type(), "Type"),
            (sample_insert(), "Insert"),
            (sample_update(Some(b'O')), "Update"),
            (sample_update(Some(b'K')), "Update"),
            (sample_update(None), "Update"),
            (sample_delete(b'K'), "Delete"),
            (sample_delete(b'O'), "Delete"),
            (sample_truncate(3), "Truncate"),
            (sample_message(1), "Message"),
        ];
        for (full, kind) in &cases {
            assert_prefixes_fail(full, kind);
        }
    }

    #[test]
    fn trailing_bytes_fail() {
        for full in [sample_begin(), sample_insert(), sample_truncate(0)] {
            let mut longer = full.to_vec();
            longer.push(0);
            assert!(err(&longer).contains("trailing"));
        }
    }

    #[test]
    fn error_names_what_was_expected() {
        let e = err(&sample_begin()[..10]);
        assert!(e.contains("Begin") && e.contains("commit timestamp"), "{e}");

        let e = err(&sample_relation()[..5]);
        assert!(
            e.contains("Relation") && e.contains("NUL-terminated namespace"),
            "{e}"
        );
    }

    #[test]
    fn bad_sub_tags_fail() {
        let insert = Msg::new(b'I').u32(1).u8(b'K').tuple(&[]).bytes();
        assert!(err(&insert).contains("'N'"));

        let update = Msg::new(b'U').u32(1).u8(b'X').tuple(&[]).bytes();
        assert!(err(&update).contains("'K', 'O' or 'N'"));

        let update_no_new = Msg::new(b'U')
            .u32(1)
            .u8(b'K')
            .tuple(&[])
            .u8(b'K')
            .tuple(&[])
            .bytes();
        assert!(err(&update_no_new).contains("'N'"));

        let delete = Msg::new(b'D').u32(1).u8(b'N').tuple(&[]).bytes();
        assert!(err(&delete).contains("'K' or 'O'"));

        let cell = Msg::new(b'I').u32(1).u8(b'N').u16(1).u8(b'x').bytes();
        let e = err(&cell);
        assert!(e.contains("column 0") && e.contains("'x'"), "{e}");
    }

    #[test]
    fn negative_and_oversized_lengths_fail() {
        let cell = Msg::new(b'I')
            .u32(1)
            .u8(b'N')
            .u16(1)
            .u8(b't')
            .i32(-1)
            .bytes();
        assert!(err(&cell).contains("negative"));

        let cell = Msg::new(b'I')
            .u32(1)
            .u8(b'N')
            .u16(1)
            .u8(b'b')
            .i32(i32::MAX)
            .raw(b"abc")
            .bytes();
        assert!(err(&cell).contains("truncated"));

        let message = Msg::new(b'M').u8(0).u64(0).string("p").i32(-7).bytes();
        assert!(err(&message).contains("negative"));

        let truncate = Msg::new(b'T').u32(u32::MAX).u8(0).u32(1).bytes();
        assert!(err(&truncate).contains("relation OIDs"));

        let columns = Msg::new(b'I').u32(1).u8(b'N').u16(u16::MAX).bytes();
        assert!(err(&columns).contains("truncated"));
    }

    #[test]
    fn strings_must_be_utf8() {
        let origin = Msg::new(b'O').u64(1).raw(&[0xC3, 0x28]).u8(0).bytes();
        assert!(err(&origin).contains("UTF-8"));
    }
}
