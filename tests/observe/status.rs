//! The `status` feature: the JSON and the page, and the page in a real
//! browser (headless Chromium) against a real server.

use crate::runner::{Rt, Trial};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{Service, ServiceExt};
use tower_circuit_breaker::keyed::KeyedBreakers;
use tower_circuit_breaker::status::StatusPage;
use tower_circuit_breaker::{Breaker, Outcome};

/// A key as an attacker would send it: markup that changes the page if it
/// is ever parsed as HTML.
const HOSTILE: &str = "<script>document.body.setAttribute('data-owned','1')</script>\
<img src=x onerror=\"document.body.setAttribute('data-owned','2')\">";

async fn get(page: &StatusPage, uri: &str) -> http::Response<String> {
    let request = http::Request::get(uri).body(()).unwrap();
    page.clone().oneshot(request).await.unwrap()
}

fn tripped_set(page: &StatusPage) -> KeyedBreakers {
    KeyedBreakers::builder()
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(60))
        .jitter(0.0)
        .on_transition(page.listener())
        .build()
        .unwrap()
}

async fn the_json_lists_every_key_open_ones_first_with_window_next_probe_and_transitions() {
    let page = StatusPage::new();
    let set = tripped_set(&page);
    let page = page.keyed("models", &set);
    set.admit("claude").unwrap().record(Outcome::Success);
    set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    tokio::time::advance(Duration::from_secs(12)).await;

    let res = get(&page, "/breakers?format=json").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(res.headers()["cache-control"], "no-store");
    let json: serde_json::Value = serde_json::from_str(res.body()).unwrap();
    let rows = json["breakers"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let open = &rows[0];
    assert_eq!(open["breaker"], "models");
    assert_eq!(open["key"], "gpt-4o");
    assert_eq!(open["state"], "open");
    assert_eq!(open["next_probe_ms"], 48_000);
    assert_eq!(open["window"]["failures"], 1, "the window that tripped it");
    assert_eq!(open["counters"]["failures"], 1);
    let t = &open["transitions"][0];
    assert_eq!((&t["from"], &t["to"]), (&"closed".into(), &"open".into()));
    assert_eq!(t["reason"], "consecutive failures");
    assert_eq!(t["ago_ms"], 12_000);
    assert_eq!(rows[1]["key"], "claude");
    assert_eq!(rows[1]["state"], "closed");
    assert!(rows[1]["next_probe_ms"].is_null());
    assert_eq!(rows[1]["transitions"].as_array().unwrap().len(), 0);
}

async fn a_key_is_escaped_in_the_json_and_the_page_carries_no_data() {
    let page = StatusPage::new();
    let set = tripped_set(&page);
    let page = page.keyed("models", &set);
    set.admit(HOSTILE).unwrap().record(Outcome::Failure);

    let json = get(&page, "/?format=json").await.into_body();
    assert!(!json.contains('<') && !json.contains('>'), "{json}");
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        parsed["breakers"][0]["key"], HOSTILE,
        "escaped, not altered"
    );

    let res = get(&page, "/").await;
    assert_eq!(res.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(res.headers()["x-content-type-options"], "nosniff");
    let csp = res.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    assert!(!res.body().contains("data-owned"), "the page is static");
}

async fn the_json_shows_a_spend_guards_budget_and_spend() {
    use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
    let guarded = Breaker::builder()
        .name("agent")
        .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::UtcDay))
        .build()
        .unwrap();
    let plain = Breaker::builder().name("users").build().unwrap();
    let page = StatusPage::new().breaker(&guarded).breaker(&plain);
    let mut permit = guarded.admit().unwrap();
    permit.charge(Charge::Observed(1_250_000));
    permit.record(Outcome::Success);

    let res = get(&page, "/breakers?format=json").await;
    let json: serde_json::Value = serde_json::from_str(res.body()).unwrap();
    let rows = json["breakers"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["breaker"] == name).unwrap().clone();
    let spend = &row("agent")["spend"];
    assert_eq!(spend["budget"], 1_000_000);
    assert_eq!(spend["spent"], 1_250_000);
    assert_eq!(spend["unit"], "usd_micros");
    assert_eq!(spend["exceeded"], true);
    assert!(row("users")["spend"].is_null());
}

async fn only_get_and_head_are_served() {
    let breaker = Breaker::builder().name("chat").build().unwrap();
    let mut page = StatusPage::new().breaker(&breaker);
    let post = http::Request::post("/").body(()).unwrap();
    let res = ServiceExt::<http::Request<()>>::ready(&mut page)
        .await
        .unwrap()
        .call(post)
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
    assert_eq!(res.headers()["allow"], "GET, HEAD");
    let head = http::Request::head("/?format=json").body(()).unwrap();
    let res = ServiceExt::<http::Request<()>>::ready(&mut page)
        .await
        .unwrap()
        .call(head)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.body().is_empty());
}

// === in a real browser ===

