//! A small test runner (this binary has `harness = false`) that reports a
//! test skipped at run time as skipped, not passed: the status page's
//! browser test needs Chromium, and without it the summary counts it under
//! `skipped` with the reason, so a run without the browser reads as one.
//! Under `CI=true` a missing service fails the test instead.
//!
//! It takes what `cargo test` passes on: a name filter (`--exact` to match
//! whole names), `--list`, `--skip NAME`; other flags are ignored. Tests
//! run one after another, each on a thread of its own, a panic failing it.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

type Body = Box<dyn FnOnce() + Send + 'static>;

/// One test: its name, and either the code to run or why it is skipped.
pub struct Trial {
    name: &'static str,
    run: Result<Body, String>,
}

/// How a test's runtime is built, as `#[tokio::test]` would.
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
        }
    }

    /// The test is skipped, because `why` (checked before running it):
    /// outside CI it counts as skipped; with `CI=true` it fails.
    pub fn skipped_unless(self, why: Option<String>) -> Trial {
        match why {
            None => self,
            Some(why) if in_ci() => Trial {
                name: self.name,
                run: Ok(Box::new(move || {
                    panic!("CI=true: a missing service fails the test: {why}")
                })),
            },
            Some(why) => Trial {
                name: self.name,
                run: Err(why),
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
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exact" => exact = true,
            "--list" => list = true,
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
    if list {
        for t in &trials {
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
                    Err(_) => {
                        println!("test {} ... FAILED", trial.name);
                        failed.push(trial.name);
                    }
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
        "\ntest result: {}. {} passed; {} failed; {} skipped; {filtered_out} filtered out\n",
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
