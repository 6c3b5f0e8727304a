//! The end of a JSON object or array, found 64 bytes at a time.
//!
//! Skipping a value nobody reads is most of what a Debezium event costs
//! when it carries Kafka Connect's schema part (`schemas.enable = true`,
//! the JsonConverter's default): a few kilobytes of field definitions
//! before a payload of a few hundred bytes. Read byte by byte, with a
//! branch per byte, that skip cost more than decoding the row.
//!
//! Here each block of 64 bytes becomes bit masks of its quotes, its
//! backslashes, its opening and its closing brackets (SSE2, which every
//! x86_64 CPU has). A prefix XOR of the quotes marks the bytes inside
//! strings, so only the brackets outside strings are walked, one set bit
//! at a time. A block holding a backslash (an escape) is read byte by
//! byte, like the whole text on other CPUs; both ways give the same end
//! for any text (a test compares them).

/// Bytes per block: one bit per byte in a `u64`.
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 64;

/// The end (one past the closing bracket) of the object or array whose
/// opening bracket is at `i`; `None` when the text ends first. Brackets
/// are counted, not matched by kind: the scan checks balance, not every
/// token (see [`super::json_text`]).
pub fn container_end(b: &[u8], i: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        by_blocks(b, i)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut state = State::default();
        bytewise(b, i, b.len(), &mut state).err()
    }
}

/// Where the scan is: the brackets open, and whether it is in a string.
#[derive(Default)]
struct State {
    depth: u32,
    in_string: bool,
}

