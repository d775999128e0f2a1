//! What is wrong with a config, said so an operator can fix it: each problem
//! names its field, and validation collects them all so one `--check` run
//! lists everything.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::size::Size;

/// One problem found in a config, with the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted path of the field, e.g. `route[1] 'objects'.timeout`.
    pub field: String,
    pub message: String,
}

/// Everything wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub source_name: String,
    pub problems: Vec<ConfigProblem>,
}

impl ConfigError {
    /// One problem that concerns the file as a whole (unreadable, not TOML).
    pub(super) fn whole_file(source_name: &str, message: String) -> ConfigError {
        ConfigError {
            source_name: source_name.to_string(),
            problems: vec![ConfigProblem { field: String::new(), message }],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{}: {} problem{}", self.source_name, n, if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            if p.field.is_empty() {
                write!(f, "\n  - {}", p.message)?;
            } else {
                write!(f, "\n  - {}: {}", p.field, p.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Collects problems while validating, so all of them are reported together.
///
/// Each reader returns a usable stand-in (the default) after recording a
/// problem, so validation goes on and finds the next one.
#[derive(Debug, Default)]
pub(super) struct Problems(Vec<ConfigProblem>);

/// The longest duration a config field takes. A write's lease and a key's
/// deadlines add a few of a route's durations to each other and to the
/// clock: bounded here, none of those sums can overflow (a value past it
/// would have panicked at start, or on the first fenced request). `"100y"`,
/// as humantime counts years (365.25 days).
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

impl Problems {
    pub(super) fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem { field: field.into(), message: message.into() });
    }

    pub(super) fn count(&self) -> usize {
        self.0.len()
    }

    /// `Ok(value)` if nothing was recorded, else every problem.
    pub(super) fn or<T>(self, value: T) -> Result<T, Vec<ConfigProblem>> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self.0)
        }
    }

    #[cfg(test)]
    pub(super) fn into_vec(self) -> Vec<ConfigProblem> {
        self.0
    }

    /// An `IP:port` address; `default` must parse.
    pub(super) fn addr(&mut self, field: &str, value: Option<&str>, default: SocketAddr) -> SocketAddr {
        let Some(text) = value else { return default };
        text.parse().unwrap_or_else(|_| {
            self.add(field, format!("'{text}' is not an IP:port address (e.g. \"127.0.0.1:8080\")"));
            default
        })
    }

    /// A byte size above zero.
    pub(super) fn size(&mut self, field: &str, value: Option<&Size>, default: u64) -> u64 {
        let Some(size) = value else { return default };
        match size.bytes() {
            Ok(0) => {
                self.add(field, "must be greater than zero");
                default
            }
            Ok(n) => n,
            Err(e) => {
                self.add(field, e.to_string());
                default
            }
        }
    }

    /// A humantime duration above zero, at most [`MAX_DURATION`].
    pub(super) fn duration(&mut self, field: &str, value: Option<&str>, default: Duration) -> Duration {
        self.duration_from(field, value, default, false)
    }

    /// A humantime duration, zero allowed when `zero_ok`, at most [`MAX_DURATION`].
    pub(super) fn duration_from(
        &mut self,
        field: &str,
        value: Option<&str>,
        default: Duration,
        zero_ok: bool,
    ) -> Duration {
        let Some(text) = value else { return default };
        match humantime::parse_duration(text) {
            Ok(d) if d.is_zero() && !zero_ok => {
                self.add(field, "must be greater than zero");
                default
            }
            Ok(d) if d > MAX_DURATION => {
                self.add(
                    field,
                    format!("'{text}' is longer than the longest duration fencegate takes, 100 years (\"100y\")"),
                );
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.add(field, format!("'{text}' is not a duration like \"250ms\" or \"30s\" ({e})"));
                default
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_past_a_hundred_years_names_its_field() {
        let mut p = Problems::default();
        assert_eq!(p.duration("route[0].timeout", Some("100y"), Duration::ZERO), MAX_DURATION);
        assert!(p.into_vec().is_empty());
        let mut p = Problems::default();
        let d = p.duration("route[0].timeout", Some("400000000000years"), Duration::from_secs(30));
        assert_eq!(d, Duration::from_secs(30));
        let problems = p.into_vec();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "route[0].timeout");
        assert!(problems[0].message.contains("100 years"), "{}", problems[0].message);
    }

    #[test]
    fn an_error_lists_every_problem_under_the_file_name() {
        let mut p = Problems::default();
        p.add("server.listen", "'x' is not an IP:port address");
        p.add("", "the file as a whole");
        let err = ConfigError { source_name: "f.toml".into(), problems: p.into_vec() };
        assert_eq!(
            err.to_string(),
            "f.toml: 2 problems\n  - server.listen: 'x' is not an IP:port address\n  - the file as a whole"
        );
    }

    #[test]
    fn readers_record_a_problem_and_return_the_default() {
        let mut p = Problems::default();
        let d = Duration::from_secs(3);
        assert_eq!(p.duration("a", Some("0s"), d), d);
        assert_eq!(p.duration_from("b", Some("0s"), d, true), Duration::ZERO);
        assert_eq!(p.size("c", Some(&Size::Bytes(0)), 7), 7);
        assert_eq!(p.size("d", Some(&Size::Negative(-4)), 7), 7);
        let fields: Vec<_> = p.0.iter().map(|x| x.field.as_str()).collect();
        assert_eq!(fields, ["a", "c", "d"]);
    }
}
