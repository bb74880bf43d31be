//! Turning command-line and stdin text into key and value bytes and back: UTF-8 text
//! by default, hex with `--hex`.

use super::error::CliError;

/// How keys and values are read from arguments and stdin and printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8 text, passed through as bytes (output is printed raw).
    Text,
    /// Hex digits, two per byte (upper or lower case on input, lower case on output).
    Hex,
}

impl Encoding {
    /// Parses a key or value given as a command-line argument; bad hex is a usage error.
    pub fn decode_arg(self, what: &str, s: &str) -> Result<Vec<u8>, CliError> {
        self.decode(s.as_bytes())
            .map_err(|e| CliError::usage(format!("invalid {what} {s:?}: {e}")))
    }

    /// Parses a key or value field. In text mode the bytes are taken as they are
    /// (the caller has checked they are UTF-8).
    pub fn decode(self, s: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Encoding::Text => Ok(s.to_vec()),
            Encoding::Hex => from_hex(s),
        }
    }

    /// Renders key or value bytes for output: raw bytes in text mode, hex digits in
    /// hex mode.
    pub fn encode<'a>(self, b: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        match self {
            Encoding::Text => std::borrow::Cow::Borrowed(b),
            Encoding::Hex => std::borrow::Cow::Owned(to_hex(b).into_bytes()),
        }
    }

    /// Renders bytes as a JSON string: hex in hex mode, else UTF-8 text (bytes that
    /// are not valid UTF-8 become U+FFFD; use `--hex` for binary data).
    pub fn json_string(self, b: &[u8]) -> String {
        match self {
            Encoding::Text => String::from_utf8_lossy(b).into_owned(),
            Encoding::Hex => to_hex(b),
        }
    }

    /// Renders a key for a one-line message (quoted, escaped).
    pub fn show(self, b: &[u8]) -> String {
        format!("{:?}", self.json_string(b))
    }
}

/// Lower-case hex digits of `b`.
pub fn to_hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

/// Parses hex digits (either case) into bytes.
pub fn from_hex(s: &[u8]) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", s.len()));
    }
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    s.chunks(2)
        .enumerate()
        .map(|(i, pair)| match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err(format!(
                "not a hex digit pair at offset {}: {:?}",
                i * 2,
                String::from_utf8_lossy(pair)
            )),
        })
        .collect()
}

/// A byte count for people: "512 B", "1.5 KiB", "12.3 MiB".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A time in milliseconds since the Unix epoch as a UTC date and time for people:
/// "2025-06-01 14:03:09 UTC".
pub fn human_time_utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(to_hex(&b).as_bytes()).unwrap(), b);
        assert_eq!(from_hex(b"ABcd").unwrap(), vec![0xab, 0xcd]);
        assert!(from_hex(b"abc").is_err());
        assert!(from_hex(b"zz").is_err());
        assert_eq!(from_hex(b"").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12_900_000), "12.3 MiB");
    }

    #[test]
    fn times() {
        assert_eq!(human_time_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(human_time_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(human_time_utc(1_709_251_199_999), "2024-02-29 23:59:59 UTC");
        assert_eq!(human_time_utc(1_735_689_600_000), "2025-01-01 00:00:00 UTC");
        assert_eq!(human_time_utc(4_102_444_800_000), "2100-01-01 00:00:00 UTC");
    }
}
