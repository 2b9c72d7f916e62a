//! RFC 3339 timestamps (UTC, microseconds) without a date-time crate.
//!
//! Events need one format and the report needs to read it back and compare; Howard Hinnant's
//! days-from-civil / civil-from-days algorithms do the calendar part in a few lines, which is
//! leaner than pulling in `chrono` or `time`.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Microseconds since the Unix epoch (UTC). Ordered, cheap to copy, and (de)serialized as an
/// RFC 3339 string such as `2024-05-01T12:34:56.123456Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }

    pub fn from_secs(secs: i64) -> Timestamp {
        Timestamp(secs.saturating_mul(1_000_000))
    }

    pub fn micros(self) -> i64 {
        self.0
    }

    /// The first instant RFC 3339 can write: `0000-01-01T00:00:00.000000Z`.
    pub const RFC3339_MIN: Timestamp = Timestamp(-62_167_219_200_000_000);
    /// The last instant RFC 3339 can write: `9999-12-31T23:59:59.999999Z` (years have four
    /// digits).
    pub const RFC3339_MAX: Timestamp = Timestamp(253_402_300_799_999_999);

    /// Whether RFC 3339 can write this instant, so that [`parse_rfc3339`](Self::parse_rfc3339)
    /// reads back what [`Display`](fmt::Display) writes.
    pub fn is_rfc3339(self) -> bool {
        (Self::RFC3339_MIN..=Self::RFC3339_MAX).contains(&self)
    }

    /// `self - d`, saturating.
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_sub(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        )
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// Parses RFC 3339: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`t`/`z`/space accepted too).
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let b = s.as_bytes();
        if b.len() < 20 {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let part = b.get(r)?;
            if !part.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(part).ok()?.parse().ok()
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if b[4] != b'-'
            || b[7] != b'-'
            || !matches!(b[10], b'T' | b't' | b' ')
            || b[13] != b':'
            || b[16] != b':'
            || !(1..=12).contains(&month)
            || !(1..=days_in_month(year, month)).contains(&day)
            || hour > 23
            || min > 59
            || sec > 60
        {
            return None;
        }
        let mut i = 19;
        let mut micros = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                if i - start < 6 {
                    micros = micros * 10 + i64::from(b[i] - b'0');
                }
                i += 1;
            }
            let digits = i - start;
            if digits == 0 {
                return None;
            }
            for _ in digits..6 {
                micros *= 10;
            }
        }
        let offset_secs = match b.get(i..)? {
            [b'Z' | b'z'] => 0,
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
                let digits = [*h1, *h2, *m1, *m2];
                if !digits.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                let h = i64::from(h1 - b'0') * 10 + i64::from(h2 - b'0');
                let m = i64::from(m1 - b'0') * 10 + i64::from(m2 - b'0');
                if h > 23 || m > 59 {
                    return None;
                }
                let off = h * 3600 + m * 60;
                if *sign == b'+' {
                    off
                } else {
                    -off
                }
            }
            _ => return None,
        };
        let days = days_from_civil(year, month, day);
        let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_secs;
        Some(Timestamp(secs * 1_000_000 + micros))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX)),
        }
    }
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A duration rounded down to whole minutes for people: `45s`, `12m`, `1h`, `1h 5m`, `2d 3h`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (days, hours, mins) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
        let sod = secs.rem_euclid(86_400);
        write!(
            f,
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid RFC 3339 time {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn human_durations() {
        let d = Duration::from_secs;
        let shown: Vec<String> = [45, 720, 3600, 3900, 86_400, 97_200, 0]
            .into_iter()
            .map(|s| human_duration(d(s)))
            .collect();
        assert_eq!(shown, ["45s", "12m", "1h", "1h 5m", "1d", "1d 3h", "0s"]);
        assert_eq!(
            Timestamp::from_secs(10).since(Timestamp::from_secs(4)),
            d(6)
        );
        assert_eq!(
            Timestamp::from_secs(4).since(Timestamp::from_secs(10)),
            d(0)
        );
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            Timestamp::from_secs(951_782_400).to_string(),
            "2000-02-29T00:00:00.000000Z"
        );
        assert_eq!(
            Timestamp(1_700_000_000_123_456).to_string(),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(Timestamp(-1).to_string(), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn parses_variants() {
        let t = Timestamp(1_700_000_000_123_456);
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(t)
        );
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T22:13:20Z"),
            Some(Timestamp::from_secs(1_700_000_000))
        );
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T23:13:20.5+01:00"),
            Some(Timestamp(1_700_000_000_500_000))
        );
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T22:13:20.123456789Z"),
            Some(t),
            "nanoseconds are truncated to microseconds"
        );
        for bad in [
            "",
            "2023-11-14",
            "2023-13-14T22:13:20Z",
            "2023-02-29T00:00:00Z",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:13:20+1:00",
            "２023-11-14T22:13:20Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_rfc3339_range_ends_at_four_digit_years() {
        for t in [Timestamp::RFC3339_MIN, Timestamp::RFC3339_MAX] {
            assert!(t.is_rfc3339());
            assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Some(t));
        }
        assert_eq!(
            Timestamp::RFC3339_MIN.to_string(),
            "0000-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            Timestamp::RFC3339_MAX.to_string(),
            "9999-12-31T23:59:59.999999Z"
        );
        for t in [
            Timestamp(Timestamp::RFC3339_MIN.0 - 1),
            Timestamp(Timestamp::RFC3339_MAX.0 + 1),
        ] {
            assert!(!t.is_rfc3339());
            assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), None, "{t}");
        }
    }

    proptest! {
        #[test]
        fn round_trips(micros in -62_135_596_800_000_000i64..253_402_300_799_999_999i64) {
            let t = Timestamp(micros);
            prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Some(t));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = Timestamp::parse_rfc3339(&s);
        }
    }
}
