//! JSON text read without building values: an object's fields as slices
//! of its text, found by a structural scan (strings, brackets,
//! delimiters). For the hot paths that only route on a few fields, compare
//! them, or hand a field's text to a typed decoder: a Debezium envelope's
//! `before` and `after` are then decoded once, straight into Arrow
//! builders, instead of being parsed as values first (that parse was as
//! costly as the row decode itself).
//!
//! The scan checks structure, not every token: a field's text is checked
//! by whoever reads it ([`string`] and [`integer`] here, the typed row
//! decoder for row images); the text of a field nobody reads is only
//! checked to be a balanced JSON value.

use std::borrow::Cow;

use super::json_blocks;

/// The fields of the JSON object `text`, in their order, as `(name, raw
/// value text)`; an error (with its byte offset) when the text is not an
/// object as the scan reads it, or has anything but whitespace after it.
pub fn fields(text: &str) -> Fields<'_> {
    Fields {
        text,
        at: 0,
        state: State::Start,
        plain_string: None,
    }
}

/// [`fields`] of the object `text` from its delimiter at byte `at` (the
/// `,` after a field, or the closing `}`) on: the fields after those a
/// reader of compact text ([`compact_value`]) already took.
pub(crate) fn fields_after(text: &str, at: usize) -> Fields<'_> {
    Fields {
        text,
        at,
        state: State::Inside,
        plain_string: None,
    }
}

/// Iterator of [`fields`].
pub struct Fields<'a> {
    text: &'a str,
    at: usize,
    state: State,
    /// Where the content of the value of the field last returned lies in
    /// `text`, when that value is a string without escapes.
    plain_string: Option<(usize, usize)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Inside,
    Done,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(Cow<'a, str>, &'a str), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.state == State::Done {
            return None;
        }
        // `step` builds the item in place: converting its result from
        // another shape here cost a stalled copy per field (a third of
        // this function's time).
        let item = self.step();
        if !matches!(item, Some(Ok(_))) {
            self.state = State::Done;
        }
        item
    }
}

impl<'a> Fields<'a> {
    /// The content (between its quotes) of the value of the field last
    /// returned, when that value is a string without escapes: the scan
    /// that found its end has read it already, and a typed reader need
    /// not look for escapes again ([`string`] would; that second look
    /// was a thirtieth of a decoding lane).
    pub fn plain_string(&self) -> Option<&'a str> {
        self.plain_string.map(|(from, to)| cut(self.text, from, to))
    }

    /// The next field; `None` at the object's end.
    fn step(&mut self) -> Option<Result<(Cow<'a, str>, &'a str), String>> {
        let (text, b) = (self.text, self.text.as_bytes());
        let mut i = skip_ws(b, self.at);
        if self.state == State::Start {
            if b.get(i) != Some(&b'{') {
                return Some(Err(expected("an object", b, i)));
            }
            self.state = State::Inside;
            i = skip_ws(b, i + 1);
            if b.get(i) == Some(&b'}') {
                return self.end(i + 1);
            }
        } else {
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => return self.end(i + 1),
                _ => return Some(Err(expected("`,` or `}`", b, i))),
            }
        }
        if b.get(i) != Some(&b'"') {
            return Some(Err(expected("a field name", b, i)));
        }
        let Some((key_end, escaped)) = scan_string(b, i) else {
            return Some(Err(unterminated(i)));
        };
        let key = match escaped {
            false => Cow::Borrowed(cut(text, i + 1, key_end - 1)),
            true => match string(cut(text, i, key_end)) {
                Ok(k) => k,
                Err(e) => return Some(Err(e)),
            },
        };
        // Compact text (no space around the `:`) needs no look for it.
        i = key_end;
        if b.get(i) != Some(&b':') {
            i = skip_ws(b, i);
            if b.get(i) != Some(&b':') {
                return Some(Err(expected("`:`", b, i)));
            }
        }
        i = skip_ws(b, i + 1);
        let value_end = match skip_value(b, i) {
            Ok((end, plain_string)) => {
                // Inside its quotes, which the scan found.
                self.plain_string = plain_string.then_some((i + 1, end - 1));
                end
            }
            Err(e) => return Some(Err(e)),
        };
        self.at = value_end;
        Some(Ok((key, cut(text, i, value_end))))
    }

    /// The object closed at `end`: only whitespace may follow.
    fn end<T>(&mut self, end: usize) -> Option<Result<T, String>> {
        let b = self.text.as_bytes();
        let rest = skip_ws(b, end);
        (rest < b.len()).then(|| Err(format!("text after the object at byte {rest}")))
    }
}

