//! A small test runner for the binaries with `harness = false` (observe,
//! redis) that reports a test skipped for a missing service as skipped,
//! not passed: the status page's browser test needs Chromium, the Redis
//! tests a server, and without them the summary counts them under
//! `skipped` with the reason, so a run without the service reads as one.
//! Under `CI=true` a missing service fails the test instead.
//!
//! A test is skipped before it runs ([`Trial::skipped_unless`]) or from
//! inside ([`skip`], which unwinds with a [`Skipped`] the runner reads).
//!
//! It takes what `cargo test` passes on: a name filter (`--exact` to match
//! whole names), `--list`, `--skip NAME`, `--ignored` and
//! `--include-ignored`; other flags are ignored. Tests run one after
//! another, each on a thread of its own, a panic failing it.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

type Body = Box<dyn FnOnce() + Send + 'static>;

/// One test: its name, and either the code to run or why it is skipped.
pub struct Trial {
    name: &'static str,
    run: Result<Body, String>,
    ignored: bool,
}

/// What a test unwinds with when it finds, once running, that a service it
/// needs is missing: counted as skipped, with the reason.
pub struct Skipped(pub String);

/// Skips the running test because `why` (outside CI; with `CI=true` it
/// fails instead). Unwinds without the panic hook, so nothing is printed
/// but the runner's line.
#[allow(dead_code)]
pub fn skip(why: String) -> ! {
    if in_ci() {
        panic!("CI=true: a missing service fails the test: {why}");
    }
    std::panic::resume_unwind(Box::new(Skipped(why)))
}

/// How a test's runtime is built, as `#[tokio::test]` would.
#[allow(dead_code)]
pub enum Rt {
    /// Current thread, time paused (`start_paused = true`).
    Paused,
    /// Current thread, real time.
    Current,
    /// Two worker threads.
    Multi,
}

impl Trial {
    /// An async test on a runtime of the given kind.
    pub fn tokio<F>(name: &'static str, rt: Rt, test: fn() -> F) -> Trial
    where
        F: Future<Output = ()> + 'static,
    {
        Trial {
            name,
            run: Ok(Box::new(move || {
                let runtime = match rt {
                    Rt::Paused => tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .start_paused(true)
                        .build(),
                    Rt::Current => tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build(),
                    Rt::Multi => tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build(),
                }
                .expect("a runtime");
                let test: Pin<Box<dyn Future<Output = ()>>> = Box::pin(test());
                runtime.block_on(test);
            })),
            ignored: false,
        }
    }

    /// A plain test, as `#[test]`.
    #[allow(dead_code)]
    pub fn sync(name: &'static str, test: fn()) -> Trial {
        Trial {
            name,
            run: Ok(Box::new(test)),
            ignored: false,
        }
    }

    /// Runs only with `--ignored` or `--include-ignored`, as `#[ignore]`.
    #[allow(dead_code)]
    pub fn ignored(mut self) -> Trial {
        self.ignored = true;
        self
    }

    /// The test is skipped, because `why` (checked before running it):
    /// outside CI it counts as skipped; with `CI=true` it fails.
    #[allow(dead_code)]
    pub fn skipped_unless(self, why: Option<String>) -> Trial {
        match why {
            None => self,
            Some(why) if in_ci() => Trial {
                name: self.name,
                run: Ok(Box::new(move || {
                    panic!("CI=true: a missing service fails the test: {why}")
                })),
                ignored: self.ignored,
            },
            Some(why) => Trial {
                name: self.name,
                run: Err(why),
                ignored: self.ignored,
            },
        }
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Runs the trials the command line selects and prints a libtest-like
/// summary with a skip count; fails when any test failed.
pub fn run(trials: Vec<Trial>) -> ExitCode {
    let mut filter: Option<String> = None;
    let mut skip: Vec<String> = Vec::new();
    let (mut exact, mut list) = (false, false);
    let (mut only_ignored, mut include_ignored) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exact" => exact = true,
            "--list" => list = true,
            "--ignored" => only_ignored = true,
            "--include-ignored" => include_ignored = true,
            "--skip" => skip.extend(args.next()),
            // Flags of libtest's that take a value.
            "--test-threads" | "--format" | "--color" | "--logfile" => {
                args.next();
            }
            flag if flag.starts_with('-') => {}
            name => filter = Some(name.to_string()),
        }
    }
    let selected = |name: &str| {
        let by_filter = filter.as_deref().is_none_or(|f| match exact {
            true => name == f,
            false => name.contains(f),
        });
        by_filter && !skip.iter().any(|s| name.contains(s.as_str()))
    };
    let total = trials.len();
    let trials: Vec<Trial> = trials.into_iter().filter(|t| selected(t.name)).collect();
    let filtered_out = total - trials.len();
    let wanted = |t: &Trial| match (only_ignored, include_ignored) {
        (true, _) => t.ignored,
        (false, true) => true,
        (false, false) => !t.ignored,
    };
    let (trials, not_run): (Vec<Trial>, Vec<Trial>) = trials.into_iter().partition(wanted);
    let ignored = not_run.len();
    if list {
        for t in trials.iter().chain(&not_run) {
            println!("{}: test", t.name);
        }
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", trials.len());
    let (mut passed, mut failed, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    for trial in trials {
        match trial.run {
            Err(why) => {
                println!("test {} ... skipped: {why}", trial.name);
                skipped.push(trial.name);
            }
            Ok(body) => {
                let result = std::thread::Builder::new()
                    .name(trial.name.to_string())
                    .spawn(body)
                    .expect("a thread")
                    .join();
                match result {
                    Ok(()) => {
                        println!("test {} ... ok", trial.name);
                        passed.push(trial.name);
                    }
                    Err(payload) => match payload.downcast::<Skipped>() {
                        Ok(skipped_why) => {
                            println!("test {} ... skipped: {}", trial.name, skipped_why.0);
                            skipped.push(trial.name);
                        }
                        Err(_) => {
                            println!("test {} ... FAILED", trial.name);
                            failed.push(trial.name);
                        }
                    },
                }
            }
        }
    }
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; {} skipped; {ignored} ignored; {filtered_out} filtered out\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        passed.len(),
        failed.len(),
        skipped.len(),
    );
    if !skipped.is_empty() {
        println!(
            "{} skipped (a service is missing; with CI=true they fail): {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    match failed.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(101),
    }
}
