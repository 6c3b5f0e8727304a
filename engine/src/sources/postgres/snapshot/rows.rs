//! A chunk's rows as `COPY ... TO STDOUT` sends them (text format), kept
//! in one buffer: every value is the text the type's output function
//! writes — what pgoutput sends for the same value — so the stream's value
//! parsers read both alike.
//!
//! One buffer and one cell table per chunk instead of a vector per value:
//! a chunk of thousands of rows costs a few allocations, not one per cell.

/// The rows of one chunk: `columns` cells per row, each a NULL or a slice
/// of `data`; the last `hidden` of them are read for the snapshot's own
/// use (a `ctid`), not rows' values.
#[derive(Debug, Default)]
pub struct ChunkRows {
    columns: usize,
    hidden: usize,
    data: Vec<u8>,
    /// Each cell's start and end in `data`; `NULL_CELL` for a NULL.
    cells: Vec<(usize, usize)>,
}

const NULL_CELL: (usize, usize) = (usize::MAX, usize::MAX);

/// A row of COPY's text format that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("row {row} of the COPY output: {what}")]
pub struct CopyRowError {
    row: usize,
    what: String,
}

impl ChunkRows {
    /// An empty chunk of rows of `columns` cells.
    #[cfg(test)]
    pub fn new(columns: usize) -> ChunkRows {
        ChunkRows::with_hidden(columns, 0)
    }

    /// An empty chunk of rows of `columns` values and `hidden` cells
    /// after them.
    pub fn with_hidden(columns: usize, hidden: usize) -> ChunkRows {
        ChunkRows {
            columns: columns + hidden,
            hidden,
            data: Vec::new(),
            cells: Vec::new(),
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.cells.len().checked_div(self.columns).unwrap_or(0)
    }

    /// The value of column `column` in row `row` (`None`: NULL).
    pub fn value(&self, row: usize, column: usize) -> Option<&[u8]> {
        let (start, end) = self.cells[row * self.columns + column];
        (start != usize::MAX).then(|| &self.data[start..end])
    }

    /// The values of row `row`, in column order (hidden cells apart).
    pub fn row(&self, row: usize) -> impl Iterator<Item = Option<&[u8]>> + '_ {
        (0..self.columns - self.hidden).map(move |c| self.value(row, c))
    }

    /// Appends one row of COPY's text format (one `CopyData` message: the
    /// values separated by tabs, `\N` for NULL, backslash escapes, and a
    /// newline at the end).
    pub fn push_copy_line(&mut self, line: &[u8]) -> Result<(), CopyRowError> {
        let row = self.len();
        let fail = |what: String| CopyRowError { row, what };
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let row_data = self.data.len();
        let mut fields = 0usize;
        for field in line.split(|b| *b == b'\t') {
            fields += 1;
            if fields > self.columns {
                continue;
            }
            if field == b"\\N" {
                self.cells.push(NULL_CELL);
                continue;
            }
            let start = self.data.len();
            if field.contains(&b'\\') {
                if let Err(e) = unescape(field, &mut self.data) {
                    self.data.truncate(row_data);
                    self.cells.truncate(row * self.columns);
                    return Err(fail(format!("column {fields}: {e}")));
                }
            } else {
                self.data.extend_from_slice(field);
            }
            self.cells.push((start, self.data.len()));
        }
        if fields != self.columns {
            self.data.truncate(row_data);
            self.cells.truncate(row * self.columns);
            return Err(fail(format!("{fields} values, {} expected", self.columns)));
        }
        Ok(())
    }
}

/// Undoes COPY's text escapes (the ones its output writes, and the octal
/// and hex forms its input takes) into `out`.
fn unescape(field: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&e) = field.get(i) else {
            return Err("a backslash at the end of a value".into());
        };
        i += 1;
        out.push(match e {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'v' => 0x0b,
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match field.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                v as u8
            }
            b'x' => {
                let mut v = 0u32;
                let mut digits = 0;
                while digits < 2 {
                    match field.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                            digits += 1;
                        }
                        None => break,
                    }
                }
                if digits == 0 { b'x' } else { v as u8 }
            }
            other => other,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(rows: &ChunkRows, row: usize) -> Vec<Option<String>> {
        rows.row(row)
            .map(|v| v.map(|b| String::from_utf8(b.to_vec()).unwrap()))
            .collect()
    }

    #[test]
    fn lines_split_into_values_and_nulls() {
        let mut rows = ChunkRows::new(3);
        rows.push_copy_line(b"1\t\\N\tabc\n").unwrap();
        rows.push_copy_line(b"2\t\tx y\n").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            values(&rows, 0),
            [Some("1".into()), None, Some("abc".into())]
        );
        assert_eq!(
            values(&rows, 1),
            [Some("2".into()), Some(String::new()), Some("x y".into())]
        );
    }

    #[test]
    fn hidden_cells_are_read_but_not_part_of_a_row() {
        let mut rows = ChunkRows::with_hidden(2, 1);
        rows.push_copy_line(b"1\t\\N\t(0,7)\n").unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(values(&rows, 0), [Some("1".into()), None]);
        assert_eq!(rows.value(0, 2), Some(&b"(0,7)"[..]));
        let e = rows.push_copy_line(b"1\t2\n").unwrap_err();
        assert!(e.to_string().contains("2 values, 3 expected"), "{e}");
    }

    #[test]
    fn escapes_come_back_as_the_bytes_they_stand_for() {
        let mut rows = ChunkRows::new(2);
        rows.push_copy_line(b"a\\tb\\nc\\\\d\\r\t\\\\x41\\101\\x42\n")
            .unwrap();
        assert_eq!(
            values(&rows, 0),
            [Some("a\tb\nc\\d\r".into()), Some("\\x41AB".into())]
        );
        // `\N` only as a whole value is NULL; escaped it is text.
        rows.push_copy_line(b"\\\\N\tx\n").unwrap();
        assert_eq!(values(&rows, 1), [Some("\\N".into()), Some("x".into())]);
    }

    #[test]
    fn a_row_with_the_wrong_number_of_values_is_an_error_and_leaves_nothing() {
        let mut rows = ChunkRows::new(2);
        rows.push_copy_line(b"1\t2\n").unwrap();
        let e = rows.push_copy_line(b"1\t2\t3\n").unwrap_err();
        assert!(e.to_string().contains("3 values, 2 expected"), "{e}");
        let e = rows.push_copy_line(b"1\t2\t3\t4\n").unwrap_err();
        assert!(e.to_string().contains("4 values, 2 expected"), "{e}");
        let e = rows.push_copy_line(b"1\n").unwrap_err();
        assert!(e.to_string().contains("1 values, 2 expected"), "{e}");
        assert_eq!(rows.len(), 1);
        let e = rows.push_copy_line(b"x\ty\\\n").unwrap_err();
        assert!(e.to_string().contains("backslash at the end"), "{e}");
        assert_eq!(rows.len(), 1);
    }
}
