//! Tests of the state script's arguments and replies, and of the script
//! itself against a real Redis.

use super::*;
use crate::breaker::{Config, Window};

#[test]
fn a_lease_that_never_expires_saturates_at_the_scripts_longest() {
    let config = Config {
        probe_lease: Some(Duration::MAX),
        open: Duration::MAX,
        open_max: Some(Duration::MAX),
        ..Config::default()
    };
    let rule = Rule::new(&config.shared_rules(), Some((Duration::MAX, 10)));
    let longest = Duration::from_millis(MAX_MS);
    // What the replica holds a granted slot for is what the cluster
    // grants it for: not `Duration::MAX` here and the script's fallback
    // (the open duration) there.
    assert_eq!(rule.lease, longest);
    assert_eq!(lease_ms(&rule), MAX_MS);
    assert_eq!(
        (rule.span_ms, rule.open_ms, rule.open_max_ms),
        (MAX_MS, MAX_MS, MAX_MS)
    );
    // Well inside what a Lua number holds exactly, with a clock added.
    const { assert!(MAX_MS * 4 < 1 << 53) };
}

#[test]
fn keys_of_one_breaker_share_a_hash_tag() {
    let k = Keys::new("svc", "gpt-4o/eu");
    assert_eq!(k.state, "{svc:gpt-4o/eu}:v2:state");
    assert_eq!(k.window, "{svc:gpt-4o/eu}:v2:win");
    assert_eq!(k.probes, "{svc:gpt-4o/eu}:v2:probes");
    assert_eq!(k.votes, "{svc:gpt-4o/eu}:v2:votes");
    assert_eq!(k.health, "{svc:gpt-4o/eu}:v2:health");
}

#[test]
fn replies_of_another_shape_are_refused() {
    let good = Value::Array(vec![
        Value::Int(1),
        Value::Int(250),
        Value::Int(7),
        Value::Int(0),
        Value::Int(0),
    ]);
    let r = Reply::parse(&good).unwrap();
    assert_eq!(r.cluster, Cluster::Open(Duration::from_millis(250)));
    assert_eq!(r.epoch, 7);
    assert!(!r.granted);
    for bad in [
        Value::Nil,
        Value::Int(1),
        Value::Array(vec![
            Value::Int(9),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]),
        Value::Array(vec![
            Value::Int(1),
            Value::Int(-5),
            Value::Int(0),
            Value::Int(0),
        ]),
        Value::Array(vec![Value::Int(0)]),
        Value::Array(vec![
            Value::Nil,
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
        ]),
    ] {
        assert!(Reply::parse(&bad).is_none(), "{bad:?}");
    }
}

#[test]
fn a_reply_carries_the_summed_window_only_in_its_shape() {
    let reply = |window: [i64; 3]| {
        let mut items = vec![Value::Int(0); Field::ALL.len()];
        items[Field::Epoch.lua() - 1] = Value::Int(7);
        for (f, n) in [Field::Calls, Field::Failures, Field::Slow]
            .iter()
            .zip(window)
        {
            items[f.lua() - 1] = Value::Int(n);
        }
        Reply::parse(&Value::Array(items)).unwrap()
    };
    let w = reply([20, 12, 3]).window.unwrap();
    assert_eq!((w.calls, w.failures, w.slow), (20, 12, 3));
    assert_eq!(reply([20, 12, 3]).epoch, 7);
    // Not read this exchange, or not a window the script wrote.
    assert!(reply([-1, -1, -1]).window.is_none());
    assert!(reply([5, 6, 0]).window.is_none());
    assert!(reply([5, 0, 6]).window.is_none());
}

