//! Runs every example that needs nothing beyond 127.0.0.1 (and Redis, for
//! the two Redis examples) and checks what it prints, so that what users
//! copy keeps working and keeps reading well: durations as people write
//! them (`next probe in 281 ms`, never `Some(281.43739ms)`), each
//! transition after the line of the call that caused it, each figure once.
//!
//! The examples are built once, by this test, with every feature (`cargo
//! build --examples --all-features`, which reuses the test run's own build
//! when it too has every feature), and run as the user runs them. Without
//! Redis at `REDIS_URL` (default `redis://127.0.0.1:6379/`) the Redis
//! examples are skipped with a line saying so, unless `CI=true`, where a
//! missing Redis fails them.
#![cfg(not(loom))]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The examples' directory, after building them all once.
fn examples_dir() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "--examples", "--all-features", "--quiet"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        // What cargo set for this test, not for a build: a build script
        // that watches one of these (ring's does) would otherwise run again
        // and rebuild everything above it.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CARGO_PKG_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "LD_LIBRARY_PATH",
                ]
                .contains(&&*name)
            {
                cargo.env_remove(&*name);
            }
        }
        let status = cargo.status().expect("cargo runs");
        assert!(status.success(), "the examples build");
        // This test is target/<profile>/deps/examples-<hash>; the examples
        // are in target/<profile>/examples/ (the dev profile's, as built).
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("examples")
    })
}

/// Runs example `name` with `args`; its standard output, checked for
/// what every example must do: exit 0 and print no debug formatting of an
/// `Option`.
fn run(name: &str, args: &[&str]) -> String {
    let stdout = run_only(name, args);
    for line in stdout.lines() {
        assert!(
            !line.contains("Some(") && !line.contains("None"),
            "{name} prints an Option as Rust debug output: {line:?}"
        );
    }
    stdout
}

/// Runs example `name` with `args`: its standard output, once it exited 0
/// having printed something.
fn run_only(name: &str, args: &[&str]) -> String {
    let out = Command::new(examples_dir().join(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stdout.trim().is_empty(), "{name} printed nothing");
    stdout
}

/// The line after the first that starts with `prefix` (trimmed).
fn after<'a>(out: &'a str, prefix: &str) -> &'a str {
    let mut lines = out.lines().map(str::trim);
    lines
        .by_ref()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{out}"));
    lines.next().unwrap_or("")
}

/// Whether the text has a wait as people write it: a whole number of
/// milliseconds or seconds, as in `281 ms` or `7 s`.
fn has_wait(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.windows(2).any(|w| {
        matches!(w[1].trim_end_matches([')', ',', ';']), "ms" | "s") && w[0].parse::<u64>().is_ok()
    })
}

/// Whether Redis answers at `REDIS_URL`; `false` prints why the test is
/// skipped, and under `CI=true` fails it instead.
fn redis_or_skip(test: &str) -> bool {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let addr = url
        .trim_start_matches("redis://")
        .split(['/', '@'])
        .find(|s| s.contains(':'))
        .unwrap_or("127.0.0.1:6379")
        .to_string();
    let up = std::net::TcpStream::connect_timeout(
        &addr
            .parse()
            .unwrap_or_else(|_| "127.0.0.1:6379".parse().unwrap()),
        Duration::from_secs(1),
    )
    .is_ok();
    if !up {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: no Redis at {url} (CI=true: a missing service fails)"
        );
        eprintln!("skipped: {test}: no Redis at {url}");
    }
    up
}

/// Runs and finishes; its wording is checked where it is written.
#[test]
fn quickstart() {
    let out = run_only("quickstart", &[]);
    assert!(out.contains("a health probe found it"), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.contains("upstream saw") && last.ends_with("circuit closed"),
        "{out}"
    );
}

#[test]
fn hyper_client() {
    let out = run("hyper_client", &[]);
    let rejected = out
        .lines()
        .find(|l| l.contains("rejected"))
        .expect("a rejection");
    assert!(rejected.contains("circuit 'chat' open"), "{rejected}");
    assert!(has_wait(rejected), "{rejected}");
    let limited = out.lines().find(|l| l.contains("429")).expect("a 429");
    assert!(limited.contains("retry-after 7 s"), "{limited}");
    assert!(
        out.lines().last().unwrap().contains("state closed"),
        "{out}"
    );
}