/// The text of field `name` of the object `text` (`None`: absent),
/// scanning only as far as that field.
pub fn field<'a>(text: &'a str, name: &str) -> Result<Option<&'a str>, String> {
    for field in fields(text) {
        let (key, raw) = field?;
        if key == name {
            return Ok(Some(raw));
        }
    }
    Ok(None)
}

/// The value of a JSON string's text (its quotes included), borrowed
/// unless it holds escapes.
pub fn string(raw: &str) -> Result<Cow<'_, str>, String> {
    let b = raw.as_bytes();
    if b.first() == Some(&b'"')
        // The scan of the field (eight bytes at a time): a byte-wise search
        // for escapes here cost 4% of a decoding lane.
        && let Some((end, false)) = scan_string(b, 0)
        && end == b.len()
    {
        return Ok(Cow::Borrowed(&raw[1..end - 1]));
    }
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(_) => serde_json::from_str::<String>(raw)
            .map(Cow::Owned)
            .map_err(|e| e.to_string()),
        None => Err(format!("{} is not a string", shorten(raw))),
    }
}

/// A JSON integer's value.
pub fn integer(raw: &str) -> Result<i64, String> {
    if let Some(n) = short_integer(raw.as_bytes()) {
        return Ok(n);
    }
    raw.parse()
        .map_err(|_| format!("{} is not an integer", shorten(raw)))
}

/// The value of a JSON integer of at most 18 digits (always an `i64`),
/// read in the one pass that checks it; `None` for any other text, which
/// the general readers then take. Most numbers of a row are such: the
/// grammar check and then the standard parse read each twice.
#[inline]
pub(crate) fn short_integer(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 || (digits[0] == b'0' && digits.len() > 1) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + i64::from(d);
    }
    Some(if negative { -v } else { v })
}

/// A JSON number's value, as serde_json reads one: an integer in the range
/// of `i64` or `u64` as that integer, any other number as the nearest `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    I64(i64),
    U64(u64),
    F64(f64),
}

/// The value of a JSON number's text; an error when the text is not one
/// (JSON's grammar: no `+`, no leading zeros, no bare `.`).
pub fn number(raw: &str) -> Result<Number, String> {
    if let Some(n) = short_integer(raw.as_bytes()) {
        return Ok(Number::I64(n));
    }
    let not_json = || format!("{} is not a JSON value", shorten(raw));
    let b = raw.as_bytes();
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = usize::from(b.first() == Some(&b'-'));
    i = match b.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(i + 1),
        _ => return Err(not_json()),
    };
    let integral = i == b.len();
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(not_json());
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(not_json());
        }
        i = end;
    }
    if i != b.len() {
        return Err(not_json());
    }
    if integral {
        if let Ok(n) = raw.parse() {
            return Ok(Number::I64(n));
        }
        if let Ok(n) = raw.parse() {
            return Ok(Number::U64(n));
        }
    }
    raw.parse().map(Number::F64).map_err(|_| not_json())
}