/// The names the state script reads as `var.<name>`.
fn used(var: &str) -> Vec<String> {
    let mut names = Vec::new();
    let pattern = format!("{var}.");
    for (at, _) in SOURCE.match_indices(&pattern) {
        let before = SOURCE[..at].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = SOURCE[at + pattern.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.push(name);
    }
    names
}

#[test]
fn the_scripts_names_are_defined_once_for_both_ends() {
    let prelude = prelude();
    for (var, all) in [
        ("A", Arg::ALL.iter().map(|(_, l)| *l).collect::<Vec<_>>()),
        ("R", Field::ALL.iter().map(|(_, l)| *l).collect()),
    ] {
        let used = used(var);
        for (i, lua) in all.iter().enumerate() {
            assert!(
                prelude.contains(&format!(" {lua} = {}", i + 1)),
                "{var}.{lua}"
            );
            assert!(used.iter().any(|u| u == lua), "{var}.{lua} is never read");
        }
        for name in &used {
            assert!(all.contains(&name.as_str()), "{var}.{name} is not defined");
        }
    }
    // Nothing positional is left but the probe reports after the names.
    let positional = SOURCE
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .filter(|l| l.contains("ARGV[") && !l.contains("ARGV[A.") && !l.contains("ARGV[i"));
    assert_eq!(positional.count(), 0);
    // Each argument is sent in its place: `Args::put` checks it as it
    // goes, and that none is left out.
    let rule = Rule::new(&Config::default().shared_rules(), None);
    let caller = Caller {
        channel: "c",
        replica: "r",
        quorum: 1,
    };
    let _ = invocation(
        &caller,
        "b",
        &Keys::new("p", "b"),
        &rule,
        0.0,
        &Request::default(),
    );
}

#[test]
fn rule_follows_the_breaker_configuration() {
    let c = Config {
        window: Window::Count(20),
        min_calls: 10,
        failure_rate: Some(0.5),
        probes: 3,
        close_after: 2,
        ..Config::default()
    };
    let r = Rule::new(&c.shared_rules(), None);
    assert_eq!((r.span_ms, r.buckets), (10_000, 10));
    assert!(r.aggregates());
    let off = Rule::new(
        &Config {
            window: Window::None,
            ..c.clone()
        }
        .shared_rules(),
        None,
    );
    assert!(!off.aggregates());
    let timed = Rule::new(
        &Config {
            window: Window::Time {
                span: Duration::from_secs(30),
                buckets: 6,
            },
            ..c
        }
        .shared_rules(),
        None,
    );
    assert_eq!((timed.span_ms, timed.buckets), (30_000, 6));
}

// === the state script against a real Redis ===

/// A connection to the Redis the test suite uses (`REDIS_URL`, or the local
/// one), or `None` when none answers outside CI (in CI it must).
async fn live(test: &str) -> Option<::redis::aio::MultiplexedConnection> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let conn = async {
        let client = ::redis::Client::open(url.as_str()).ok()?;
        tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }
    .await;
    if conn.is_none() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{test}: no Redis answers at {url}; in CI the Redis tests must run"
        );
        eprintln!("skipped: {test}: no Redis answers at {url} (set REDIS_URL)");
    }
    conn
}

/// A prefix no other test (or earlier run) uses.
fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("t-{test}-{}-{nanos:x}", std::process::id())
}

/// Breaker `b`: open 60 s, doubling up to 600 s, no jitter, one probe to
/// close, a failure rate rule over a 10 s window.
fn rule() -> Rule {
    let config = Config {
        open: Duration::from_secs(60),
        open_max: Some(Duration::from_secs(600)),
        backoff_multiplier: 2.0,
        jitter: 0.0,
        probes: 1,
        close_after: 1,
        probe_lease: Some(Duration::from_secs(60)),
        min_calls: 0,
        failure_rate: Some(0.5),
        ..Config::default()
    };
    Rule::new(&config.shared_rules(), Some((Duration::from_secs(10), 10)))
}

/// One call of the state script, as a replica sends it; the raw reply.
async fn sync(
    conn: &mut ::redis::aio::MultiplexedConnection,
    prefix: &str,
    req: Request,
) -> Vec<i64> {
    let channel = format!("{prefix}:events");
    let caller = Caller {
        channel: &channel,
        replica: "replica-a",
        quorum: 1,
    };
    let inv = invocation(&caller, "b", &Keys::new(prefix, "b"), &rule(), 1.0, &req);
    inv.invoke_async(conn).await.unwrap()
}

