//! The `status` feature: the JSON and the page, and the page in a real
//! browser (headless Chromium) against a real server.

use crate::runner::{Rt, Trial};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

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
        .trip_mode(TripMode::Open)
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
        .trip_mode(TripMode::Open)
        .name("agent")
        .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::UtcDay))
        .build()
        .unwrap();
    let plain = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("users")
        .build()
        .unwrap();
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
    assert_eq!(spend["period"], "utc_day");
    assert!(row("users")["spend"].is_null());
}

async fn a_forced_open_or_disabled_key_shows_the_calls_its_window_held() {
    let page = StatusPage::new();
    let set = tripped_set(&page);
    let page = page.keyed("models", &set);
    for key in ["forced", "disabled"] {
        set.admit(key).unwrap().record(Outcome::Success);
    }
    set.admit("forced").unwrap().record(Outcome::Ignored);
    set.get("forced").unwrap().force_open();
    set.get("disabled").unwrap().disable();

    let json: serde_json::Value =
        serde_json::from_str(get(&page, "/?format=json").await.body()).unwrap();
    let rows = json["breakers"].as_array().unwrap();
    let row = |key: &str| rows.iter().find(|r| r["key"] == key).unwrap().clone();
    let forced = row("forced");
    assert_eq!(forced["state"], "forced-open");
    assert_eq!(forced["counters"]["admitted"], 2);
    assert_eq!(
        forced["window"]["calls"], 1,
        "the success; an ignored call is in no window"
    );
    assert_eq!(row("disabled")["state"], "disabled");
    assert_eq!(row("disabled")["window"]["calls"], 1);
}

async fn the_json_shows_each_keys_trip_thresholds_beside_its_window() {
    let page = StatusPage::new();
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .count_window(20)
        .min_calls(10)
        .failure_rate(0.5)
        .override_key("flaky", |b| {
            b.time_window(Duration::from_secs(60), 6)
                .failure_rate(0.8)
                .slow_call(Duration::from_secs(20), 0.9)
                .consecutive_failures(5)
        })
        .build()
        .unwrap();
    let page = page.keyed("models", &set);
    for outcome in [Outcome::Failure, Outcome::Success, Outcome::Success] {
        set.admit("gpt-4o").unwrap().record(outcome);
    }
    set.admit("flaky").unwrap().record(Outcome::Success);

    let json: serde_json::Value =
        serde_json::from_str(get(&page, "/?format=json").await.body()).unwrap();
    let rows = json["breakers"].as_array().unwrap();
    let row = |key: &str| rows.iter().find(|r| r["key"] == key).unwrap().clone();
    let gpt = row("gpt-4o");
    assert_eq!(gpt["window"]["calls"], 3);
    let rate = gpt["window"]["failure_rate"].as_f64().unwrap();
    assert!((rate - 1.0 / 3.0).abs() < 1e-9, "{rate}");
    assert_eq!(
        gpt["thresholds"],
        serde_json::json!({
            "window": {"calls": 20}, "min_calls": 10, "failure_rate": 0.5,
            "slow_call_ms": null, "slow_call_rate": null, "consecutive_failures": null,
        })
    );
    assert_eq!(
        row("flaky")["thresholds"],
        serde_json::json!({
            "window": {"span_ms": 60_000, "buckets": 6}, "min_calls": 10, "failure_rate": 0.8,
            "slow_call_ms": 20_000, "slow_call_rate": 0.9, "consecutive_failures": 5,
        })
    );
}

/// Three replicas on one real Redis: the page shows them alive, the quorum
/// `quorum_fraction(0.5)` puts in force, and that they share state.
#[cfg(feature = "redis")]
async fn the_json_shows_a_redis_fleet_its_quorum_and_whether_it_shares() {
    use crate::redis_support::{backend, eventually, shared_url, skip, unique_prefix};
    if skip() {
        return;
    }
    let prefix = unique_prefix("status-fleet");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let backend = backend(shared_url(), &prefix)
            .resync_interval(Duration::from_millis(100))
            .quorum_fraction(0.5)
            .build()
            .unwrap();
        let breaker = Breaker::builder()
            .trip_mode(TripMode::Open)
            .name("chat")
            .build()
            .unwrap();
        let attachment = backend.attach(&breaker).unwrap();
        replicas.push((breaker, attachment));
    }
    let page = StatusPage::new()
        .breaker(&replicas[0].0)
        .fleet("redis", &replicas[0].1);
    let fleet = || {
        let json: serde_json::Value = serde_json::from_str(&page.to_json()).unwrap();
        json["fleets"].clone()
    };
    let want = serde_json::json!([{"name": "redis", "alive": 3, "quorum": 2, "shared": true}]);
    let seen = eventually(Duration::from_secs(10), || async { fleet() == want }).await;
    assert!(seen, "{}", fleet());
    for (_, attachment) in replicas {
        attachment.detach().await;
    }
}

