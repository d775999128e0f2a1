//! Path patterns such as `/buckets/{bucket}/objects/{object*}`: parsed once at
//! config time, matched against canonical paths to give a key its captures.

/// A path pattern such as `/buckets/{bucket}/objects/{object*}`.
///
/// `{name}` captures one non-empty segment; `{name*}` (last only) captures the
/// non-empty rest of the path, slashes included. Everything else is literal.
#[derive(Debug, Clone)]
pub struct PathPattern {
    source: String,
    segments: Vec<PatternSegment>,
    literal_prefix: String,
}

/// Why a `pattern` was refused; each variant keeps the pattern as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("'{0}' must start with '/'")]
    Relative(String),
    /// A capture whose name (here without its braces) is not letters, digits and '_'.
    #[error("'{pattern}': '{{{capture}}}' needs a name of letters, digits and '_'")]
    BadName { pattern: String, capture: String },
    #[error("'{pattern}': '{{{name}}}' is captured twice")]
    Twice { pattern: String, name: String },
    /// A `{name*}` rest before the last segment.
    #[error("'{pattern}': '{{{name}*}}' must be the last segment")]
    RestNotLast { pattern: String, name: String },
    /// A segment with braces that is not one whole capture, such as `x{a}`.
    #[error("'{pattern}': segment '{segment}' must be all literal or one whole {{name}}")]
    MixedSegment { pattern: String, segment: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PatternSegment {
    Literal(String),
    Capture(String),
    Rest(String),
}

impl PathPattern {
    /// Parses a pattern; the error says what to fix.
    pub fn parse(text: &str) -> Result<PathPattern, PatternError> {
        let pattern = || text.to_string();
        let Some(body) = text.strip_prefix('/') else {
            return Err(PatternError::Relative(pattern()));
        };
        let parts: Vec<&str> = body.split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        let mut names: Vec<&str> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let seg = if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let (name, rest) = match inner.strip_suffix('*') {
                    Some(n) => (n, true),
                    None => (inner, false),
                };
                if !is_identifier(name) {
                    return Err(PatternError::BadName { pattern: pattern(), capture: inner.to_string() });
                }
                if names.contains(&name) {
                    return Err(PatternError::Twice { pattern: pattern(), name: name.to_string() });
                }
                names.push(name);
                if rest && i + 1 != parts.len() {
                    return Err(PatternError::RestNotLast { pattern: pattern(), name: name.to_string() });
                }
                if rest {
                    PatternSegment::Rest(name.to_string())
                } else {
                    PatternSegment::Capture(name.to_string())
                }
            } else if part.contains('{') || part.contains('}') {
                return Err(PatternError::MixedSegment { pattern: pattern(), segment: part.to_string() });
            } else {
                PatternSegment::Literal(part.to_string())
            };
            segments.push(seg);
        }
        let mut literal_prefix = String::from("/");
        for seg in &segments {
            match seg {
                PatternSegment::Literal(l) => {
                    literal_prefix.push_str(l);
                    literal_prefix.push('/');
                }
                _ => break,
            }
        }
        if matches!(segments.last(), Some(PatternSegment::Literal(_))) {
            literal_prefix.pop();
        }
        Ok(PathPattern { source: text.to_string(), segments, literal_prefix })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The literal text every matching path starts with.
    pub fn literal_prefix(&self) -> &str {
        &self.literal_prefix
    }

    /// Where capture `name` sits among the captures, if the pattern has it,
    /// and whether it is the `{name*}` rest (which may hold `/`).
    pub(super) fn capture_index(&self, name: &str) -> Option<(usize, bool)> {
        self.segments.iter().filter(|s| !matches!(s, PatternSegment::Literal(_))).enumerate().find_map(|(i, s)| match s
        {
            PatternSegment::Capture(n) if n == name => Some((i, false)),
            PatternSegment::Rest(n) if n == name => Some((i, true)),
            _ => None,
        })
    }

    /// The captured values in pattern order, or `None` when `path` does not match.
    pub fn captures<'p>(&self, path: &'p str) -> Option<Vec<&'p str>> {
        let mut rest = path.strip_prefix('/')?;
        let mut out = Vec::new();
        for (i, seg) in self.segments.iter().enumerate() {
            let last = i + 1 == self.segments.len();
            let (part, tail) = match seg {
                PatternSegment::Rest(_) => (rest, ""),
                _ => match rest.find('/') {
                    Some(at) if !last => (&rest[..at], &rest[at + 1..]),
                    Some(_) => return None,
                    None if last => (rest, ""),
                    None => return None,
                },
            };
            match seg {
                PatternSegment::Literal(l) if l == part => {}
                PatternSegment::Literal(_) => return None,
                _ if part.is_empty() => return None,
                _ => out.push(part),
            }
            rest = tail;
        }
        Some(out)
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_parse_and_match() {
        let refused = |text: &str| PathPattern::parse(text).unwrap_err();
        assert_eq!(refused("buckets/{b}"), PatternError::Relative("buckets/{b}".into()));
        assert_eq!(refused("/{rest*}/x").to_string(), "'/{rest*}/x': '{rest*}' must be the last segment");
        assert_eq!(refused("/{a}/{a}").to_string(), "'/{a}/{a}': '{a}' is captured twice");
        assert_eq!(refused("/x{a}").to_string(), "'/x{a}': segment 'x{a}' must be all literal or one whole {name}");
        assert_eq!(refused("/{a-b*}").to_string(), "'/{a-b*}': '{a-b*}' needs a name of letters, digits and '_'");
        let p = PathPattern::parse("/buckets/{bucket}/objects/{object*}").unwrap();
        assert_eq!(p.literal_prefix(), "/buckets/");
        assert_eq!(p.captures("/buckets/b/objects/o/p"), Some(vec!["b", "o/p"]));
        assert_eq!(p.captures("/buckets/b/object/o"), None);
        let p = PathPattern::parse("/a/{x}").unwrap();
        assert_eq!(p.captures("/a/1"), Some(vec!["1"]));
        assert_eq!(p.captures("/a/1/2"), None);
        assert_eq!(PathPattern::parse("/a/b").unwrap().literal_prefix(), "/a/b");
    }
}
