//! Signed fencing tokens: HMAC-SHA256 over the fence key and the token.
//!
//! Without signatures any client that can reach fencegate can send token
//! `18446744073709551615` and fence a key forever. With a route `signing_key_file`,
//! only a holder of the shared key (the lock service, or the code that takes the
//! lock) can produce a token fencegate accepts.
//!
//! # The signed message
//!
//! The MAC is HMAC-SHA256 (RFC 2104) keyed with the bytes of the route's key file
//! (trailing ASCII whitespace removed), over exactly these bytes:
//!
//! ```text
//! <fence key, UTF-8> 0x0A <token, base-10 ASCII, no sign, no leading zeros>
//! ```
//!
//! - The *fence key* is the key fencegate makes for the request with the route's
//!   `key` template: the same string the fence API and the `key` field of problem
//!   documents show. With the default `{path}` template it is the request path
//!   as sent on the wire, without the query string and without percent-decoding
//!   (`/objects/a%20b` stays `/objects/a%20b`). Keys render injectively
//!   (see [`KeyTemplate`](crate::config::KeyTemplate)): a value holding the
//!   template's separator has it escaped, so a signature binds one resource
//!   (with `{header.x-tenant}:{path}`, tenant `a:b` writing `/c` signs
//!   `a%3Ab:/c`).
//! - The *token* is written canonically: `7`, never `0007` or `+7`; `0` is `0`. A
//!   request may send `X-Fencing-Token: 0007` and the signature of `7`: both name
//!   the same token, so they sign the same.
//!
//! The signature travels in the request header
//!
//! ```text
//! X-Fencing-Signature: <base64url (RFC 4648 §5) of the 32-byte MAC, no padding>
//! ```
//!
//! that is 43 characters from `A-Z a-z 0-9 - _`. The padded 44-character form
//! (one trailing `=`) is accepted too, since several standard encoders pad by
//! default; anything else (the standard `+ /` alphabet, spaces, a second header,
//! a non-canonical last character) is refused.
//!
//! ```
//! use fencegate::fence::signature::{sign, verify, SignatureError};
//! let key = b"fencegate-test-key-0123456789";
//! let sig = sign(key, "/objects/a", 42);
//! assert_eq!(sig, "rvCzehKNJjuEfeksZGzt9Bx4sT5HWU9mi8Uh8wWkaE0");
//! assert_eq!(verify(key, "/objects/a", 42, sig.as_bytes()), Ok(()));
//! assert_eq!(verify(key, "/objects/a", 43, sig.as_bytes()), Err(SignatureError::Wrong));
//! ```
//!
//! Verification compares MACs in constant time (`hmac`'s `verify_slice`), so the
//! time a refusal takes says nothing about how close a forged signature came.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

pub use crate::config::SigningKey;

/// The request header that carries the signature.
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-fencing-signature");

/// Length of the MAC in bytes (SHA-256).
const MAC_LEN: usize = 32;
/// Length of the unpadded base64url encoding of the MAC.
const ENCODED_LEN: usize = 43;

/// Checks the signature in header `name` for `token` on `fence_key` with
/// `key`: exactly one, and right. An unread key verifies nothing.
pub fn verify_header(
    key: &SigningKey,
    fence_key: &str,
    token: u64,
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<(), SignatureError> {
    let signature = one_header(headers, name)?;
    match key.bytes() {
        Some(key) => verify(key, fence_key, token, signature.as_bytes()),
        None => Err(SignatureError::Wrong),
    }
}

/// Why a signature was refused (the request gets a 403 `bad-signature`).
///
/// Its `Display` is the word the problem document's detail ends with ("the
/// token signature is missing"), so the variants' texts are part of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing")]
    Missing,
    #[error("repeated")]
    Repeated,
    /// Undecodable, or a well-formed MAC of some other key, token or secret.
    #[error("wrong")]
    Wrong,
}

/// The MAC state over the signed message of `fence_key` and `token`.
fn mac(key: &[u8], fence_key: &str, token: u64) -> Hmac<Sha256> {
    // HMAC hashes a key longer than a block and pads a shorter one, so every
    // length is valid: this cannot fail.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(fence_key.as_bytes());
    mac.update(b"\n");
    // u64's Display is the canonical form: base-10, no sign, no leading zeros.
    mac.update(token.to_string().as_bytes());
    mac
}

/// The `X-Fencing-Signature` value for `token` on `fence_key`: base64url without
/// padding of HMAC-SHA256(`key`, fence key ‖ `\n` ‖ token).
pub fn sign(key: &[u8], fence_key: &str, token: u64) -> String {
    URL_SAFE_NO_PAD.encode(mac(key, fence_key, token).finalize().into_bytes())
}

/// Checks one `X-Fencing-Signature` value, in constant time once decoded.
///
/// Accepts the 43-character unpadded base64url form, or the same with one `=`.
pub fn verify(key: &[u8], fence_key: &str, token: u64, header_value: &[u8]) -> Result<(), SignatureError> {
    let encoded = match header_value {
        [head @ .., b'='] if head.len() == ENCODED_LEN => head,
        value if value.len() == ENCODED_LEN => value,
        _ => return Err(SignatureError::Wrong),
    };
    let mut tag = [0u8; MAC_LEN];
    // The engine refuses other alphabets, padding inside and non-zero trailing
    // bits in the last character, so each MAC has exactly one accepted spelling
    // (plus the padded one).
    match URL_SAFE_NO_PAD.decode_slice(encoded, &mut tag) {
        Ok(MAC_LEN) => {}
        _ => return Err(SignatureError::Wrong),
    }
    mac(key, fence_key, token).verify_slice(&tag).map_err(|_| SignatureError::Wrong)
}

