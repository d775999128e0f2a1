//! One query parameter, form-decoded, as a fence key reads it.

use std::borrow::Cow;

/// Why a query parameter cannot be read (the request gets a 400 `bad-key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the query parameter appears more than once (after decoding its name)")]
    Repeated,
}

/// The value of the query parameter `name`, decoded the way web frameworks
/// decode it (`application/x-www-form-urlencoded`: pairs separated by `&`,
/// name and value split at the first `=`, `+` is a space, `%XX` is a byte,
/// invalid UTF-8 becomes U+FFFD), so the key sees what the upstream's handler
/// sees.
///
/// `query` is the query string without its `?`. Names are decoded before they
/// are compared with `name` (which is taken as already decoded): `i%64=7`
/// is a parameter `id`. `Ok(None)` when no parameter has that name; a name
/// without `=` has the value `""`. `Err(Repeated)` when the decoded name occurs
/// more than once, whatever the values, because frameworks differ on which one
/// they use.
///
/// ```
/// use fencegate::canonical::{query_param, QueryError};
///
/// assert_eq!(query_param("id=%37&x=1", "id").unwrap().as_deref(), Some("7"));
/// assert_eq!(query_param("id=a+b", "id").unwrap().as_deref(), Some("a b"));
/// assert_eq!(query_param("i%64=7&id=fresh", "id"), Err(QueryError::Repeated));
/// assert_eq!(query_param("idx=1", "id"), Ok(None));
/// ```
pub fn query_param<'q>(query: &'q str, name: &str) -> Result<Option<Cow<'q, str>>, QueryError> {
    let mut found = None;
    for (n, value) in form_urlencoded::parse(query.as_bytes()) {
        if n == name && found.replace(value).is_some() {
            return Err(QueryError::Repeated);
        }
    }
    Ok(found)
}
