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
    if value.is_empty() {
        return Err(TokenError::Empty);
    }
    let end = value.iter().position(|b| !b.is_ascii_digit()).unwrap_or(value.len());
    let (digits, rest) = value.split_at(end);
    let digit = |b: u8| u64::from(b - b'0');
    // Up to 19 digits always fit a u64: no overflow checks on the common path.
    let n = if digits.len() <= 19 {
        digits.iter().fold(0, |n, &b| n * 10 + digit(b))
    } else {
        digits.iter().try_fold(0u64, |n, &b| n.checked_mul(10)?.checked_add(digit(b))).ok_or(TokenError::Overflow)?
    };
    // Digits that overflow are reported as such even if a non-digit follows
    // (as a left-to-right reader would find them).
    if !rest.is_empty() {
        return Err(TokenError::NotDigits);
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
