//! One access-log line, written byte for byte as tracing's human or JSON
//! formatter would write the same event, into the log writer's buffer
//! (telemetry/writer.rs): tracing's formatter cost many times more per line
//! (docs/perf-log.md, "src/stack in one layout"). The event goes through
//! tracing instead when the writer is not fencegate's (tests with a
//! subscriber of their own), on a terminal (colours), and when the request's
//! debug span is on (the line then names its span).

use std::cell::Cell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;

/// One access-log line's fields.
#[derive(Debug, Clone, Copy)]
pub(super) struct Line<'a> {
    pub route: &'a str,
    pub method: &'a str,
    /// The client's address: the connection's (its peer, or its PROXY
    /// header's source), or behind a trusted proxy the one its
    /// `X-Forwarded-For` names.
    pub client: &'a str,
    pub key: Option<&'a str>,
    pub token: Option<u64>,
    pub decision: &'static str,
    pub status: u16,
    /// The upstream's status; `None` when fencegate answered itself.
    pub upstream_status: Option<u16>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub latency_us: u64,
    pub request_id: &'a str,
}

impl Line<'_> {
    /// The line as a tracing event.
    pub(super) fn event(&self) {
        tracing::info!(
            target: "fencegate::access",
            route = self.route,
            method = self.method,
            client = self.client,
            key = self.key,
            token = self.token,
            decision = self.decision,
            status = self.status,
            upstream_status = self.upstream_status,
            bytes_in = self.bytes_in,
            bytes_out = self.bytes_out,
            latency_us = self.latency_us,
            request_id = self.request_id,
        );
    }

    /// The line as tracing's formatter writes [`Line::event`], at `now`:
    /// `<time>  INFO fencegate::access: route="objects" method="PUT" ...`
    /// with strings as `{:?}` writes them, or
    /// `{"timestamp":"<time>","level":"INFO","route":...,"target":"fencegate::access"}`
    /// with the fields flattened in their order and strings as serde_json
    /// escapes them. An absent field is left out. Without `core::fmt` on the
    /// common path: it cost more than the rest of the line together.
    pub(super) fn write(&self, format: LogFormat, now: SystemTime, out: &mut Vec<u8>) {
        match format {
            LogFormat::Human => self.write_as::<Human>(now, out),
            LogFormat::Json => self.write_as::<Json>(now, out),
        }
    }

    /// [`Line::write`] in one format: its constant parts have lengths the
    /// compiler knows, so each is copied in place rather than by a call.
    fn write_as<S: Syntax>(&self, now: SystemTime, out: &mut Vec<u8>) {
        out.extend_from_slice(S::START);
        timestamp(now, out);
        // What follows the time, up to the first field's value, in one append.
        out.extend_from_slice(S::ROUTE);
        S::string(self.route, out);
        out.extend_from_slice(S::METHOD);
        known_plain(self.method, out);
        out.extend_from_slice(S::CLIENT);
        known_plain(self.client, out);
        if let Some(value) = self.key {
            out.extend_from_slice(S::KEY);
            S::string(value, out);
        }
        if let Some(value) = self.token {
            out.extend_from_slice(S::TOKEN);
            decimal(value, out);
        }
        out.extend_from_slice(S::DECISION);
        S::string(self.decision, out);
        out.extend_from_slice(S::STATUS);
        decimal(self.status.into(), out);
        if let Some(value) = self.upstream_status {
            out.extend_from_slice(S::UPSTREAM_STATUS);
            decimal(value.into(), out);
        }
        out.extend_from_slice(S::BYTES_IN);
        decimal(self.bytes_in, out);
        out.extend_from_slice(S::BYTES_OUT);
        decimal(self.bytes_out, out);
        out.extend_from_slice(S::LATENCY);
        decimal(self.latency_us, out);
        out.extend_from_slice(S::REQUEST_ID);
        known_plain(self.request_id, out);
        out.extend_from_slice(S::END);
    }
}

/// How one format spells a line's fields: what comes before the time and
/// before each value, in field order (the first also carries what follows
/// the time), how a string value is written, and what ends the line.
trait Syntax {
    const START: &'static [u8];
    const ROUTE: &'static [u8];
    const METHOD: &'static [u8];
    const CLIENT: &'static [u8];
    const KEY: &'static [u8];
    const TOKEN: &'static [u8];
    const DECISION: &'static [u8];
    const STATUS: &'static [u8];
    const UPSTREAM_STATUS: &'static [u8];
    const BYTES_IN: &'static [u8];
    const BYTES_OUT: &'static [u8];
    const LATENCY: &'static [u8];
    const REQUEST_ID: &'static [u8];
    const END: &'static [u8];

