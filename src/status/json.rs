//! The status JSON, written by hand: a few fields, no serializer needed.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::breaker::{Reason, Snapshot, State, Thresholds, Window};
use crate::spend::Period;

/// One breaker as the page shows it.
pub(super) struct Row {
    pub(super) breaker: Arc<str>,
    pub(super) key: Arc<str>,
    pub(super) snap: Snapshot,
}

/// A Redis backend's fleet.
pub(super) struct Fleet {
    pub(super) name: Arc<str>,
    pub(super) alive: u32,
    pub(super) quorum: u32,
    pub(super) shared: bool,
}

/// One of its last transitions.
pub(super) struct Shown {
    pub(super) from: State,
    pub(super) to: State,
    pub(super) reason: Reason,
    pub(super) ago: Duration,
}

pub(super) fn render<'a, I>(
    rows: &'a [Row],
    fleets: &[Fleet],
    refresh: Duration,
    transitions: impl Fn(&'a Row) -> I,
) -> String
where
    I: Iterator<Item = Shown>,
{
    let mut out = String::with_capacity(128 + rows.len() * 512);
    let _ = write!(out, r#"{{"refresh_ms":{},"fleets":["#, refresh.as_millis());
    for (i, f) in fleets.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"name":"#);
        string(&mut out, &f.name);
        let _ = write!(
            out,
            r#","alive":{},"quorum":{},"shared":{}}}"#,
            f.alive, f.quorum, f.shared
        );
    }
    out.push_str(r#"],"breakers":["#);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let s = &row.snap;
        out.push_str(r#"{"breaker":"#);
        string(&mut out, &row.breaker);
        out.push_str(r#","key":"#);
        string(&mut out, &row.key);
        let _ = write!(out, r#","state":"{}""#, s.state.as_str());
        out.push_str(r#","next_probe_ms":"#);
        match s.retry_in {
            Some(d) => {
                let _ = write!(out, "{}", d.as_nanos().div_ceil(1_000_000));
            }
            None => out.push_str("null"),
        }
        let w = &s.window;
        let _ = write!(
            out,
            r#","window":{{"calls":{},"failures":{},"slow":{},"failure_rate":{},"slow_rate":{}}}"#,
            w.calls,
            w.failures,
            w.slow,
            number(w.failure_rate()),
            number(w.slow_rate()),
        );
        let c = &s.counters;
        let _ = write!(
            out,
            r#","consecutive_failures":{},"reopens":{},"metrics_only":{},"counters":{{"admitted":{},"in_flight":{},"rejected":{},"successes":{},"failures":{},"ignored":{},"rate_limited":{},"quota_exhausted":{},"dropped":{},"slow":{},"volume_limited":{},"would_reject":{}}}"#,
            s.consecutive_failures,
            s.reopens,
            s.metrics_only,
            c.admitted,
            c.in_flight,
            c.rejected,
            c.successes,
            c.failures,
            c.ignored,
            c.rate_limited,
            c.quota_exhausted,
            c.dropped,
            c.slow,
            c.volume_limited,
            c.would_reject,
        );
        thresholds(&mut out, &s.thresholds);
        match &s.spend {
            Some(sp) => {
                let _ = write!(
                    out,
                    r#","spend":{{"budget":{},"spent":{},"unit":"{}","exceeded":{},"period":"#,
                    sp.budget,
                    sp.spent,
                    sp.unit.as_str(),
                    sp.exceeded
                );
                period(&mut out, sp.period);
                out.push('}');
            }
            None => out.push_str(r#","spend":null"#),
        }
        out.push_str(r#","transitions":["#);
        for (j, t) in transitions(row).enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                r#"{{"from":"{}","to":"{}","reason":"{}","ago_ms":{}}}"#,
                t.from.as_str(),
                t.to.as_str(),
                t.reason.as_str(),
                t.ago.as_millis()
            );
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

/// `"thresholds":{..}`: the trip rules, `null` for one that is off.
fn thresholds(out: &mut String, t: &Thresholds) {
    out.push_str(r#","thresholds":{"window":"#);
    match t.window {
        Window::Count(calls) => {
            let _ = write!(out, r#"{{"calls":{calls}}}"#);
        }
        Window::Time { span, buckets } => {
            let _ = write!(
                out,
                r#"{{"span_ms":{},"buckets":{buckets}}}"#,
                span.as_millis()
            );
        }
        Window::None => out.push_str("null"),
    }
    let _ = write!(out, r#","min_calls":{},"failure_rate":"#, t.min_calls);
    optional(out, t.failure_rate.map(number));
    out.push_str(r#","slow_call_ms":"#);
    optional(out, t.slow_call.map(|(d, _)| d.as_millis()));
    out.push_str(r#","slow_call_rate":"#);
    optional(out, t.slow_call.map(|(_, r)| number(r)));
    out.push_str(r#","consecutive_failures":"#);
    optional(out, t.consecutive_failures);
    out.push('}');
}

/// A spend budget's period: `"utc_hour"`, `"utc_day"` or
/// `{"rolling_ms":..}`.
fn period(out: &mut String, period: Period) {
    match period {
        Period::UtcHour => out.push_str(r#""utc_hour""#),
        Period::UtcDay => out.push_str(r#""utc_day""#),
        Period::Rolling(d) => {
            let _ = write!(out, r#"{{"rolling_ms":{}}}"#, d.as_millis());
        }
    }
}

fn optional(out: &mut String, value: Option<impl std::fmt::Display>) {
    match value {
        Some(v) => {
            let _ = write!(out, "{v}");
        }
        None => out.push_str("null"),
    }
}

/// A finite number; JSON has no NaN.
fn number(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// A JSON string. Beyond what JSON requires, `<`, `>`, `&` and the two
/// line separators JavaScript once rejected are escaped too, so the JSON is
/// inert even where a browser would take it for HTML.
pub(super) fn string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", ch as u32);
            }
            ch => out.push(ch),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn a_key_is_an_inert_json_string() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\n</script><img src=x>&\u{2028}\u{1}");
        assert_eq!(
            out,
            r#""a\"b\\c\n\u003c/script\u003e\u003cimg src=x\u003e\u0026\u2028\u0001""#
        );
    }
}
