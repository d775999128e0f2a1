//! The Lua scripts of `scripts.lua`, their calling, and the reading of
//! their replies.
//!
//! Every script takes the identity this replica adopted as its first
//! argument and answers a verdict and the store's deletions counter before
//! the rest, so any call can tell that the store changed under it.

use std::time::Duration;

use redis::{Script, ScriptInvocation};
use tokio::time::Instant;

use super::{distrusted, failed, unexpected, Inner, STORE};
use crate::fence::store::{Doubt, Found, StoreError};

const SOURCE: &str = include_str!("scripts.lua");

/// What starts each script in `scripts.lua`; the part before the first is
/// shared by all.
const HEADING: &str = "\n-- script: ";

/// The scripts of `scripts.lua`, each with the shared part before it.
pub(super) struct Scripts {
    pub enter: Script,
    pub raise: Script,
    pub get: Script,
    pub list: Script,
    pub delete: Script,
    pub confirm: Script,
    pub hold: Script,
    pub held: Script,
    pub lease: Script,
    pub swap_lease: Script,
}

impl Scripts {
    pub fn load() -> Scripts {
        let mut named: std::collections::HashMap<&str, Script> =
            split(SOURCE).into_iter().map(|(name, body)| (name, Script::new(&body))).collect();
        let mut take = |name: &str| named.remove(name).unwrap_or_else(|| panic!("scripts.lua has no '{name}' script"));
        Scripts {
            enter: take("enter"),
            raise: take("raise"),
            get: take("get"),
            list: take("list"),
            delete: take("delete"),
            confirm: take("confirm"),
            hold: take("hold"),
            held: take("held"),
            lease: take("lease"),
            swap_lease: take("swap_lease"),
        }
    }
}

/// The scripts of `source` by name, each with the shared part before it.
fn split(source: &str) -> Vec<(&str, String)> {
    let mut parts = source.split(HEADING);
    let shared = parts.next().unwrap_or_default();
    parts
        .map(|part| {
            let (name, body) = part.split_once('\n').unwrap_or((part, ""));
            (name.trim(), format!("{shared}\n{body}"))
        })
        .collect()
}

/// A script's first word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Done (raised, recorded, read, confirmed...).
    Ok,
    /// The token is below the mark.
    Stale,
    /// A higher token waits for the key.
    Superseded,
    /// Fenced writes are held after a confirmation.
    Held,
    /// Writes of the key are in flight: try again.
    Busy,
    /// The store's identity is not the one sent: nothing was done.
    Identity,
    /// A word no script answers.
    Other(String),
}

impl Verdict {
    fn parse(word: String) -> Verdict {
        match word.as_str() {
            "ok" => Verdict::Ok,
            "stale" => Verdict::Stale,
            "superseded" => Verdict::Superseded,
            "held" => Verdict::Held,
            "busy" => Verdict::Busy,
            "identity" => Verdict::Identity,
            _ => Verdict::Other(word),
        }
    }

    /// The word the script answered.
    pub fn word(&self) -> &str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Stale => "stale",
            Verdict::Superseded => "superseded",
            Verdict::Held => "held",
            Verdict::Busy => "busy",
            Verdict::Identity => "identity",
            Verdict::Other(word) => word,
        }
    }

    /// The error for a verdict the caller does not expect here.
    pub fn unexpected(&self) -> StoreError {
        unexpected(Found::Verdict(shown(self.word())))
    }
}

/// One script's answer: its verdict, the store's deletions counter, and the rest.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Reply {
    pub verdict: Verdict,
    pub deletions: u64,
    pub rest: Vec<String>,
}

impl Reply {
    pub fn parse(values: Vec<String>) -> Result<Reply, StoreError> {
        let mut values = values.into_iter();
        let verdict = Verdict::parse(values.next().ok_or_else(|| unexpected(Found::Empty))?);
        if verdict == Verdict::Identity {
            // identity, id, previous, deletions
            let rest: Vec<String> = values.collect();
            let deletions = rest.get(2).and_then(|d| d.parse().ok()).unwrap_or_default();
            return Ok(Reply { verdict, deletions, rest });
        }
        let deletions = values.next().and_then(|d| d.parse().ok()).unwrap_or_default();
        Ok(Reply { verdict, deletions, rest: values.collect() })
    }

    /// The mark the reply carries first (none: empty or missing).
    pub fn mark(&self) -> Result<Option<u64>, StoreError> {
        parse_mark(self.rest.first())
    }

    /// The milliseconds the reply carries first.
    pub fn ms(&self) -> Result<Duration, StoreError> {
        parse_ms(self.rest.first())
    }
}

