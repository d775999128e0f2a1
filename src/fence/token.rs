//! Strict fencing-token parsing.
//!
//! A token is a base-10 `u64` written with ASCII digits only. Anything a lenient
//! parser might accept (`+5`, ` 5`, `0x5`, `5.0`, an empty value, a number past
//! `u64::MAX`) is refused, because two parsers that disagree on a token's value
//! would let a stale write through.

use http::{HeaderMap, HeaderName};

/// Why a token header was refused (the request gets a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token must be base-10 ASCII digits only")]
    NotDigits,
    #[error("the token is larger than 18446744073709551615")]
    Overflow,
    #[error("the token header appears more than once")]
    Repeated,
}

/// Parses one token value: ASCII digits, `0 ..= u64::MAX`.
///
/// ```
/// use fencegate::fence::token::{parse_token, TokenError};
/// assert_eq!(parse_token(b"42"), Ok(42));
/// assert_eq!(parse_token(b"+42"), Err(TokenError::NotDigits));
/// assert_eq!(parse_token(b"18446744073709551616"), Err(TokenError::Overflow));
/// ```
pub fn parse_token(value: &[u8]) -> Result<u64, TokenError> {
    // The common case, checked eight digits at a time: 1 to 19 ASCII digits,
    // which always fit a u64. Anything else takes the byte-by-byte path.
    if (1..=19).contains(&value.len()) {
        if let Some(n) = parse_short(value) {
            return Ok(n);
        }
    }
    parse_slow(value)
}

/// 1 to 19 bytes, all ASCII digits: their value. `None` for anything else.
fn parse_short(value: &[u8]) -> Option<u64> {
    let len = value.len();
    if len < 8 {
        return value.iter().try_fold(0, |n, &b| b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0')));
    }
    let word = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("eight bytes"));
    let mut n = eight_digits(word(0))?;
    let mut done = 8;
    if len >= 16 {
        n = n * 100_000_000 + eight_digits(word(8))?;
        done = 16;
    }
    let rest = len - done;
    if rest > 0 {
        // The last eight bytes, with the ones already counted read as zeros.
        let counted = 8 * (8 - rest) as u32;
        let mask = (1u64 << counted) - 1;
        let tail = (word(len - 8) & !mask) | (0x3030_3030_3030_3030 & mask);
        n = n * 10u64.pow(rest as u32) + eight_digits(tail)?;
    }
    Some(n)
}

/// The value of eight ASCII digits read little-endian into `word`, or `None`
/// if any byte is not a digit.
fn eight_digits(word: u64) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    // Every byte is 0x30..=0x39: its high nibble is 3, and adding 6 keeps it 3.
    if word & HIGH != ZEROS || (word.wrapping_add(0x0606_0606_0606_0606) & HIGH) != ZEROS {
        return None;
    }
    let d = word - ZEROS;
    let d = (d.wrapping_mul(10) + (d >> 8)) & 0x00FF_00FF_00FF_00FF;
    let d = (d.wrapping_mul(100) + (d >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some((d.wrapping_mul(10_000) + (d >> 32)) & 0xFFFF_FFFF)
}

/// Byte by byte, for everything `parse_short` does not take: empty values, 20
/// digits or more, and every malformed value.
fn parse_slow(value: &[u8]) -> Result<u64, TokenError> {
    if value.is_empty() {
        return Err(TokenError::Empty);
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return Err(TokenError::NotDigits);
        }
        // Digits that overflow are reported as such even if a non-digit follows.
        n = n.checked_mul(10).and_then(|n| n.checked_add(u64::from(b - b'0'))).ok_or(TokenError::Overflow)?;
    }
    Ok(n)
}

/// The token a request carries in `header`: `None` when absent, an error when
/// malformed or when the header appears more than once.
pub fn token_from_headers(headers: &HeaderMap, header: &HeaderName) -> Result<Option<u64>, TokenError> {
    let mut values = headers.get_all(header).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(TokenError::Repeated);
    }
    parse_token(first.as_bytes()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn accepts_the_whole_u64_range() {
        assert_eq!(parse_token(b"0"), Ok(0));
        assert_eq!(parse_token(b"7"), Ok(7));
        assert_eq!(parse_token(b"0007"), Ok(7));
        assert_eq!(parse_token(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_token(b"9999999999999999999"), Ok(9_999_999_999_999_999_999));
        // Leading zeros never overflow, however many there are.
        assert_eq!(parse_token(b"000000000000000000000042"), Ok(42));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in ["+1", "-1", " 1", "1 ", "1 2", "0x10", "1e3", "1.0", "١", "12a", "1,2", "\t1"] {
            assert_eq!(parse_token(bad.as_bytes()), Err(TokenError::NotDigits), "{bad:?}");
        }
        assert_eq!(parse_token(b""), Err(TokenError::Empty));
        assert_eq!(parse_token(b"18446744073709551616"), Err(TokenError::Overflow));
        assert_eq!(parse_token(b"99999999999999999999999"), Err(TokenError::Overflow));
    }

    #[test]
    fn the_fast_path_agrees_with_the_byte_by_byte_one() {
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for len in 1..=21 {
            cases.push(b"9".repeat(len));
            cases.push(b"0".repeat(len));
            cases.push((0..len).map(|i| b'0' + (i * 7 % 10) as u8).collect());
            for bad in [b'/', b':', b' ', b'a', 0x00, 0xB9, 0xF9] {
                for at in 0..len {
                    let mut v: Vec<u8> = (0..len).map(|i| b'1' + (i % 9) as u8).collect();
                    v[at] = bad;
                    cases.push(v);
                }
            }
        }
        for case in cases {
            assert_eq!(parse_token(&case), parse_slow(&case), "{:?}", String::from_utf8_lossy(&case));
        }
    }

    #[test]
    fn reads_one_header_and_refuses_two() {
        let name = HeaderName::from_static("x-fencing-token");
        let mut h = HeaderMap::new();
        assert_eq!(token_from_headers(&h, &name), Ok(None));
        h.insert(&name, HeaderValue::from_static("5"));
        assert_eq!(token_from_headers(&h, &name), Ok(Some(5)));
        h.append(&name, HeaderValue::from_static("5"));
        assert_eq!(token_from_headers(&h, &name), Err(TokenError::Repeated));
    }
}