#[test]
fn reqwest_client() {
    let out = run("reqwest_client", &[]);
    assert!(
        after(&out, "call 3:").starts_with("breaker: closed -> open"),
        "the transition follows the call that tripped it:\n{out}"
    );
    let rejected = out.lines().find(|l| l.contains("rejected")).unwrap();
    assert!(has_wait(rejected), "{rejected}");
    assert!(
        after(&out, "call 6:").starts_with("breaker: open -> half-open"),
        "the probe's transitions follow its line:\n{out}"
    );
    assert!(out.contains("is_connect() = true"), "{out}");
}

#[test]
fn reqwest_middleware_client() {
    let out = run("reqwest_middleware_client", &[]);
    let rejected = out.lines().find(|l| l.contains("rejected")).unwrap();
    assert_eq!(
        rejected.matches("next probe").count(),
        1,
        "the wait is given once: {rejected}"
    );
    assert!(has_wait(rejected), "{rejected}");
    assert!(
        after(&out, "tower call: 500").starts_with("breaker: closed -> open"),
        "the transition follows the call that tripped it:\n{out}"
    );
}

#[test]
fn async_openai_client() {
    let out = run("async_openai_client", &[]);
    assert!(out.contains("streamed: \"pong\""), "{out}");
    assert!(
        after(&out, "call 1:").starts_with("breaker: closed -> open"),
        "the transition follows the call that tripped it:\n{out}"
    );
    let rejected = out.lines().find(|l| l.contains("rejected")).unwrap();
    assert!(has_wait(rejected), "{rejected}");
}

#[test]
fn tonic_status() {
    let out = run("tonic_status", &[]);
    assert!(
        after(&out, "call 2:").starts_with("breaker: closed -> open"),
        "the transition follows the call that tripped it:\n{out}"
    );
    let call3 = out.lines().find(|l| l.starts_with("call 3:")).unwrap();
    assert!(call3.contains("Unavailable") && has_wait(call3), "{call3}");
    assert!(out.contains("call 4: hello again"), "{out}");
}

#[test]
fn tonic_client() {
    let out = run("tonic_client", &[]);
    assert!(out.contains("Unavailable: circuit open"), "{out}");
    assert!(out.contains("unary: \"echo: hello\""), "{out}");
}

#[test]
fn axum_app() {
    let out = run("axum_app", &[]);
    assert!(out.contains("retry-after: 1"), "{out}");
    assert!(
        out.lines().last().unwrap().contains("circuit closed"),
        "{out}"
    );
}

#[test]
fn keyed_memory() {
    let out = run("keyed_memory", &[]);
    assert!(out.contains("keys held 10000 (cap 10,000)"), "{out}");
}

#[test]
fn status_page() {
    let out = run("status_page", &[]);
    let json: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(json["breakers"][0]["state"], "open", "{out}");
}

#[test]
fn prometheus() {
    let out = run("prometheus", &[]);
    assert!(
        out.contains("circuit_breaker_state{breaker=\"gpt-4o\",key=\"\"} 1"),
        "{out}"
    );
    assert!(
        out.contains(
            "circuit_breaker_time_to_first_byte_seconds_bucket{breaker=\"gpt-4o\",key=\"\",le=\"+Inf\"} 3"
        ),
        "the time to first byte is a histogram:\n{out}"
    );
}

#[test]
fn redis_overhead() {
    if !redis_or_skip("redis_overhead") {
        return;
    }
    let out = run("redis_overhead", &["20000", "2"]);
    assert!(out.contains("ratio shared/local median"), "{out}");
    assert!(
        out.contains("noise"),
        "the ratio comes with a word about noise:\n{out}"
    );
}

#[test]
fn redis_replicas() {
    if !redis_or_skip("redis_replicas") {
        return;
    }
    let out = run("redis_replicas", &["3", "3"]);
    assert!(out.contains("all replicas reject"), "{out}");
}
