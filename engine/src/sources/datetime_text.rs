//! Timestamps in the one text form nearly every JSON writer uses —
//! `YYYY-MM-DDTHH:MM:SS[.fffffffff]` with `Z` or `±HH:MM` (RFC 3339, as
//! Debezium's `ZonedTimestamp` emits it), or with no zone — read by a
//! fixed-position scan. chrono's general parsers read them too, at
//! about 4% of a Kafka decoding lane's time for a table with one such
//! column; this scan answers only for the exact form, and anything else
//! (another separator, a leap second, a longer year, a lower-case `z`)
//! is left to chrono, so what is accepted and what it means do not change.

/// A timestamp's parts: seconds since 1970-01-01 of its local time, its
/// nanoseconds, and its offset east of UTC in seconds (`None`: no zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTimeParts {
    pub local_secs: i64,
    pub nanos: u32,
    pub offset_secs: Option<i32>,
}

/// The parts of `s` when it has exactly the form above and names a real
/// date and time; `None` otherwise (not necessarily an invalid
/// timestamp: the caller's general parser decides).
pub fn parse(s: &[u8]) -> Option<DateTimeParts> {
    if s.len() < 19
        || s[4] != b'-'
        || s[7] != b'-'
        || s[10] != b'T'
        || s[13] != b':'
        || s[16] != b':'
    {
        return None;
    }
    let year = digits(&s[0..4])?;
    let (month, day) = (digits(&s[5..7])?, digits(&s[8..10])?);
    let (hour, minute, second) = (
        digits(&s[11..13])?,
        digits(&s[14..16])?,
        digits(&s[17..19])?,
    );
    if !(1..=12).contains(&month)
        || day == 0
        || i64::from(day) > days_in_month(i64::from(year), i64::from(month))
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if s.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while end < s.len() && s[end].is_ascii_digit() {
            end += 1;
        }
        let n = end - start;
        if n == 0 || n > 9 {
            return None;
        }
        nanos = digits(&s[start..end])? * 10u32.pow((9 - n) as u32);
        i = end;
    }
    let offset_secs = match &s[i..] {
        [] => None,
        [b'Z'] => Some(0),
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if h > 23 || m > 59 {
                return None;
            }
            let east = (h * 3600 + m * 60) as i32;
            Some(if *sign == b'-' { -east } else { east })
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), i64::from(month), i64::from(day));
    Some(DateTimeParts {
        local_secs: days * 86_400 + (hour * 3600 + minute * 60 + second) as i64,
        nanos,
        offset_secs,
    })
}

/// The value of a run of ASCII digits (at most nine); `None` for any other
/// byte.
fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
    })
}

/// Whether `year` of the proleptic Gregorian calendar has a 29 February.
fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Days in `month` (1–12) of `year`; shared by every source's date reader so
/// the calendar is written once.
pub(crate) fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`); shared by every source's date reader.
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Years start in March, so the leap day ends a year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Datelike as _, NaiveDate, NaiveDateTime};

    /// What chrono reads from `s`: RFC 3339 with a zone, the `T` form
    /// without one.
    fn chrono_parts(s: &str) -> Option<(i64, u32, Option<i32>)> {
        if let Ok(dt) = DateTime::parse_from_rfc3339(s) {
            let offset = dt.offset().local_minus_utc();
            return Some((
                dt.timestamp() + i64::from(offset),
                dt.timestamp_subsec_nanos(),
                Some(offset),
            ));
        }
        let dt = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
        Some((
            dt.and_utc().timestamp(),
            dt.and_utc().timestamp_subsec_nanos(),
            None,
        ))
    }

    #[test]
    fn every_answer_is_chronos_and_the_common_forms_are_answered() {
        let mut answered = 0;
        let mut cases: Vec<String> = [
            "2024-01-18T10:13:00Z",
            "2024-01-18T10:13:00.5Z",
            "2024-01-18T10:13:00.123456Z",
            "2024-01-18T10:13:00.123456789Z",
            "2024-01-18T10:13:00.1234567891Z",
            "2024-01-18T10:13:00+05:30",
            "2024-01-18T10:13:00.25-08:00",
            "2024-01-18T10:13:00-00:00",
            "2024-01-18T10:13:00",
            "2024-01-18T10:13:00.000001",
            "1969-12-31T23:59:59.999999Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
            "2024-02-29T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2000-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-00-01T00:00:00Z",
            "2024-01-00T00:00:00Z",
            "2024-01-18T24:00:00Z",
            "2024-01-18T23:60:00Z",
            "2016-12-31T23:59:60Z",
            "2024-01-18t10:13:00Z",
            "2024-01-18 10:13:00Z",
            "2024-01-18T10:13:00z",
            "2024-01-18T10:13:00.Z",
            "2024-01-18T10:13:00+0530",
            "2024-01-18T10:13:00+24:00",
            "2024-01-18T10:13:00+05:60",
            "2024-01-18T10:13:00Z ",
            "2024-01-18T10:13Z",
            "+2024-01-18T10:13:00Z",
            "2024-1-18T10:13:00Z",
            "2024-01-18T10:13:0xZ",
        ]
        .map(String::from)
        .to_vec();
        // Every day of a leap and a common year, at a few times and zones.
        for year in [1600, 1969, 1970, 2023, 2024] {
            let mut d = NaiveDate::from_ymd_opt(year, 1, 1).unwrap();
            while d.year() == year {
                cases.push(format!("{d}T07:08:09.010Z"));
                cases.push(format!("{d}T23:59:59-03:30"));
                d = d.succ_opt().unwrap();
            }
        }
        for s in &cases {
            let ours = parse(s.as_bytes());
            if let Some(p) = ours {
                answered += 1;
                assert_eq!(
                    Some((p.local_secs, p.nanos, p.offset_secs)),
                    chrono_parts(s),
                    "{s}"
                );
            }
        }
        for common in [
            "2024-01-18T10:13:00Z",
            "2024-01-18T10:13:00.123456Z",
            "2024-01-18T10:13:00+05:30",
            "2024-01-18T10:13:00",
        ] {
            assert!(parse(common.as_bytes()).is_some(), "{common}");
        }
        assert!(answered > 2000, "{answered}");
    }
}