fn field(reply: &[i64], f: Field) -> i64 {
    reply[f.lua() - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_sums_the_window_and_trips_only_when_told() {
    let Some(mut conn) = live("the_script_sums_the_window_and_trips_only_when_told").await else {
        return;
    };
    let prefix = unique("sums");
    let report = |calls, failures| Request {
        calls,
        failures,
        ..Request::default()
    };
    // Every call failed, far past the rule: the script sums, it does not
    // judge.
    let first = sync(&mut conn, &prefix, report(10, 10)).await;
    assert_eq!(field(&first, Field::Code), 0, "{first:?}");
    assert_eq!(
        [Field::Calls, Field::Failures, Field::Slow].map(|f| field(&first, f)),
        [10, 10, 0]
    );
    let second = sync(&mut conn, &prefix, report(6, 1)).await;
    assert_eq!(field(&second, Field::Code), 0);
    assert_eq!(
        [Field::Calls, Field::Failures].map(|f| field(&second, f)),
        [16, 11]
    );
    // An exchange that adds nothing does not read the window.
    let read = sync(&mut conn, &prefix, Request::default()).await;
    assert_eq!(field(&read, Field::Calls), -1);
    // The replica that judged the sum says so, and the cluster opens.
    let trip = Request {
        trip: true,
        ..Request::default()
    };
    let opened = sync(&mut conn, &prefix, trip).await;
    assert_eq!(field(&opened, Field::Code), 1, "{opened:?}");
    assert_eq!(field(&opened, Field::Remaining), 60_000);
    let parsed = Reply::parse(&Value::Array(
        opened.iter().map(|&n| Value::Int(n)).collect(),
    ));
    assert!(parsed.is_some_and(|r| r.window.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_ends_only_the_open_period_a_heal_was_found_in() {
    use ::redis::AsyncCommands;
    use futures::StreamExt;
    use std::collections::HashMap;

    let test = "the_script_ends_only_the_open_period_a_heal_was_found_in";
    let Some(mut conn) = live(test).await else {
        return;
    };
    let prefix = unique("heal");
    let keys = Keys::new(&prefix, "b");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut pubsub = ::redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(format!("{prefix}:events")).await.unwrap();
    let mut messages = pubsub.into_on_message();
    let req =
        |epoch: i64, trip: bool, heal: bool, claim: &str, reports: &[(&str, &'static str)]| {
            Request {
                epoch: epoch as u64,
                trip,
                heal,
                claim: (!claim.is_empty()).then(|| claim.to_string()),
                reports: reports.iter().map(|(id, c)| (id.to_string(), *c)).collect(),
                ..Request::default()
            }
        };

    // Tripped, with two reopens behind it, and something in the window.
    let opened = sync(&mut conn, &prefix, req(0, true, false, "", &[])).await;
    assert_eq!(field(&opened, Field::Code), 1, "open: {opened:?}");
    let epoch = field(&opened, Field::Epoch);
    let _: () = conn.hset(&keys.state, "reopens", "2").await.unwrap();
    let _: () = conn.hset(&keys.window, "c:1", "5").await.unwrap();
    let msg = messages.next().await.unwrap();
    assert_eq!(
        msg.get_payload::<String>().unwrap(),
        format!("v2 open/{}/- {epoch} b", field(&opened, Field::Remaining))
    );

    // A heal found in another open period changes nothing.
    let stale = sync(&mut conn, &prefix, req(epoch - 1, false, true, "", &[])).await;
    assert_eq!(
        (field(&stale, Field::Code), field(&stale, Field::Epoch)),
        (1, epoch),
        "{stale:?}"
    );

    // The heal of this period: half-open now, as a new period, published;
    // the backoff and the window as they were.
    let healed = sync(&mut conn, &prefix, req(epoch, false, true, "", &[])).await;
    assert_eq!(
        (
            field(&healed, Field::Code),
            field(&healed, Field::Remaining)
        ),
        (2, 0),
        "{healed:?}"
    );
    let new_epoch = field(&healed, Field::Epoch);
    assert!(new_epoch > epoch);
    let fields: HashMap<String, String> = conn.hgetall(&keys.state).await.unwrap();
    assert_eq!(fields["state"], "open");
    assert_eq!(fields["reopens"], "2");
    assert_eq!(fields["len"], "60000");
    let window: HashMap<String, String> = conn.hgetall(&keys.window).await.unwrap();
    assert_eq!(window.get("c:1").map(String::as_str), Some("5"));
    let msg = messages.next().await.unwrap();
    assert_eq!(
        msg.get_payload::<String>().unwrap(),
        format!("v2 open/0/- {new_epoch} b"),
        "half-open, carried in the message"
    );

    // Healing a half-open circuit again changes nothing.
    let again = sync(&mut conn, &prefix, req(new_epoch, false, true, "", &[])).await;
    assert_eq!(
        (field(&again, Field::Code), field(&again, Field::Epoch)),
        (2, new_epoch),
        "{again:?}"
    );

    // A probe that fails after the heal reopens with the next step of the
    // backoff it had: 60 s × 2³, not 60 s.
    let claimed = sync(&mut conn, &prefix, req(new_epoch, false, false, "p1", &[])).await;
    assert_eq!(
        field(&claimed, Field::Granted),
        1,
        "the slot is granted: {claimed:?}"
    );
    let failed = sync(
        &mut conn,
        &prefix,
        req(new_epoch, false, false, "", &[("p1", "f")]),
    )
    .await;
    assert_eq!(field(&failed, Field::Code), 1, "{failed:?}");
    let left = field(&failed, Field::Remaining);
    assert!(
        (470_000..=480_000).contains(&left),
        "reopened for {left} ms"
    );
    let fields: HashMap<String, String> = conn.hgetall(&keys.state).await.unwrap();
    assert_eq!(fields["reopens"], "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_sums_the_fleets_spend_by_slice_and_no_transition_clears_it() {
    use crate::breaker::spend::Unit;
    use ::redis::AsyncCommands;

    let test = "the_script_sums_the_fleets_spend_by_slice_and_no_transition_clears_it";
    let Some(mut conn) = live(test).await else {
        return;
    };
    let prefix = unique("spend");
    let keys = Keys::new(&prefix, "b");
    let shape = Shape {
        width: Duration::from_secs(600),
        slices: 3,
        unit: Unit::Tokens,
        period: Period::Rolling(Duration::from_secs(1800)),
    };
    let spend = |amount| Request {
        spend: Some(SpendReport { amount, shape }),
        ..Request::default()
    };
    let slices = |reply: &[i64]| reply[Field::ALL.len()..].to_vec();

    let first = sync(&mut conn, &prefix, spend(100)).await;
    assert_eq!(field(&first, Field::Spent), 100, "{first:?}");
    assert_eq!(slices(&first), [0, 0, 100]);
    let left = field(&first, Field::SpendLeft);
    assert!((1..=600_000).contains(&left), "{left} ms left");
    // Another replica's charges join the same slice; what is not a slice
    // of the period is dropped, not summed and not raised.
    let _: () = conn.hset(&keys.spend, "garbage", "7").await.unwrap();
    let _: () = conn.hset(&keys.spend, "1", "not a number").await.unwrap();
    let second = sync(&mut conn, &prefix, spend(50)).await;
    assert_eq!(field(&second, Field::Spent), 150, "{second:?}");
    assert_eq!(slices(&second), [0, 0, 150]);
    let stored: Vec<String> = conn.hkeys(&keys.spend).await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");

    // A trip clears the window, never the spend: money spent stays spent.
    let trip = Request {
        trip: true,
        spend: Some(SpendReport { amount: 0, shape }),
        ..Request::default()
    };
    let opened = sync(&mut conn, &prefix, trip).await;
    assert_eq!(field(&opened, Field::Code), 1);
    assert_eq!(field(&opened, Field::Spent), 150);
    let parsed = Reply::parse(&Value::Array(
        opened.iter().map(|&n| Value::Int(n)).collect(),
    ))
    .unwrap();
    assert_eq!(parsed.spend.unwrap().slices, [0, 0, 150]);

    // Without a guard the exchange neither adds nor reads spend.
    let plain = sync(&mut conn, &prefix, Request::default()).await;
    assert_eq!(field(&plain, Field::Spent), -1);
    assert_eq!(plain.len(), Field::ALL.len());

    // Slices that do not add up to the sum are not the script's: unread.
    let mut forged = opened.clone();
    *forged.last_mut().unwrap() += 1;
    let forged = Reply::parse(&Value::Array(
        forged.iter().map(|&n| Value::Int(n)).collect(),
    ))
    .unwrap();
    assert!(forged.spend.is_none());
}

#[test]
fn guards_of_other_units_or_periods_keep_apart() {
    use crate::breaker::spend::Unit;
    let shape = |unit, period| Shape {
        width: Duration::from_secs(60),
        slices: 60,
        unit,
        period,
    };
    let hour = Period::Rolling(Duration::from_secs(3600));
    assert_eq!(
        Keys::spend("svc", "gpt-4o", &shape(Unit::MicroDollars, hour)),
        "{svc:gpt-4o}:v2:spend:usd_micros:r3600000"
    );
    assert_eq!(
        Keys::spend("svc", "gpt-4o", &shape(Unit::Tokens, Period::UtcDay)),
        "{svc:gpt-4o}:v2:spend:tokens:day"
    );
}