/// Whether two field names are equal. Names are short: a length check
/// and two overlapping word compares at most, where a call to `memcmp`
/// (what `==` on strings becomes) cost a twentieth of a decoding lane's
/// time, matching each field of each row image to its column.
#[inline]
pub fn same_name(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// [`same_name`] of byte strings.
#[inline]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |t: &[u8], at: usize| u32::from_le_bytes(t[at..at + 4].try_into().expect("4"));
    let long = |t: &[u8], at: usize| u64::from_le_bytes(t[at..at + 8].try_into().expect("8"));
    match n {
        0 => true,
        // First, middle and last byte: every byte of 1 to 3.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        // The first and the last four bytes (overlapping): every byte.
        4..=8 => word(a, 0) == word(b, 0) && word(a, n - 4) == word(b, n - 4),
        9..=16 => long(a, 0) == long(b, 0) && long(a, n - 8) == long(b, n - 8),
        _ => a == b,
    }
}

/// The end of the scalar JSON value at byte `i` of compact text, and
/// whether it is a string without escapes: a string, a number (its
/// characters: digits, `-`, `+`, `.`, `e`, `E`) or `true`, `false`,
/// `null`. `None` for anything else (an object, an array, whitespace),
/// which the general scan ([`fields`]) then reads. Where the value is
/// followed by `,` or `}`, its text is the one [`fields`] would give.
#[inline]
pub(crate) fn compact_value(b: &[u8], i: usize) -> Option<(usize, bool)> {
    match *b.get(i)? {
        b'"' => scan_string(b, i).map(|(end, escaped)| (end, !escaped)),
        b'-' | b'0'..=b'9' => {
            let mut j = i + 1;
            while j < b.len() && matches!(b[j], b'0'..=b'9' | b'.' | b'e' | b'E' | b'-' | b'+') {
                j += 1;
            }
            Some((j, false))
        }
        b't' if b.get(i..i + 4) == Some(b"true") => Some((i + 4, false)),
        b'f' if b.get(i..i + 5) == Some(b"false") => Some((i + 5, false)),
        b'n' if b.get(i..i + 4) == Some(b"null") => Some((i + 4, false)),
        _ => None,
    }
}

/// Whether a value's text is JSON's `null`.
pub fn is_null(raw: &str) -> bool {
    raw == "null"
}

/// The first byte at or after `i` that is not whitespace. Most JSON of a
/// change stream is compact: the first byte is checked before the loop.
#[inline(always)]
fn skip_ws(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c > b' ' => i,
        _ => skip_ws_loop(b, i),
    }
}

fn skip_ws_loop(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// `text[from..to]`, both ends known to be character boundaries: the
/// scan only cuts next to an ASCII byte (a quote, a bracket, a delimiter,
/// the first byte of a value) or at the text's end, and no byte of a
/// multi-byte UTF-8 character is ASCII. The checked slice's boundary
/// tests, a call per cut, were a fortieth of a decoding lane.
#[inline]
fn cut(text: &str, from: usize, to: usize) -> &str {
    debug_assert!(from <= to && text.is_char_boundary(from) && text.is_char_boundary(to));
    // SAFETY: in bounds and on character boundaries, as said above (and
    // checked in debug builds).
    unsafe { text.get_unchecked(from..to) }
}

/// The end of the JSON value starting at `i`, and whether it is a string
/// without escapes. Inlined into the field scan, its one caller: the call
/// (registers saved and restored, the result through memory) cost as much
/// as skipping a short value.
#[inline(always)]
fn skip_value(b: &[u8], i: usize) -> Result<(usize, bool), String> {
    match b.get(i) {
        Some(b'"') => scan_string(b, i)
            .map(|(end, escaped)| (end, !escaped))
            .ok_or_else(|| unterminated(i)),
        Some(b'{' | b'[') => json_blocks::container_end(b, i)
            .map(|end| (end, false))
            .ok_or_else(|| unterminated(i)),
        Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            Ok((j, false))
        }
        _ => Err(expected("a value", b, i)),
    }
}