/// Reads `b[k..end]` (and the byte an escape at `end - 1` covers) one byte
/// at a time from `state`: `Err(end of the container)` when it closes,
/// else `Ok(where to go on)`.
fn bytewise(b: &[u8], mut k: usize, end: usize, state: &mut State) -> Result<usize, usize> {
    while k < end {
        let c = b[k];
        k += 1;
        if state.in_string {
            match c {
                b'\\' => k += 1,
                b'"' => state.in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => state.in_string = true,
            b'{' | b'[' => state.depth += 1,
            b'}' | b']' => {
                state.depth -= 1;
                if state.depth == 0 {
                    return Err(k);
                }
            }
            _ => {}
        }
    }
    Ok(k)
}

#[cfg(target_arch = "x86_64")]
fn by_blocks(b: &[u8], i: usize) -> Option<usize> {
    let mut state = State::default();
    let mut j = i;
    while j < b.len() {
        let block: [u8; BLOCK] = match b.get(j..j + BLOCK) {
            Some(s) => s.try_into().expect("a block's length"),
            // The last bytes, padded with spaces (which mean nothing).
            None => {
                let mut padded = [b' '; BLOCK];
                padded[..b.len() - j].copy_from_slice(&b[j..]);
                padded
            }
        };
        let m = Masks::of(&block);
        if m.backslashes != 0 {
            match bytewise(b, j, (j + BLOCK).min(b.len()), &mut state) {
                Ok(next) => j = next,
                Err(end) => return Some(end),
            }
            continue;
        }
        // Bytes inside a string: from an opening quote up to (not
        // including) its closing one.
        let inside = prefix_xor(m.quotes) ^ if state.in_string { !0 } else { 0 };
        state.in_string = inside >> 63 == 1;
        let closes = m.closes & !inside;
        let mut brackets = (m.opens | m.closes) & !inside;
        while brackets != 0 {
            let k = brackets.trailing_zeros();
            if closes >> k & 1 == 0 {
                state.depth += 1;
            } else {
                state.depth -= 1;
                if state.depth == 0 {
                    return Some(j + k as usize + 1);
                }
            }
            brackets &= brackets - 1;
        }
        j += BLOCK;
    }
    None
}

/// Each bit the XOR of itself and every lower bit: set from an opening
/// quote up to the byte before its closing one.
#[cfg(target_arch = "x86_64")]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// One block's bytes of interest, a bit each (bit `k` = byte `k`).
#[cfg(target_arch = "x86_64")]
#[derive(Debug, PartialEq, Eq)]
struct Masks {
    quotes: u64,
    backslashes: u64,
    /// `{` and `[`.
    opens: u64,
    /// `}` and `]`.
    closes: u64,
}

#[cfg(target_arch = "x86_64")]
impl Masks {
    fn of(block: &[u8; BLOCK]) -> Masks {
        // SAFETY: SSE2 is part of the x86_64 baseline: every x86_64 CPU
        // has it, so calling a function that uses it is sound.
        unsafe { masks_sse2(block) }
    }

    /// The same masks a byte at a time: what the SSE2 version is checked
    /// against.
    #[cfg(test)]
    fn bytewise(block: &[u8; BLOCK]) -> Masks {
        let mut m = Masks {
            quotes: 0,
            backslashes: 0,
            opens: 0,
            closes: 0,
        };
        for (k, &c) in block.iter().enumerate() {
            let bit = 1u64 << k;
            match c {
                b'"' => m.quotes |= bit,
                b'\\' => m.backslashes |= bit,
                b'{' | b'[' => m.opens |= bit,
                b'}' | b']' => m.closes |= bit,
                _ => {}
            }
        }
        m
    }
}

/// [`Masks`] of a block, 16 bytes per SSE2 comparison. `{`/`[` and
/// `}`/`]` differ only in bit 5, so setting that bit makes each pair one
/// comparison.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn masks_sse2(block: &[u8; BLOCK]) -> Masks {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set_epi64x, _mm_set1_epi8,
    };
    let bits = |v: __m128i, c: u8| -> u64 {
        let mask = _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8)));
        u64::from(mask as u16)
    };
    let mut m = Masks {
        quotes: 0,
        backslashes: 0,
        opens: 0,
        closes: 0,
    };
    for (part, bytes) in block.chunks_exact(16).enumerate() {
        let half =
            |h: usize| i64::from_le_bytes(bytes[h * 8..h * 8 + 8].try_into().expect("eight bytes"));
        let v = _mm_set_epi64x(half(1), half(0));
        let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        let at = part * 16;
        m.quotes |= bits(v, b'"') << at;
        m.backslashes |= bits(v, b'\\') << at;
        m.opens |= bits(folded, b'{') << at;
        m.closes |= bits(folded, b'}') << at;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-at-a-time scan of the whole text: the reference.
    fn reference(b: &[u8], i: usize) -> Option<usize> {
        bytewise(b, i, b.len(), &mut State::default()).err()
    }

    /// A small deterministic generator (xorshift), so a failure repeats.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn ends_where_the_bytewise_scan_ends_for_any_text() {
        // Mostly structure, so strings, escapes and brackets meet block
        // edges in every way; some texts never close.
        let alphabet = b"{}[]\"\"\\,:a1 {\"\"}";
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut closed = 0;
        for _ in 0..20_000 {
            let len = 1 + rng.below(400);
            let mut text: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            let i = rng.below(len);
            text[i] = if rng.below(2) == 0 { b'{' } else { b'[' };
            let expected = reference(&text, i);
            closed += usize::from(expected.is_some());
            assert_eq!(
                container_end(&text, i),
                expected,
                "{:?} from byte {i}",
                String::from_utf8_lossy(&text)
            );
        }
        assert!(closed > 1_000, "too few texts closed ({closed}) to test");
    }

    #[test]
    fn skips_what_strings_hold() {
        let text = br#"{"a":"}]{[","b":{"c":"\"}"},"d":[1,{"e":"\\"}]} tail"#;
        let end = text.iter().position(|&c| c == b' ').unwrap();
        assert_eq!(container_end(text, 0), Some(end));
        // A long object: the end lies blocks away.
        let long = format!(
            r#"[{}"{}"] ,"#,
            r#"{"k":"v}"},"#.repeat(40),
            "x".repeat(100)
        );
        assert_eq!(container_end(long.as_bytes(), 0), Some(long.len() - 2));
        assert_eq!(container_end(br#"{"a":"}"#, 0), None);
        assert_eq!(container_end(b"[[]", 0), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sse2_masks_equal_the_bytewise_ones() {
        let mut rng = Rng(42);
        let alphabet = b"{}[]\"\\ax;{[]}\x7b\x5b\x7d\x5d\xfb\xdb\xfd\xdd\x00\x20";
        for _ in 0..5_000 {
            let block: [u8; BLOCK] = std::array::from_fn(|_| alphabet[rng.below(alphabet.len())]);
            assert_eq!(Masks::of(&block), Masks::bytewise(&block), "{block:?}");
        }
    }
}