/// Headless Chromium (`CHROMIUM`, else Debian's `/usr/bin/chromium`), if
/// it is here.
fn chromium() -> Option<PathBuf> {
    // `CHROMIUM`, when set, is the only place looked at.
    match std::env::var_os("CHROMIUM") {
        Some(path) => Some(PathBuf::from(path)).filter(|p| p.is_file()),
        None => [
            "/usr/bin/chromium",
            "/usr/bin/chromium-browser",
            "/usr/bin/google-chrome",
        ]
        .map(PathBuf::from)
        .into_iter()
        .find(|p| p.is_file()),
    }
}

/// Why the browser test cannot run here, if it cannot: the runner counts it
/// as skipped (and fails it under `CI=true`).
fn chromium_missing() -> Option<String> {
    chromium().is_none().then(|| {
        "the status page's browser test needs Chromium (apt-get install -y chromium, or set CHROMIUM)"
            .to_string()
    })
}

/// Loads `url`, lets the page run for `budget` of its own (virtual) time,
/// waiting for its fetches, and returns the DOM as it stands then.
async fn dump_dom(chrome: &PathBuf, url: &str, budget: Duration) -> String {
    let profile = std::env::temp_dir().join(format!(
        "tcb-status-{}-{}",
        std::process::id(),
        budget.as_millis()
    ));
    let run = tokio::process::Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox", // as root, Chromium refuses to start without it
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("Chromium ran for 30 s")
        .expect("Chromium starts");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "Chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The start tag of the table row of `key`.
fn row<'a>(dom: &'a str, key: &str) -> &'a str {
    let at = dom
        .find(&format!(r#"data-key="{key}""#))
        .unwrap_or_else(|| panic!("no row for {key}:\n{dom}"));
    let start = dom[..at].rfind("<tr").unwrap();
    let end = at + dom[at..].find('>').unwrap();
    &dom[start..=end]
}

async fn in_a_real_browser_the_page_shows_a_tripped_key_open_and_updates_when_it_closes() {
    let chrome = chromium().expect("the runner checked for Chromium");
    let page = StatusPage::new().refresh(Duration::from_millis(200));
    let set = tripped_set(&page);
    let page = page.keyed("models", &set);
    set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    set.admit("claude").unwrap().record(Outcome::Success);
    set.admit(HOSTILE).unwrap().record(Outcome::Failure);

    // Once armed, the first JSON the page gets still shows gpt-4o open, and
    // the circuit closes right after it is served.
    let armed = Arc::new(AtomicBool::new(false));
    let served = {
        let (armed, set) = (armed.clone(), set.clone());
        tower::service_fn(move |request: http::Request<axum::body::Body>| {
            let json = request.uri().query() == Some("format=json");
            let response = page.clone().call(request);
            if json && armed.swap(false, Ordering::SeqCst) {
                set.get("gpt-4o").unwrap().reset();
            }
            response
        })
    };
    let app = axum::Router::new().nest_service("/ops/breakers", served);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ops/breakers", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dom = dump_dom(&chrome, &url, Duration::from_millis(1_000)).await;
    let gpt = row(&dom, "gpt-4o");
    assert!(gpt.contains(r#"data-state="open""#), "{gpt}");
    assert!(row(&dom, "claude").contains(r#"data-state="closed""#));
    assert!(
        dom.contains("closed → open (consecutive failures)"),
        "{dom}"
    );
    assert!(dom.contains("<td class=\"key\">&lt;script&gt;document.body.setAttribute('data-owned','1')&lt;/script&gt;&lt;img"), "{dom}");
    assert!(
        !dom.contains("data-owned=\""),
        "a key ran as markup:\n{dom}"
    );

    armed.store(true, Ordering::SeqCst);
    let dom = dump_dom(&chrome, &url, Duration::from_millis(1_500)).await;
    let gpt = row(&dom, "gpt-4o");
    assert!(gpt.contains(r#"data-state="closed""#), "{gpt}");
    assert!(
        gpt.contains(r#"data-prev-state="open""#),
        "loaded open, then updated: {gpt}"
    );
    assert!(dom.contains("open → closed (reset)"), "{dom}");
    assert!(
        !dom.contains("data-owned=\""),
        "a key ran as markup:\n{dom}"
    );
}

/// This module's tests, for the runner.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio("status::the_json_lists_every_key_open_ones_first_with_window_next_probe_and_transitions", Rt::Paused, the_json_lists_every_key_open_ones_first_with_window_next_probe_and_transitions),
        Trial::tokio("status::a_key_is_escaped_in_the_json_and_the_page_carries_no_data", Rt::Paused, a_key_is_escaped_in_the_json_and_the_page_carries_no_data),
        Trial::tokio("status::only_get_and_head_are_served", Rt::Paused, only_get_and_head_are_served),
        Trial::tokio("status::the_json_shows_a_spend_guards_budget_and_spend", Rt::Paused, the_json_shows_a_spend_guards_budget_and_spend),
        Trial::tokio("status::in_a_real_browser_the_page_shows_a_tripped_key_open_and_updates_when_it_closes", Rt::Multi, in_a_real_browser_the_page_shows_a_tripped_key_open_and_updates_when_it_closes).skipped_unless(chromium_missing()),
    ]
}