/// The end of the JSON string starting at `i` (its opening quote), and
/// whether it holds escapes. Eight bytes at a time: most strings here are
/// short (field names, codes), where a call to `memchr` costs more than
/// the scan.
fn scan_string(b: &[u8], i: usize) -> Option<(usize, bool)> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    // Bytes of `v` that are zero, as their high bits (exact for the lowest
    // one, which is all the scan uses).
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let mut escaped = false;
    let mut j = i + 1;
    loop {
        while let Some(chunk) = b.get(j..j + 8) {
            let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let hits = zero_bytes(v ^ QUOTES) | zero_bytes(v ^ BACKSLASHES);
            if hits != 0 {
                j += (hits.trailing_zeros() / 8) as usize;
                break;
            }
            j += 8;
        }
        match b.get(j)? {
            b'"' => return Some((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                j += 2;
            }
            _ => j += 1,
        }
    }
}

fn expected(what: &str, b: &[u8], i: usize) -> String {
    match b.get(i) {
        None => format!("expected {what} at byte {i}, found the end of the text"),
        Some(c) => format!(
            "expected {what} at byte {i}, found `{}`",
            char::from(*c).escape_default()
        ),
    }
}

fn unterminated(i: usize) -> String {
    format!("the value at byte {i} is not terminated")
}

