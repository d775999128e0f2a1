//! Byte sizes as a config file writes them: a whole number of bytes
//! (`max_header_bytes = 16384`) or a string with a unit (`"64KiB"`, `"16MB"`).
//!
//! `KB` means 1000 and `KiB` 1024, as everywhere else, and a size too large
//! for 64 bits is an error, not a wrap. The units are the ones fencegate has
//! always read, written exactly: a size-parsing crate would also take `16mb`,
//! `1.5MiB` or `16Mbit`, and in a limit a guess at what a typo meant is worse
//! than an error naming the field, so with the grammar pinned there is
//! nothing left for one to do but a multiplication.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A size field as written, before validation reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Size {
    /// A TOML integer: that many bytes.
    Bytes(u64),
    /// A TOML integer below zero, kept so validation can name the field.
    Negative(i64),
    /// A TOML string: a number with an optional unit.
    Text(String),
}

/// Why a size field holds no number of bytes (the caller adds the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// A TOML integer below zero.
    #[error("{0} is negative; a size is a number of bytes (e.g. 65536 or \"64KiB\")")]
    Negative(i64),
    /// A string [`parse_size`] does not read: an unknown unit, or past `u64::MAX`.
    #[error("'{0}' is not a size like \"16MiB\", \"512KiB\" or \"1048576\"")]
    NotASize(String),
}

impl Size {
    /// The number of bytes, or what is wrong with the value.
    pub(super) fn bytes(&self) -> Result<u64, SizeError> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Negative(n) => Err(SizeError::Negative(*n)),
            Size::Text(text) => parse_size(text).ok_or_else(|| SizeError::NotASize(text.clone())),
        }
    }
}

/// Parses a byte size: a whole number with an optional unit `B`, `KB`/`KiB`,
/// `MB`/`MiB` or `GB`/`GiB`, written exactly so, whitespace between allowed.
/// `None` for anything else, or a size past `u64::MAX`.
///
/// ```
/// use fencegate::config::parse_size;
/// assert_eq!(parse_size("64KiB"), Some(65_536));
/// assert_eq!(parse_size("10 MB"), Some(10_000_000));
/// assert_eq!(parse_size("16mb"), None);
/// assert_eq!(parse_size("lots"), None);
/// ```
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        struct SizeVisitor;

        impl Visitor<'_> for SizeVisitor {
            type Value = Size;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a whole number of bytes like 65536 or a string like \"64KiB\"")
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                Ok(u64::try_from(n).map_or(Size::Negative(n), Size::Bytes))
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size::Bytes(n))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Size, E> {
                Ok(Size::Text(text.to_string()))
            }
        }

        deserializer.deserialize_any(SizeVisitor)
    }
}

/// As written: an integer stays an integer (a string when past what a TOML
/// integer holds, which [`parse_size`] reads back), a string a string.
impl Serialize for Size {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Size::Bytes(n) => match i64::try_from(*n) {
                Ok(n) => serializer.serialize_i64(n),
                Err(_) => serializer.serialize_str(&n.to_string()),
            },
            Size::Negative(n) => serializer.serialize_i64(*n),
            Size::Text(text) => serializer.serialize_str(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(toml_value: &str) -> Size {
        #[derive(Deserialize)]
        struct One {
            size: Size,
        }
        toml::from_str::<One>(&format!("size = {toml_value}")).unwrap().size
    }

    #[test]
    fn an_integer_is_that_many_bytes() {
        assert_eq!(size("16384").bytes(), Ok(16_384));
        assert_eq!(size("0").bytes(), Ok(0));
        assert_eq!(size("9223372036854775807").bytes(), Ok(i64::MAX as u64));
    }

    #[test]
    fn a_negative_integer_is_refused() {
        let e = size("-1").bytes().unwrap_err();
        assert_eq!(e, SizeError::Negative(-1));
        assert_eq!(e.to_string(), "-1 is negative; a size is a number of bytes (e.g. 65536 or \"64KiB\")");
    }

    #[test]
    fn a_string_takes_every_unit_spelling_accepted_before() {
        for (text, want) in [
            ("1048576", 1 << 20),
            ("5B", 5),
            ("1KB", 1000),
            ("1KiB", 1 << 10),
            ("16MB", 16_000_000),
            ("16MiB", 16 << 20),
            ("2GB", 2_000_000_000),
            ("2GiB", 2 << 30),
            ("10 MB", 10_000_000),
            (" 64KiB ", 64 << 10),
            ("10\tKB", 10_000),
            ("10\u{3000}KB", 10_000),
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615B", u64::MAX),
            ("17179869183GiB", 17_179_869_183 << 30),
        ] {
            assert_eq!(parse_size(text), Some(want), "{text:?}");
            assert_eq!(size(&toml::Value::String(text.into()).to_string()).bytes(), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn a_bad_string_is_refused() {
        for bad in [
            "",
            "MiB",
            "-1",
            "+5",
            "16XB",
            "5BB",
            "5 iB",
            "5\u{0661}",
            "1.5MiB",
            "16mib",
            "64kb",
            "16Mbit",
            "5b",
            "18446744073709551616",
            "17179869184GiB",
            "99999999999999999999GiB",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
        let e = size("\"lots\"").bytes().unwrap_err();
        assert_eq!(e, SizeError::NotASize("lots".into()));
        assert_eq!(e.to_string(), "'lots' is not a size like \"16MiB\", \"512KiB\" or \"1048576\"");
    }

    #[test]
    fn a_value_of_another_type_is_a_parse_error_that_says_what_fits() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct One {
            size: Size,
        }
        let msg = toml::from_str::<One>("size = 1.5").unwrap_err().to_string();
        assert!(msg.contains("a whole number of bytes"), "{msg}");
    }
}
