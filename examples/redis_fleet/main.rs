//! A fleet of replicas on one Redis, soaked: each replica a separate
//! backend (its own connections and replica id) with a keyed set of every
//! key; random trips, heals, operator resets and replica restarts, each
//! round checked for every replica reaching the cluster's state. Prints the
//! propagation of each kind of change (from the deciding replica's
//! transition to each other replica's: p50, p99, max), how long a restarted
//! replica takes to learn every open key, Redis commands per second per
//! replica and in all, Redis memory per breaker with state, and how many
//! replicas diverged.
//!
//! ```text
//! cargo run --release --features redis --example redis_fleet -- [replicas] [keys] [rounds]
//! ```
//!
//! Defaults: 10 replicas, 1,000 keys, 100 rounds, one every 250 ms;
//! exchanges every 50 ms, resync and heartbeat every 1 s, 20 calls per
//! second per replica.
//! `REDIS_URL` picks the server (default `redis://127.0.0.1:6379/`).

mod soak;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().ok());
    let replicas = args.next().flatten().unwrap_or(10).max(2);
    let keys = args.next().flatten().unwrap_or(1_000).max(1);
    let rounds = args.next().flatten().unwrap_or(100).max(1);
    let plan = soak::Plan::new(&url, replicas, keys, rounds);
    let prefix = format!("fleet-{}-{replicas}", std::process::id());
    println!(
        "{replicas} replicas, {keys} keys, {rounds} rounds every {:?}; flush {:?}, resync {:?}, {} calls/s per replica",
        plan.round_every, plan.flush, plan.resync, plan.calls_per_s
    );
    let mut f = soak::run(&plan, &prefix).await;
    for (what, v) in [
        ("trip", &mut f.trip),
        ("heal", &mut f.heal),
        ("operator reset", &mut f.control),
        ("restart: every open key learned", &mut f.join),
    ] {
        match soak::spread(v) {
            Some((p50, p99, max)) => println!(
                "  {what:<32} p50 {p50:>7.1} ms  p99 {p99:>7.1} ms  max {max:>7.1} ms  (n={})",
                v.len()
            ),
            None => println!("  {what:<32} none this run"),
        }
    }
    let secs = f.elapsed.as_secs_f64();
    let per_s = f.commands as f64 / secs;
    println!(
        "  redis commands: {per_s:.0}/s in all, {:.1}/s per replica, over {secs:.1} s",
        per_s / replicas as f64
    );
    println!(
        "  calls made: {:.1}/s per replica; {:.1} redis commands per call",
        f.calls as f64 / secs / replicas as f64,
        f.commands as f64 / f.calls.max(1) as f64
    );
    let steady = f.steady_elapsed.as_secs_f64().max(1e-9);
    let n = replicas as f64;
    println!(
        "  steady (rounds without a restart, {steady:.1} s): {:.1} commands/s and {:.1} script calls/s per replica",
        f.steady_commands as f64 / steady / n,
        f.steady_scripts as f64 / steady / n
    );
    f.join_commands.sort_unstable();
    if let Some(median) = f.join_commands.get(f.join_commands.len() / 2) {
        println!(
            "  a restarted replica's join: {median} commands (median of {})",
            f.join_commands.len()
        );
    }
    if f.breakers_stored > 0 {
        println!(
            "  redis memory: {} bytes per breaker with state ({} breakers)",
            f.bytes / f.breakers_stored as u64,
            f.breakers_stored
        );
    }
    println!(
        "  diverged: {} over {} rounds ({} operator resets unconfirmed)",
        f.diverged, f.rounds, f.unconfirmed
    );
}