/// A value shown in an error, cut at 64 characters.
pub(crate) fn shorten(raw: &str) -> String {
    match raw.char_indices().nth(64) {
        Some((cut, _)) => format!("{}...", &raw[..cut]),
        None => raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> Result<Vec<(String, String)>, String> {
        fields(text)
            .map(|f| f.map(|(k, v)| (k.into_owned(), v.to_string())))
            .collect()
    }

    #[test]
    fn an_objects_fields_are_slices_of_its_text() {
        let text = r#" { "a" : 1 , "b\"c":{"x":[1,"]}"]}, "d":"e\\\"" , "n":null } "#;
        assert_eq!(
            all(text).unwrap(),
            vec![
                ("a".into(), "1".into()),
                ("b\"c".into(), r#"{"x":[1,"]}"]}"#.into()),
                ("d".into(), r#""e\\\"""#.into()),
                ("n".into(), "null".into()),
            ]
        );
        assert_eq!(all("{}").unwrap(), vec![]);
        // Strings longer than the eight bytes scanned at a time, with
        // escapes and quotes on either side of a chunk's edge.
        let long = r#"{"a long field name \" here":"0123456\\\"89abcdef\"0123456789012345"}"#;
        assert_eq!(
            all(long).unwrap(),
            vec![(
                "a long field name \" here".into(),
                r#""0123456\\\"89abcdef\"0123456789012345""#.into()
            )]
        );
        for n in 0..20 {
            let text = format!(r#"{{"k":"{}"}}"#, "x".repeat(n));
            assert_eq!(all(&text).unwrap()[0].1.len(), n + 2, "{text}");
        }
    }

    #[test]
    fn what_is_not_an_object_is_an_error_with_its_place() {
        for (text, says) in [
            (r#"{"op": "c", "after": {"#, "byte 21 is not terminated"),
            (r#"{"a":1"#, "found the end of the text"),
            (r#"{"a" 1}"#, "expected `:` at byte 5"),
            (r#"{"a":1}x"#, "text after the object at byte 7"),
            (r#"{"a":}"#, "expected a value at byte 5"),
            (r#"{a:1}"#, "expected a field name at byte 1"),
            ("[1]", "expected an object at byte 0"),
            (r#"{"a":"x"#, "byte 5 is not terminated"),
        ] {
            let e = all(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_string_value_without_escapes_is_given_as_its_content() {
        let text = r#"{"a":"plain","b":"with \"quotes\"","c":12,"d":"","e":{"f":"g"},"h":"é"}"#;
        let mut it = fields(text);
        let mut seen = Vec::new();
        while let Some(field) = it.next() {
            let (key, raw) = field.unwrap();
            assert!(it.plain_string().is_none_or(|p| raw == format!("\"{p}\"")));
            seen.push((key.into_owned(), it.plain_string()));
        }
        assert_eq!(
            seen,
            vec![
                ("a".to_string(), Some("plain")),
                ("b".to_string(), None),
                ("c".to_string(), None),
                ("d".to_string(), Some("")),
                ("e".to_string(), None),
                ("h".to_string(), Some("é")),
            ]
        );
    }

    #[test]
    fn short_integers_read_as_the_general_readers_read_them() {
        let mut texts: Vec<String> = [
            "0", "-0", "7", "-7", "00", "-", "", "01", "1.0", "1e2", "12a", "a12", "--1", "+1",
            " 1", "1 ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Up to past the 18 digits read in one pass, either sign, at the
        // edges of i64.
        for n in 1..=20 {
            texts.push("9".repeat(n));
            texts.push(format!("-{}", "9".repeat(n)));
            texts.push(format!("1{}", "0".repeat(n - 1)));
        }
        texts.push(i64::MAX.to_string());
        texts.push(i64::MIN.to_string());
        for t in &texts {
            let general = t.parse::<i64>().ok().filter(|_| {
                // JSON has no leading zeros or `+`, and `-` needs a digit.
                let digits = t.strip_prefix('-').unwrap_or(t);
                !digits.starts_with('+') && (digits == "0" || !digits.starts_with('0'))
            });
            if let Some(n) = short_integer(t.as_bytes()) {
                assert_eq!(Some(n), general, "{t}");
            }
            let short_enough = t.trim_start_matches('-').len() <= 18;
            if general.is_some() && short_enough {
                assert_eq!(short_integer(t.as_bytes()), general, "{t}");
            }
            match general {
                Some(n) => {
                    assert_eq!(number(t), Ok(Number::I64(n)), "{t}");
                    assert_eq!(integer(t), Ok(n), "{t}");
                }
                None => assert!(!matches!(number(t), Ok(Number::I64(_))), "{t}"),
            }
        }
    }

    #[test]
    fn names_are_the_same_exactly_when_equal() {
        // Every length up to past 16, differing at every place.
        for n in 0..=20 {
            let a: String = (0..n).map(|i| char::from(b'a' + i as u8)).collect();
            assert!(same_name(&a, &a.clone()), "{a}");
            assert!(!same_name(&a, &format!("{a}x")), "{a}");
            for at in 0..n {
                let mut b = a.clone().into_bytes();
                b[at] = b'_';
                let b = String::from_utf8(b).unwrap();
                assert!(!same_name(&a, &b), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn strings_and_integers_read_exactly() {
        assert_eq!(string(r#""c""#).unwrap(), "c");
        assert!(matches!(string(r#""plain""#).unwrap(), Cow::Borrowed(_)));
        assert_eq!(string(r#""a\u0062\n""#).unwrap(), "ab\n");
        assert!(string("5").unwrap_err().contains("is not a string"));
        assert!(string("\"").unwrap_err().contains("is not a string"));
        assert_eq!(string(r#""""#).unwrap(), "");
        // Escapes past the first eight bytes, and an escaped quote.
        assert_eq!(
            string(r#""a long plain text\\ then \"quoted\" \u00e9""#).unwrap(),
            "a long plain text\\ then \"quoted\" é"
        );
        assert!(matches!(
            string(r#""a long plain text of no escape""#).unwrap(),
            Cow::Borrowed("a long plain text of no escape")
        ));
        assert_eq!(integer("-17").unwrap(), -17);
        assert!(integer("1.5").unwrap_err().contains("is not an integer"));
        assert!(is_null("null") && !is_null("\"null\""));
        assert_eq!(number("-12").unwrap(), Number::I64(-12));
        assert_eq!(
            number("18446744073709551615").unwrap(),
            Number::U64(u64::MAX)
        );
        assert_eq!(number("1e3").unwrap(), Number::F64(1000.0));
        assert_eq!(number("-0.25").unwrap(), Number::F64(-0.25));
        assert_eq!(
            number("18446744073709551616").unwrap(),
            Number::F64(2f64.powi(64))
        );
        for bad in ["+1", "01", "1.", ".5", "1e", "-", "1x", "tru", "NaN", "inf"] {
            assert!(
                number(bad).unwrap_err().contains("is not a JSON value"),
                "{bad}"
            );
        }
    }
}