/// The one value of the signature header `name`: missing or repeated is refused.
fn one_header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h HeaderValue, SignatureError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(SignatureError::Missing);
    };
    if values.next().is_some() {
        return Err(SignatureError::Repeated);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"fencegate-test-key-0123456789";

    /// Computed outside Rust, so the wire format is pinned:
    /// `python3 -c 'import hmac,hashlib,base64; print(base64.urlsafe_b64encode(hmac.new(
    /// b"fencegate-test-key-0123456789", b"/objects/a\n42", hashlib.sha256).digest()).rstrip(b"=").decode())'`
    /// and the same with `openssl dgst -sha256 -hmac ... -binary | base64 | tr '+/' '-_' | tr -d =`.
    const VECTORS: [(&str, u64, &str); 3] = [
        ("/objects/a", 42, "rvCzehKNJjuEfeksZGzt9Bx4sT5HWU9mi8Uh8wWkaE0"),
        ("/objects/a", u64::MAX, "Ah-rShZgvwA599rnX0EHI4-dWf1ZXs9TRhlVPWtC89M"),
        ("tenant=acme:/x", 0, "BlLhHsWBffY3DHNFw8q5WkeD5cnm_T4e0wc7ejgdIrc"),
    ];

    #[test]
    fn matches_independently_computed_vectors() {
        for (fence_key, token, expected) in VECTORS {
            assert_eq!(sign(KEY, fence_key, token), expected, "{fence_key} {token}");
            assert_eq!(verify(KEY, fence_key, token, expected.as_bytes()), Ok(()));
        }
    }

    #[test]
    fn accepts_the_padded_form_too() {
        let padded = format!("{}=", VECTORS[0].2);
        assert_eq!(verify(KEY, "/objects/a", 42, padded.as_bytes()), Ok(()));
        let twice = format!("{}==", VECTORS[0].2);
        assert_eq!(verify(KEY, "/objects/a", 42, twice.as_bytes()), Err(SignatureError::Wrong));
    }

    #[test]
    fn refuses_another_key_token_or_secret() {
        let sig = sign(KEY, "/objects/a", 42);
        assert_eq!(verify(KEY, "/objects/b", 42, sig.as_bytes()), Err(SignatureError::Wrong));
        assert_eq!(verify(KEY, "/objects/a", 41, sig.as_bytes()), Err(SignatureError::Wrong));
        assert_eq!(
            verify(b"another-secret-of-some-length", "/objects/a", 42, sig.as_bytes()),
            Err(SignatureError::Wrong)
        );
        // The newline separates key and token: "/a" + "12" and "/a1" + "2" differ.
        assert_ne!(sign(KEY, "/a", 12), sign(KEY, "/a1", 2));
    }

    #[test]
    fn refuses_every_other_spelling() {
        let sig = VECTORS[0].2;
        let cases = [
            String::new(),
            sig[..42].to_string(),
            format!("{sig}A"),
            format!(" {sig}"),
            format!("{sig} "),
            sig.to_lowercase(),
            hex(&URL_SAFE_NO_PAD.decode(sig).unwrap()),
        ];
        for bad in &cases {
            assert_eq!(verify(KEY, "/objects/a", 42, bad.as_bytes()), Err(SignatureError::Wrong), "{bad:?}");
        }
        // The standard alphabet spells '-' and '_' as '+' and '/': not base64url.
        let (fence_key, token, sig) = VECTORS[1];
        let standard_alphabet = sig.replace('-', "+").replace('_', "/");
        assert_ne!(standard_alphabet, sig);
        assert_eq!(verify(KEY, fence_key, token, standard_alphabet.as_bytes()), Err(SignatureError::Wrong));
        // The last character carries 2 unused bits; only the spelling with them zero is accepted.
        let sig = VECTORS[0].2;
        let last = sig.as_bytes()[ENCODED_LEN - 1];
        assert_eq!(last, b'0');
        let sloppy = format!("{}1", &sig[..ENCODED_LEN - 1]);
        assert_eq!(verify(KEY, "/objects/a", 42, sloppy.as_bytes()), Err(SignatureError::Wrong));
    }

    #[test]
    fn reads_exactly_one_header() {
        let sig = sign(KEY, "/objects/a", 42);
        let mut h = HeaderMap::new();
        let key = SigningKey::new(KEY);
        assert_eq!(verify_header(&key, "/objects/a", 42, &h, &SIGNATURE_HEADER), Err(SignatureError::Missing));
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&sig).unwrap());
        assert_eq!(verify_header(&key, "/objects/a", 42, &h, &SIGNATURE_HEADER), Ok(()));
        h.append(SIGNATURE_HEADER, HeaderValue::from_str(&sig).unwrap());
        assert_eq!(verify_header(&key, "/objects/a", 42, &h, &SIGNATURE_HEADER), Err(SignatureError::Repeated));
    }

    #[test]
    fn an_unread_key_verifies_nothing() {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(&sign(b"", "/objects/a", 42)).unwrap());
        let unread = SigningKey::unread();
        assert_eq!(verify_header(&unread, "/objects/a", 42, &h, &SIGNATURE_HEADER), Err(SignatureError::Wrong));
    }

    #[test]
    fn refusals_read_as_the_problem_detail_always_did() {
        let detail = |e: SignatureError| crate::stack::error::ProxyError::from(e).to_string();
        assert_eq!(detail(SignatureError::Missing), "the token signature is missing");
        assert_eq!(detail(SignatureError::Repeated), "the token signature is repeated");
        assert_eq!(detail(SignatureError::Wrong), "the token signature is wrong");
        assert_eq!(format!("{:?}", SigningKey::new(KEY)), "SigningKey(..)");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
