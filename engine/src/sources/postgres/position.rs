//! The Postgres source's positions: a WAL LSN, written `X/Y` (hex halves)
//! as Postgres writes it. Totally ordered.

use std::cmp::Ordering;
use std::fmt;

use crate::position::{Position, PositionError, PositionKind, SourcePosition};

/// A WAL position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LsnPosition(pub u64);

/// The Postgres source's kind of position.
pub struct LsnPositions;

/// The one [`LsnPositions`].
pub static LSN_POSITIONS: LsnPositions = LsnPositions;

impl PositionKind for LsnPositions {
    fn name(&self) -> &'static str {
        "LSN"
    }

    fn parse(&self, text: &str) -> Result<Position, PositionError> {
        let err = |reason: &str| PositionError::parse(self, text, reason);
        let (hi, lo) = text.split_once('/').ok_or_else(|| err("expected X/Y"))?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err("bad high half"))?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err("bad low half"))?;
        Ok(Position::new(LsnPosition(((hi as u64) << 32) | lo as u64)))
    }
}

impl fmt::Display for LsnPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl SourcePosition for LsnPosition {
    fn kind(&self) -> &'static dyn PositionKind {
        &LSN_POSITIONS
    }

    fn partial_cmp(&self, other: &Position) -> Option<Ordering> {
        Some(self.0.cmp(&other.downcast_ref::<LsnPosition>()?.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        LSN_POSITIONS.parse(s).unwrap()
    }

    #[test]
    fn text_forms_round_trip_and_order() {
        assert_eq!(p("16/B374D848").to_string(), "16/B374D848");
        assert_eq!(
            p("16/B374D848").downcast_ref::<LsnPosition>(),
            Some(&LsnPosition(0x16_B374_D848))
        );
        assert!(LSN_POSITIONS.parse("16B374D848").is_err());
        assert!(LSN_POSITIONS.parse("1/G").is_err());
        assert!(p("1/0") > p("0/FFFFFFFF"));
        assert_eq!(p("0/10").join(&p("0/20")), Some(p("0/20")));
        assert_eq!(p("0/10").meet(&p("0/20")), Some(p("0/10")));
    }
}