    /// Writes a string field's value.
    fn string(text: &str, out: &mut Vec<u8>);
}

/// tracing's human format, without colours.
struct Human;

impl Syntax for Human {
    const START: &'static [u8] = b"";
    const ROUTE: &'static [u8] = b"  INFO fencegate::access: route=";
    const METHOD: &'static [u8] = b" method=";
    const CLIENT: &'static [u8] = b" client=";
    const KEY: &'static [u8] = b" key=";
    const TOKEN: &'static [u8] = b" token=";
    const DECISION: &'static [u8] = b" decision=";
    const STATUS: &'static [u8] = b" status=";
    const UPSTREAM_STATUS: &'static [u8] = b" upstream_status=";
    const BYTES_IN: &'static [u8] = b" bytes_in=";
    const BYTES_OUT: &'static [u8] = b" bytes_out=";
    const LATENCY: &'static [u8] = b" latency_us=";
    const REQUEST_ID: &'static [u8] = b" request_id=";
    const END: &'static [u8] = b"\n";

    fn string(text: &str, out: &mut Vec<u8>) {
        debug_str(text, out);
    }
}

/// tracing's JSON format, the event's fields flattened.
struct Json;

impl Syntax for Json {
    const START: &'static [u8] = b"{\"timestamp\":\"";
    const ROUTE: &'static [u8] = b"\",\"level\":\"INFO\",\"route\":";
    const METHOD: &'static [u8] = b",\"method\":";
    const CLIENT: &'static [u8] = b",\"client\":";
    const KEY: &'static [u8] = b",\"key\":";
    const TOKEN: &'static [u8] = b",\"token\":";
    const DECISION: &'static [u8] = b",\"decision\":";
    const STATUS: &'static [u8] = b",\"status\":";
    const UPSTREAM_STATUS: &'static [u8] = b",\"upstream_status\":";
    const BYTES_IN: &'static [u8] = b",\"bytes_in\":";
    const BYTES_OUT: &'static [u8] = b",\"bytes_out\":";
    const LATENCY: &'static [u8] = b",\"latency_us\":";
    const REQUEST_ID: &'static [u8] = b",\"request_id\":";
    const END: &'static [u8] = b",\"target\":\"fencegate::access\"}\n";

    fn string(text: &str, out: &mut Vec<u8>) {
        json_str(text, out);
    }
}

/// Whether `{:?}` and serde_json write `text` as it is, in quotes: printable
/// ASCII but for the quote and the backslash. Eight bytes at a time.
fn plain(text: &str) -> bool {
    let mut words = text.as_bytes().chunks_exact(8);
    for word in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        if !plain_word(u64::from_le_bytes(eight)) {
            return false;
        }
    }
    words.remainder().iter().all(|&b| plain_byte(b))
}

/// Whether `b` is printable ASCII but for `"` (0x22) and the backslash (0x5c).
fn plain_byte(b: u8) -> bool {
    matches!(b, b' ' | b'!' | b'#'..=b'[' | b']'..=b'~')
}