async fn only_get_and_head_are_served() {
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("chat")
        .build()
        .unwrap();
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
    let out = chromium_run(chrome, url, budget, &["--dump-dom".into()]).await;
    String::from_utf8(out).unwrap()
}

/// Runs Chromium on `url` for `budget` of the page's virtual time with
/// `extra` arguments; returns what it printed.
async fn chromium_run(chrome: &PathBuf, url: &str, budget: Duration, extra: &[String]) -> Vec<u8> {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let profile = std::env::temp_dir().join(format!(
        "tcb-status-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
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
        .args(extra)
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
    out.stdout
}

/// The text of some HTML: its tags left out, `&nbsp;` as a space.
fn text(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for ch in html.chars() {
        match ch {
            '<' => in_tag = true,
            '>' => in_tag = false,
            ch if !in_tag => out.push(ch),
            _ => {}
        }
    }
    out.replace("&nbsp;", " ")
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
        text(&dom).contains("closed → open (consecutive failures)"),
        "{dom}"
    );
    assert!(
        dom.contains("<span class=\"seg\">&lt;script&gt;document.</span>"),
        "{dom}"
    );
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
    assert!(text(&dom).contains("open → closed (reset)"), "{dom}");
    assert!(
        !dom.contains("data-owned=\""),
        "a key ran as markup:\n{dom}"
    );
}

/// `chromedriver` (`CHROMEDRIVER`, else Debian's `/usr/bin/chromedriver`),
/// if it is here: the layout test sets the viewport through it.
fn chromedriver() -> Option<PathBuf> {
    match std::env::var_os("CHROMEDRIVER") {
        Some(path) => Some(PathBuf::from(path)).filter(|p| p.is_file()),
        None => Some(PathBuf::from("/usr/bin/chromedriver")).filter(|p| p.is_file()),
    }
}

fn chromedriver_missing() -> Option<String> {
    chromium_missing().or_else(|| {
        chromedriver().is_none().then(|| {
            "the status page's layout test needs chromedriver (apt-get install -y chromium-driver, or set CHROMEDRIVER)"
                .to_string()
        })
    })
}

/// A WebDriver session of headless Chromium, driven over HTTP.
struct Driver {
    _process: tokio::process::Child,
    base: String,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
}

impl Driver {
    /// Starts chromedriver on a free port and opens a session.
    async fn start(chrome: &PathBuf) -> (Driver, String) {
        use tokio::io::AsyncBufReadExt;
        let mut process = tokio::process::Command::new(chromedriver().unwrap())
            .arg("--port=0")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let mut lines = tokio::io::BufReader::new(process.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(port) =
                    line.strip_prefix("ChromeDriver was started successfully on port ")
                {
                    return port.trim_end_matches('.').parse::<u16>().unwrap();
                }
            }
            panic!("chromedriver ended before it said its port");
        })
        .await
        .expect("chromedriver said its port within 30 s");
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let driver = Driver {
            _process: process,
            base: format!("http://127.0.0.1:{port}"),
            client,
        };
        let session = driver
            .send(
                http::Method::POST,
                "/session",
                serde_json::json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
                    "binary": chrome,
                    "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--no-first-run", "--disable-extensions", "--hide-scrollbars"],
                }}}}),
            )
            .await;
        let id = session["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        (driver, id)
    }

    /// One WebDriver command; its `value`.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        use http_body_util::BodyExt;
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        let body = if method == http::Method::GET || method == http::Method::DELETE {
            bytes::Bytes::new()
        } else {
            bytes::Bytes::from(body.to_string())
        };
        request = request.header("content-length", body.len());
        let response = self
            .client
            .request(request.body(http_body_util::Full::new(body)).unwrap())
            .await
            .expect("chromedriver answers");
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(status.is_success(), "{path}: {status} {json}");
        json["value"].clone()
    }

    /// A Chrome DevTools command through the session.
    async fn cdp(&self, id: &str, cmd: &str, params: serde_json::Value) -> serde_json::Value {
        let path = format!("/session/{id}/goog/cdp/execute");
        self.send(
            http::Method::POST,
            &path,
            serde_json::json!({"cmd": cmd, "params": params}),
        )
        .await
    }
}