/// A mark a script answered: a base-10 token, or empty (no mark).
pub(super) fn parse_mark(value: Option<&String>) -> Result<Option<u64>, StoreError> {
    match value.map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| unexpected(Found::Mark(shown(text)))),
    }
}

/// Milliseconds a script answered, as a duration.
pub(super) fn parse_ms(value: Option<&String>) -> Result<Duration, StoreError> {
    let text = value.map(String::as_str).unwrap_or_default();
    text.parse().map(Duration::from_millis).map_err(|_| unexpected(Found::Milliseconds(shown(text))))
}

/// A count a script answered.
pub(super) fn parse_count(value: Option<&String>) -> Result<u64, StoreError> {
    let text = value.map(String::as_str).unwrap_or_default();
    text.parse().map_err(|_| unexpected(Found::Count(shown(text))))
}

/// An answer's text as a refusal names it: the 503's detail reaches the
/// client, so at most [`SHOWN`] characters of whatever the store held.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The most characters of an unexpected answer a refusal shows.
const SHOWN: usize = 32;

/// A duration as whole milliseconds, at least one: Redis reads 0 as "none"
/// (or refuses it) where fencegate means "at once".
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Inner {
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let mut con = self.con.clone();
        let sent = Instant::now();
        let answer = tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut con)).await;
        self.answered(answer, sent, context)
    }

    /// A call's outcome as the store's: its error, or a timeout after
    /// `[fences] timeout`. Every call passes here, so it is also where the
    /// store's reachability and the round trip of a call `sent` then are noted.
    pub(super) fn answered<T>(
        &self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        sent: Instant,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let result = match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(failed(context, e)),
            Err(_) => Err(StoreError::NoAnswer { store: STORE, context, after: self.timeout }),
        };
        if result.is_ok() {
            self.calls.answered(sent.elapsed());
        }
        self.note_answer(result.as_ref().map(drop));
        result
    }

    /// Runs `script` with this replica's identity first in its arguments,
    /// adopting (or distrusting) what the store says when it differs.
    pub(super) async fn run_bytes(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<Reply, StoreError> {
        Ok(self.run_inner(script, keys, args, false).await?.0)
    }

    /// [`run_bytes`](Self::run_bytes), then `WAIT` for `min_replicas` in the same
    /// pipeline (so on the same connection), when they are asked for.
    pub(super) async fn run_waiting(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<(Reply, Option<i64>), StoreError> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.run_inner(script, keys, &args, self.min_replicas > 0).await
    }

    async fn run_inner(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
        wait: bool,
    ) -> Result<(Reply, Option<i64>), StoreError> {
        // An identity that changed is adopted (or distrusted) and the script
        // runs again: at most twice.
        for _ in 0..2 {
            let id = self.identity().await?;
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key.as_str());
            }
            invocation.arg(id.as_str());
            for arg in args {
                invocation.arg(*arg);
            }
            let (values, acked) = self.invoke(&invocation, wait).await?;
            let reply = Reply::parse(values)?;
            if reply.verdict == Verdict::Identity {
                self.judge().await?;
                continue;
            }
            self.knowledge.note_deletions(reply.deletions);
            return Ok((reply, acked));
        }
        Err(distrusted(Doubt::IdentityUnsettled))
    }

    /// Runs a prepared script (loading it first if Redis lost it), then,
    /// with `wait`, `WAIT` in the same pipeline.
    pub(super) async fn invoke(
        &self,
        invocation: &ScriptInvocation<'_>,
        wait: bool,
    ) -> Result<(Vec<String>, Option<i64>), StoreError> {
        let mut con = self.con.clone();
        let sent = Instant::now();
        if !wait {
            let answer = tokio::time::timeout(self.timeout, invocation.invoke_async::<Vec<String>>(&mut con)).await;
            return self.answered(answer, sent, "running a fence script").map(|v| (v, None));
        }
        let within = self.timeout + self.replica_timeout;
        let replica_ms = millis(self.replica_timeout);
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.invoke_script(invocation).cmd("WAIT").arg(self.min_replicas).arg(replica_ms);
            let answer = tokio::time::timeout(within, pipe.query_async::<(Vec<String>, i64)>(&mut con)).await;
            match answer {
                Ok(Err(e))
                    if attempt == 0 && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let load = tokio::time::timeout(self.timeout, invocation.load_async(&mut con)).await;
                    self.answered(load, sent, "loading a fence script")?;
                }
                answer => return self.answered(answer, sent, "running a fence script").map(|(v, n)| (v, Some(n))),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Runs `pipe`, whose last command is a `WAIT` when `min_replicas` asks
    /// for one, loading the raise script first (a restore may be the first
    /// use of a Redis that restarted, and a pipeline is not retried).
    pub(super) async fn query_pipe(&self, pipe: &redis::Pipeline, context: &'static str) -> Result<(), StoreError> {
        let mut con = self.con.clone();
        let sent = Instant::now();
        let load = tokio::time::timeout(self.timeout, self.scripts.raise.prepare_invoke().load_async(&mut con)).await;
        self.answered(load, sent, context)?;
        let sent = Instant::now();
        let within = self.timeout * 4 + self.replica_timeout;
        let answer = tokio::time::timeout(within, pipe.query_async::<Vec<i64>>(&mut con)).await;
        let acked = self.answered(answer, sent, context)?;
        self.replicas_acked(acked.last().copied().filter(|_| self.min_replicas > 0))
    }

    /// Refuses a decision fewer Redis replicas than `min_replicas` acknowledged.
    pub(super) fn replicas_acked(&self, acked: Option<i64>) -> Result<(), StoreError> {
        match acked {
            Some(acked) if acked < i64::from(self.min_replicas) => Err(StoreError::Replicas {
                store: STORE,
                acked,
                wanted: self.min_replicas,
                within: self.replica_timeout,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn every_script_is_found_and_carries_the_shared_part() {
        let scripts = split(SOURCE);
        let names: Vec<&str> = scripts.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            ["enter", "raise", "get", "list", "delete", "confirm", "hold", "held", "lease", "swap_lease"]
        );
        for (name, body) in &scripts {
            assert!(body.contains("local function below(a, b)"), "{name} lacks the shared part");
            assert!(!body.contains(HEADING), "{name} holds another script");
        }
        // And they load (a missing one panics at start, not at first use).
        let _ = Scripts::load();
    }

    #[test]
    fn a_reply_is_its_verdict_the_deletions_and_the_rest() {
        let reply = Reply::parse(strings(&["ok", "3", "17"])).unwrap();
        assert_eq!(reply, Reply { verdict: Verdict::Ok, deletions: 3, rest: strings(&["17"]) });
        assert_eq!(reply.mark().unwrap(), Some(17));
        let none = Reply::parse(strings(&["ok", "0", ""])).unwrap();
        assert_eq!(none.mark().unwrap(), None);
        let busy = Reply::parse(strings(&["busy", "2"])).unwrap();
        assert_eq!((busy.verdict, busy.deletions, busy.rest.len()), (Verdict::Busy, 2, 0));
        // The identity answer carries the deletions last: id, previous, deletions.
        let moved = Reply::parse(strings(&["identity", "abc", "old", "5"])).unwrap();
        assert_eq!(moved, Reply { verdict: Verdict::Identity, deletions: 5, rest: strings(&["abc", "old", "5"]) });
    }

    #[test]
    fn what_a_reply_cannot_mean_is_refused_naming_what_was_found() {
        let found = |e: StoreError| match e {
            StoreError::Unexpected(u) => u.found,
            other => panic!("{other}"),
        };
        assert_eq!(found(Reply::parse(Vec::new()).unwrap_err()), Found::Empty);
        assert_eq!(found(parse_mark(Some(&"-1".into())).unwrap_err()), Found::Mark("-1".into()));
        assert_eq!(
            found(parse_mark(Some(&"18446744073709551616".into())).unwrap_err()),
            Found::Mark("18446744073709551616".into())
        );
        assert_eq!(found(parse_count(Some(&"x".into())).unwrap_err()), Found::Count("x".into()));
        let odd = Reply::parse(strings(&["perhaps", "0"])).unwrap();
        assert_eq!(odd.verdict, Verdict::Other("perhaps".into()));
        assert_eq!(found(odd.verdict.unexpected()), Found::Verdict("perhaps".into()));
        assert_eq!(found(Verdict::Busy.unexpected()), Found::Verdict("busy".into()));
    }

    #[test]
    fn milliseconds_from_a_script_are_read_or_refused() {
        assert_eq!(parse_ms(Some(&"1500".to_owned())).unwrap(), Duration::from_millis(1500));
        let refused = |text: Option<&str>| parse_ms(text.map(str::to_owned).as_ref()).unwrap_err().to_string();
        assert!(refused(Some("1.5e+12")).ends_with("not a number of milliseconds (\"1.5e+12\")"));
        assert!(refused(None).ends_with("not a number of milliseconds (\"\")"));
        // Whatever the store held, a refusal shows a bounded part of it.
        let long = "9".repeat(20) + &"x".repeat(100);
        let shown = parse_count(Some(&long)).unwrap_err().to_string();
        assert!(shown.ends_with(&format!("({:?})", format!("{}…", &long[..SHOWN]))), "{shown}");
    }

    #[test]
    fn durations_sent_to_redis_are_whole_milliseconds_and_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