/// [`plain_byte`] for each byte of `x` at once (the word tests of "Bit
/// Twiddling Hacks": each is exact for the word as a whole).
fn plain_word(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |y: u64| y.wrapping_sub(ONES) & !y & HIGHS;
    // A byte below the space (a control).
    let below = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
    // A byte above `~`: DEL, or not ASCII.
    let above = (x.wrapping_add(ONES) | x) & HIGHS;
    let quote = has_zero(x ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(x ^ (ONES * u64::from(b'\\')));
    below | above | quote | backslash == 0
}

/// `text` as `{:?}` writes it.
fn debug_str(text: &str, out: &mut Vec<u8>) {
    quoted(text, out, |text, out| {
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{text:?}");
    });
}

/// `text` as serde_json writes it.
fn json_str(text: &str, out: &mut Vec<u8>) {
    quoted(text, out, |text, out| {
        // Writing a string to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
    });
}

/// A `text` known to be [`plain`] between quotes, as both formats write it,
/// unchecked: a method (a token, RFC 9110 §9.1), an IP address, a request ID
/// (kept only when plain, `http/request_id.rs`).
fn known_plain(text: &str, out: &mut Vec<u8>) {
    debug_assert!(plain(text), "{text:?} is not plain");
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// A [`plain`] `text` between quotes, anything else as `escaped` writes it.
fn quoted(text: &str, out: &mut Vec<u8>, escaped: impl FnOnce(&str, &mut Vec<u8>)) {
    if plain(text) {
        known_plain(text, out);
    } else {
        escaped(text, out);
    }
}

/// The two digits of 0 to 99.
const PAIRS: [[u8; 2]; 100] = {
    let mut pairs = [[0u8; 2]; 100];
    let mut n = 0;
    while n < 100 {
        pairs[n] = [b'0' + (n / 10) as u8, b'0' + (n % 10) as u8];
        n += 1;
    }
    pairs
};

/// `n` in decimal, two digits at a time, each append of a length the
/// compiler knows.
fn decimal(n: u64, out: &mut Vec<u8>) {
    if n >= 100 {
        decimal(n / 100, out);
        out.extend_from_slice(&PAIRS[(n % 100) as usize]);
    } else if n >= 10 {
        out.extend_from_slice(&PAIRS[n as usize]);
    } else {
        out.push(b'0' + n as u8);
    }
}

/// `2026-12-02T04:20:43.935551Z`, as tracing's formatter writes the time:
/// UTC, microseconds. The date and time of day are kept per thread for the
/// second they were made in.
fn timestamp(now: SystemTime, out: &mut Vec<u8>) {
    thread_local! {
        static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (cached, mut text) = SECOND.get();
    if cached != secs {
        text = civil(secs);
        SECOND.set((secs, text));
    }
    // Made whole on the stack, then one append: `<seconds>.<micros>Z`.
    let mut stamp = [0u8; 27];
    stamp[..19].copy_from_slice(&text);
    stamp[19] = b'.';
    let micros = since.subsec_micros() as usize;
    stamp[20..22].copy_from_slice(&PAIRS[micros / 10_000]);
    stamp[22..24].copy_from_slice(&PAIRS[micros / 100 % 100]);
    stamp[24..26].copy_from_slice(&PAIRS[micros % 100]);
    stamp[26] = b'Z';
    out.extend_from_slice(&stamp);
}

/// `YYYY-MM-DDTHH:MM:SS` for seconds since the Unix epoch, in UTC (the
/// proleptic Gregorian calendar, Howard Hinnant's days-to-civil).
fn civil(secs: u64) -> [u8; 19] {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = [0u8; 19];
    let mut cursor = std::io::Cursor::new(&mut text[..]);
    // 19 bytes hold any year below 10,000.
    let _ = write!(cursor, "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rem / 3_600, rem % 3_600 / 60, rem % 60);
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http::Outcome;
    use crate::telemetry::testing::Captured;

    /// The line through tracing's formatter, configured as telemetry::init does.
    fn through_tracing(line: &Line<'_>, format: LogFormat) -> String {
        let captured = Captured::default();
        let layer = tracing_subscriber::fmt::layer().with_writer(captured.clone()).with_ansi(false);
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let layer = match format {
            LogFormat::Human => layer.boxed(),
            LogFormat::Json => layer.json().flatten_event(true).with_current_span(false).boxed(),
        };
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || line.event());
        captured.text()
    }

    fn ours(line: &Line<'_>, format: LogFormat, now: SystemTime) -> String {
        let mut out = Vec::new();
        line.write(format, now, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The line with the time's digits zeroed: the two take the time a
    /// moment apart, but its layout must be the same.
    fn without_time(text: &str) -> String {
        let at = text.find('Z').expect("a timestamp");
        let start = text.find("20").expect("a year");
        let time: String = text[start..at].chars().map(|c| if c.is_ascii_digit() { '0' } else { c }).collect();
        format!("{}{time}{}", &text[..start], &text[at..])
    }

    #[test]
    fn lines_are_what_tracing_would_write() {
        let keys = [
            None,
            Some("/objects/a"),
            Some("/objects/it's ~{|}^`"),
            Some("/objects/with \"quotes\" and \\ backslash"),
            Some("/objects/tab\tnew\nline\r\u{0}\u{7f}"),
            Some("/objects/é ünïcödé \u{200b} \u{fffd} 🦀"),
            Some(""),
        ];
        for format in [LogFormat::Human, LogFormat::Json] {
            for key in keys {
                for (token, upstream_status) in
                    [(None, None), (Some(0), Some(200)), (Some(7), None), (Some(u64::MAX), Some(599))]
                {
                    let line = Line {
                        route: "objects \"odd\"",
                        method: "PUT",
                        client: "2001:db8::7",
                        key,
                        token,
                        decision: Outcome::Stale.as_str(),
                        status: 409,
                        upstream_status,
                        bytes_in: 0,
                        bytes_out: u64::MAX,
                        latency_us: 1234,
                        request_id: "Root=1-5759e988;Parent=53995c3f",
                    };
                    let theirs = through_tracing(&line, format);
                    let ours = ours(&line, format, SystemTime::now());
                    assert_eq!(without_time(&ours), without_time(&theirs), "{format:?} {key:?} {token:?}");
                }
            }
        }
    }

    /// Every ASCII byte alone: plain exactly when printable and neither the
    /// quote nor the backslash.
    #[test]
    fn plain_bytes_are_the_printable_ones_but_two() {
        for b in 0u8..0x80 {
            let text = char::from(b).to_string();
            let expected = (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\';
            assert_eq!(plain(&text), expected, "byte {b:#x}");
        }
        assert!(!plain("é"));
    }

    /// Every byte at every place of a longer text, in whole words and in
    /// the tail after them: plain exactly when each byte alone is.
    #[test]
    fn plain_words_are_plain_bytes_eight_at_a_time() {
        for b in 0u8..=0xff {
            for at in 0..19 {
                let mut bytes = b"/objects/put/k2462~".to_vec();
                bytes[at] = b;
                let expected = plain_byte(b);
                match std::str::from_utf8(&bytes) {
                    Ok(text) => assert_eq!(plain(text), expected, "byte {b:#x} at {at}"),
                    // Not UTF-8 alone (a lone byte above 0x7f): the word test sees it all the same.
                    Err(_) => assert!(!plain_word_or_tail(&bytes), "byte {b:#x} at {at}"),
                }
            }
        }
    }

    /// [`plain`] on bytes, for bytes no `&str` can hold.
    fn plain_word_or_tail(bytes: &[u8]) -> bool {
        let mut words = bytes.chunks_exact(8);
        let words_plain = words.all(|w| plain_word(u64::from_le_bytes(w.try_into().unwrap())));
        words_plain && words.remainder().iter().all(|&b| plain_byte(b))
    }

    #[test]
    fn numbers_are_written_as_to_string_writes_them() {
        let mut numbers = vec![0, 1, 9, 10, 11, 99, 100, 101, 999, 1_000, 12_345, 100_000, u64::MAX, u64::MAX - 1];
        numbers.extend((0..64).map(|shift| 1u64 << shift));
        numbers.extend((1..20).map(|e| 10u64.pow(e) - 1));
        for n in numbers {
            let mut out = Vec::new();
            decimal(n, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
    }

    #[test]
    fn the_time_is_written_as_tracing_writes_it() {
        let line = Line {
            route: "r",
            method: "GET",
            client: "192.0.2.7",
            key: None,
            token: None,
            decision: "forwarded",
            status: 200,
            upstream_status: Some(200),
            bytes_in: 0,
            bytes_out: 5,
            latency_us: 1,
            request_id: "id",
        };
        // Across a leap day, a year's end and the far future.
        for secs in [0u64, 951_782_399, 951_782_400, 1_704_067_199, 1_764_648_043, 4_102_444_800, 253_402_300_799] {
            for micros in [0u32, 1, 935_551, 999_999] {
                let now = UNIX_EPOCH + Duration::new(secs, micros * 1_000);
                let ours = ours(&line, LogFormat::Human, now);
                let expected = reference_time(secs, micros);
                assert!(ours.starts_with(&expected), "{ours} for {secs}.{micros}: {expected}");
            }
        }
    }

    /// The time by counting days, the slow way, in tracing's layout (its
    /// clock cannot be set; the layout is checked against it above).
    fn reference_time(secs: u64, micros: u32) -> String {
        let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
        let (mut days, rem) = (secs / 86_400, secs % 86_400);
        let mut year = 1970;
        while days >= if leap(year) { 366 } else { 365 } {
            days -= if leap(year) { 366 } else { 365 };
            year += 1;
        }
        let lengths = [31, if leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let mut month = 0;
        while days >= lengths[month] {
            days -= lengths[month];
            month += 1;
        }
        format!(
            "{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{micros:06}Z",
            month + 1,
            days + 1,
            rem / 3_600,
            rem % 3_600 / 60,
            rem % 60
        )
    }
}