/// Measures the page in the page, once it has shown the JSON: every word
/// of every cell (a key's runs between separators, a badge, a number with
/// its unit) must lie on one line and inside its cell and the viewport, a
/// key cut short by an ellipsis must carry the whole key in its title, and
/// the page must not scroll sideways. Returns what it found.
const MEASURE: &str = r##"
"use strict";
const done = arguments[arguments.length - 1];
(function check() {
  if (document.body.dataset.polls === "0") { setTimeout(check, 20); return; }
  const vw = document.documentElement.clientWidth;
  const problems = [];
  let words = 0, ellipsized = 0;
  const inside = (r, box) => r.left >= box.left - 0.5 && r.right <= box.right + 0.5;
  const walk = document.createTreeWalker(document.getElementById("rows"), NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const td = n.parentElement.closest("td").getBoundingClientRect();
    const clip = n.parentElement.closest(".seg");
    for (const m of n.data.matchAll(/\S+/g)) {
      words += 1;
      const range = document.createRange();
      range.setStart(n, m.index);
      range.setEnd(n, m.index + m[0].length);
      const rects = [...range.getClientRects()].filter(r => r.width > 0);
      const lines = new Set(rects.map(r => Math.round(r.bottom)));
      if (lines.size > 1) problems.push("on " + lines.size + " lines: " + m[0]);
      // A run cut by its ellipsis is measured by its box, not its text.
      const boxes = clip ? [clip.getBoundingClientRect()] : rects;
      for (const r of boxes) {
        if (!inside(r, td)) problems.push("out of its cell: " + m[0]);
        if (r.left < 0 || r.right > vw + 0.5) problems.push("out of the viewport: " + m[0]);
      }
    }
  }
  for (const seg of document.querySelectorAll("#rows .seg")) {
    if (seg.scrollWidth > seg.clientWidth) {
      ellipsized += 1;
      const key = seg.closest(".key");
      const whole = [...key.children].map(c => c.textContent).join("");
      if (key.title !== whole) problems.push("cut with no title: " + whole);
    }
  }
  const badges = document.querySelectorAll("#rows .state");
  for (const badge of badges) {
    if (badge.getClientRects().length !== 1 || badge.scrollWidth > badge.clientWidth)
      problems.push("badge wraps or is cut: " + badge.textContent);
  }
  if (document.documentElement.scrollWidth > vw) problems.push("the page scrolls sideways");
  // How narrow the table could be (as a table: wide screens only).
  const table = document.querySelector("table");
  table.style.width = "min-content";
  const tableMin = Math.ceil(table.getBoundingClientRect().width);
  table.style.width = "";
  done({ window: innerWidth, vw, words, badges: badges.length, ellipsized, tableMin, problems });
})();
"##;

/// Where the screenshots go: the target directory.
fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .to_path_buf()
}

/// Standard base64, as WebDriver and DevTools send screenshots.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

