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

#[derive(Debug, Clone, PartialEq, Eq)]
enum PatternSegment {
    Literal(String),
    Capture(String),
    Rest(String),
}

impl PathPattern {
    /// Parses a pattern; the error says what to fix.
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(body) = text.strip_prefix('/') else {
            return Err(format!("'{text}' must start with '/'"));
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
                    return Err(format!("'{text}': '{{{inner}}}' needs a name of letters, digits and '_'"));
                }
                if names.contains(&name) {
                    return Err(format!("'{text}': '{{{name}}}' is captured twice"));
                }
                names.push(name);
                if rest && i + 1 != parts.len() {
                    return Err(format!("'{text}': '{{{name}*}}' must be the last segment"));
                }
                if rest {
                    PatternSegment::Rest(name.to_string())
                } else {
                    PatternSegment::Capture(name.to_string())
                }
            } else if part.contains('{') || part.contains('}') {
                return Err(format!("'{text}': segment '{part}' must be all literal or one whole {{name}}"));
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
        assert!(PathPattern::parse("buckets/{b}").unwrap_err().contains("start with '/'"));
        assert!(PathPattern::parse("/{rest*}/x").unwrap_err().contains("last segment"));
        assert!(PathPattern::parse("/{a}/{a}").unwrap_err().contains("twice"));
        assert!(PathPattern::parse("/x{a}").unwrap_err().contains("whole"));
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
