//! Event and status timestamps: instants at microsecond precision, written as RFC 3339 in UTC
//! with exactly six fractional digits (`2024-05-01T12:34:56.123456Z`).
//!
//! The calendar (reading and writing dates) is jiff's. This thin wrapper stays because of what
//! jiff's own `Timestamp` does not pin down for us:
//! - the text: jiff prints as few fractional digits as it needs, while events, status records and
//!   `report` output always carry six (golden files and consumers rely on the fixed width);
//! - the precision: an instant is a whole number of microseconds, so one that is written and read
//!   back compares equal (episodes are keyed on `monitored_since`);
//! - the range: RFC 3339 years have four digits, up to `9999-12-31T23:59:59.999999Z`, past
//!   `jiff::Timestamp::MAX` (which leaves room for any UTC offset); so instants go through jiff's
//!   civil `DateTime`, whose range covers all of RFC 3339's.

use std::fmt;
use std::time::{Duration, SystemTime};

use jiff::civil::DateTime;
use jiff::fmt::temporal::Pieces;
use jiff::SignedDuration;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The Unix epoch as a UTC civil date-time: instants are offsets from it.
const EPOCH: DateTime = jiff::civil::datetime(1970, 1, 1, 0, 0, 0, 0);

/// Microseconds since the Unix epoch (UTC). Ordered, cheap to copy, and (de)serialized as an
/// RFC 3339 string such as `2024-05-01T12:34:56.123456Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn now() -> Timestamp {
        Timestamp::from(jiff::Timestamp::now())
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

    /// This instant as jiff's, when jiff can hold it (every instant of years 0000 to 9998 and
    /// most of 9999; see the module documentation).
    pub fn to_jiff(self) -> Option<jiff::Timestamp> {
        jiff::Timestamp::from_microsecond(self.0).ok()
    }

    /// The UTC date and time of this instant, when RFC 3339 can write it.
    pub fn to_utc_datetime(self) -> Option<DateTime> {
        if !self.is_rfc3339() {
            return None;
        }
        EPOCH.checked_add(SignedDuration::from_micros(self.0)).ok()
    }

    /// Parses RFC 3339: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`t`/`z`/space accepted too),
    /// with jiff's Temporal (ISO 8601) parser. A date, a time and a UTC offset are required;
    /// a bracketed time zone annotation is refused, as RFC 3339 has none. Digits past the
    /// microsecond are truncated.
    ///
    /// jiff also reads the other ISO 8601 spellings of the same thing (`20231114T221320Z`,
    /// `,5` fractions, `+01` or `+0100` offsets, seconds left out, signed six-digit years), and
    /// refuses fractions of more than nine digits. A leap second (`:60`) reads as `:59`.
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let pieces = Pieces::parse(s).ok()?;
        if pieces.time_zone_annotation().is_some() {
            return None;
        }
        let local = pieces.date().to_datetime(pieces.time()?);
        let offset = pieces.to_numeric_offset()?;
        let utc = local.duration_since(EPOCH) - SignedDuration::from_secs(offset.seconds().into());
        // Floor, not jiff's truncation toward zero: a fraction before 1970 stays inside its
        // microsecond, as after it.
        i64::try_from(utc.as_nanos().div_euclid(1000))
            .ok()
            .map(Timestamp)
    }
}

impl From<jiff::Timestamp> for Timestamp {
    /// Truncates to the microsecond (toward zero, as [`From<SystemTime>`] does).
    fn from(t: jiff::Timestamp) -> Timestamp {
        Timestamp(t.as_microsecond())
    }
}

impl From<SystemTime> for Timestamp {
    /// Kept apart from jiff's conversion, which refuses instants outside its range: an
    /// out-of-range kernel timestamp must stay out of range ([`Timestamp::is_rfc3339`] false)
    /// for the caller to fall back to its own clock.
    fn from(t: SystemTime) -> Timestamp {
        match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX)),
        }
    }
}

/// A duration rounded down to whole minutes for people: `45s`, `12m`, `1h`, `1h 5m`, `2d 3h`.
///
/// Not a calendar computation (days are 24 hours) and shorter than jiff's friendly printer
/// configured to drop minutes beside days.
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
    /// RFC 3339 for every instant it can write. One outside years 0000 to 9999 (only ever made
    /// from a bad clock or a test) is written as `unix+<micros>us`, which no parser reads as a
    /// time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(dt) = self.to_utc_datetime() else {
            return write!(f, "unix{:+}us", self.0);
        };
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second(),
            dt.subsec_nanosecond() / 1000
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

    #[test]
    fn the_rfc3339_range_is_jiffs_civil_years_0000_to_9999() {
        let civil = |t: Timestamp| t.to_utc_datetime();
        assert_eq!(
            civil(Timestamp::RFC3339_MIN),
            Some(jiff::civil::datetime(0, 1, 1, 0, 0, 0, 0))
        );
        assert_eq!(
            civil(Timestamp::RFC3339_MAX),
            Some(jiff::civil::datetime(9999, 12, 31, 23, 59, 59, 999_999_000))
        );
        assert_eq!(civil(Timestamp(Timestamp::RFC3339_MAX.0 + 1)), None);
        assert_eq!(
            Timestamp::from(jiff::Timestamp::from_microsecond(1_700_000_000_123_456).unwrap()),
            Timestamp(1_700_000_000_123_456)
        );
        assert_eq!(
            Timestamp(1_700_000_000_123_456)
                .to_jiff()
                .map(|t| t.to_string()),
            Some("2023-11-14T22:13:20.123456Z".to_string())
        );
    }

    /// What jiff's ISO 8601 reading adds to, or changes in, the RFC 3339 one it replaced.
    #[test]
    fn iso8601_spellings_read_the_same_instant() {
        let t = Some(Timestamp::from_secs(1_700_000_000));
        for same in [
            "2023-11-14t22:13:20z",
            "2023-11-14 22:13:20Z",
            "20231114T221320Z",
            "2023-11-14T23:13:20+01",
            "2023-11-14T23:13:20+0100",
            "+002023-11-14T22:13:20Z",
            "2023-11-14T22:13:20,0Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(same), t, "{same}");
        }
        assert_eq!(
            Timestamp::parse_rfc3339("1969-12-31T23:59:59.9999999Z"),
            Some(Timestamp(-1)),
            "truncation is toward the past"
        );
        assert_eq!(
            Timestamp::parse_rfc3339("2016-12-31T23:59:60Z"),
            Timestamp::parse_rfc3339("2016-12-31T23:59:59Z"),
            "a leap second reads as the second before it"
        );
        for refused in [
            "2023-11-14T22:13:20Z[UTC]",
            "2023-11-14T22:13:20.1234567891Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(refused), None, "{refused}");
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