async fn in_a_real_browser_no_key_or_badge_breaks_mid_word_at_1280_and_390_px() {
    use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
    let chrome = chromium().expect("the runner checked for Chromium");
    let page = StatusPage::new().refresh(Duration::from_secs(60));
    let set = KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .count_window(20)
        .min_calls(10)
        .failure_rate(0.5)
        .consecutive_failures(3)
        .slow_call(Duration::from_secs(20), 0.8)
        .open_duration(Duration::from_secs(60))
        .jitter(0.0)
        .on_transition(page.listener())
        .build()
        .unwrap();
    let forced = "anthropic/claude-3-5-sonnet-20241022";
    let long = "tenant:acme-corporation-international/eu-west-1/gpt-4o-mini-2024-07-18";
    // A key made by `header_hashed`: one run with no separator in it.
    let hashed = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    for _ in 0..3 {
        set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    }
    for outcome in [Outcome::Failure, Outcome::Success, Outcome::Success] {
        set.admit(long).unwrap().record(outcome);
    }
    set.admit(hashed).unwrap().record(Outcome::Success);
    set.admit(forced).unwrap().record(Outcome::Success);
    set.get(forced).unwrap().force_open();
    set.admit("text-embedding-3-large")
        .unwrap()
        .record(Outcome::Success);
    set.get("text-embedding-3-large").unwrap().disable();
    let agent = Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("agent-loop/o1-preview")
        .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::UtcDay))
        .on_transition(page.listener())
        .build()
        .unwrap();
    let mut permit = agent.admit().unwrap();
    permit.charge(Charge::Observed(1_250_000));
    permit.record(Outcome::Success);
    let page = page.keyed("models", &set).breaker(&agent);

    let app = axum::Router::new().nest_service("/ops/breakers", page);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ops/breakers", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (driver, id) = Driver::start(&chrome).await;
    let checks = async {
        let session = format!("/session/{id}");
        let post = http::Method::POST;
        for width in [1280, 1024, 390] {
            driver
                .cdp(
                    &id,
                    "Emulation.setDeviceMetricsOverride",
                    serde_json::json!({
                        "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": false,
                    }),
                )
                .await;
            driver
                .send(
                    post.clone(),
                    &format!("{session}/url"),
                    serde_json::json!({"url": url}),
                )
                .await;
            let layout = driver
                .send(
                    post.clone(),
                    &format!("{session}/execute/async"),
                    serde_json::json!({
                        "script": MEASURE, "args": [],
                    }),
                )
                .await;
            // Saved before the checks, to be looked at when one fails.
            let shot = driver
                .cdp(
                    &id,
                    "Page.captureScreenshot",
                    serde_json::json!({
                        "format": "png", "captureBeyondViewport": true,
                    }),
                )
                .await;
            let path = target_dir().join(format!("status-{width}.png"));
            std::fs::write(&path, base64(shot["data"].as_str().unwrap())).unwrap();
            eprintln!("saved {}", path.display());
            eprintln!("{width} px: {layout}");
            assert_eq!(layout["window"], width, "the viewport is {width} px wide");
            assert_eq!(layout["badges"], 6, "{layout}");
            assert!(
                layout["ellipsized"].as_u64().unwrap() >= 1,
                "the hashed key is cut: {layout}"
            );
            assert_eq!(layout["problems"], serde_json::json!([]), "at {width} px");

            // The forced-open key's one call is in its window; the
            // thresholds stand beside the rates.
            let dom = driver
                .send(
                    http::Method::GET,
                    &format!("{session}/source"),
                    serde_json::json!({}),
                )
                .await;
            let dom = dom.as_str().unwrap();
            let row = &dom[dom.find(&format!(r#"data-key="{forced}""#)).unwrap()..];
            let row = &row[..row.find("</tr>").unwrap()];
            assert!(
                row.contains(
                    r#"data-label="window calls"><div class="v"><span class="nw">1</span>"#
                ),
                "{row}"
            );
            assert!(text(row).contains("0 (0 %)opens at 50 %"), "{row}");
            assert!(
                text(dom).contains("$1.25 of $1.00per UTC day · exceeded"),
                "{dom}"
            );
        }
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(checks)).await;
    driver
        .send(
            http::Method::DELETE,
            &format!("/session/{id}"),
            serde_json::json!({}),
        )
        .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// This module's tests, for the runner.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::tokio("status::the_json_lists_every_key_open_ones_first_with_window_next_probe_and_transitions", Rt::Paused, the_json_lists_every_key_open_ones_first_with_window_next_probe_and_transitions),
        Trial::tokio("status::a_key_is_escaped_in_the_json_and_the_page_carries_no_data", Rt::Paused, a_key_is_escaped_in_the_json_and_the_page_carries_no_data),
        #[cfg(feature = "redis")]
        Trial::tokio("status::the_json_shows_a_redis_fleet_its_quorum_and_whether_it_shares", Rt::Multi, the_json_shows_a_redis_fleet_its_quorum_and_whether_it_shares),
        Trial::tokio("status::only_get_and_head_are_served", Rt::Paused, only_get_and_head_are_served),
        Trial::tokio("status::the_json_shows_a_spend_guards_budget_and_spend", Rt::Paused, the_json_shows_a_spend_guards_budget_and_spend),
        Trial::tokio("status::a_forced_open_or_disabled_key_shows_the_calls_its_window_held", Rt::Paused, a_forced_open_or_disabled_key_shows_the_calls_its_window_held),
        Trial::tokio("status::the_json_shows_each_keys_trip_thresholds_beside_its_window", Rt::Paused, the_json_shows_each_keys_trip_thresholds_beside_its_window),
        Trial::tokio("status::in_a_real_browser_no_key_or_badge_breaks_mid_word_at_1280_and_390_px", Rt::Multi, in_a_real_browser_no_key_or_badge_breaks_mid_word_at_1280_and_390_px).skipped_unless(chromedriver_missing()),
        Trial::tokio("status::in_a_real_browser_the_page_shows_a_tripped_key_open_and_updates_when_it_closes", Rt::Multi, in_a_real_browser_the_page_shows_a_tripped_key_open_and_updates_when_it_closes).skipped_unless(chromium_missing()),
    ]
}
