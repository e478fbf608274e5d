//! Real Redis servers for the shared-state tests: the machine's one on 6379,
//! and private ones on free ports for tests that kill and restart them.

#![allow(dead_code)]

use std::future::Future;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};
use tower_circuit_breaker::redis::{Backend, BackendBuilder, Client};

/// The server every test may share (`REDIS_URL`, by default the machine's
/// one on 6379); tests keep apart by prefix.
pub fn shared_url() -> &'static str {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
    })
}

/// The `redis-server` binary the tests start their own servers with
/// (`REDIS_SERVER`, by default the one on `PATH`).
pub fn server_binary() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
}

/// Why the Redis tests cannot run here, if they cannot: the shared server
/// does not answer, or `redis-server` does not start. Checked once.
fn missing() -> Option<&'static str> {
    static MISSING: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    MISSING
        .get_or_init(|| {
            let answers = Client::open(shared_url()).ok().and_then(|c| {
                let mut conn = c.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
                redis::cmd("PING").query::<String>(&mut conn).ok()
            });
            if answers.is_none() {
                return Some(format!(
                    "no Redis answers at {} (set REDIS_URL)",
                    shared_url()
                ));
            }
            let runs = std::process::Command::new(server_binary())
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            (!runs).then(|| format!("`{}` does not run (set REDIS_SERVER)", server_binary()))
        })
        .as_deref()
}

/// Whether the running test must be skipped because Redis is not here:
/// outside CI it is counted as skipped, with why, by the binary's runner
/// (`tests/support/runner.rs`); in CI (`CI=true`) a missing Redis fails it.
/// Returns `false` when Redis is here.
pub fn skip() -> bool {
    match missing() {
        None => false,
        Some(why) => crate::runner::skip(why.to_string()),
    }
}

/// A prefix no other test (or earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "t-{test}-{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A backend builder on the shared server, with short intervals.
pub fn backend(url: &str, prefix: &str) -> BackendBuilder {
    Backend::builder(Client::open(url).expect("valid url"))
        .prefix(prefix)
        .flush_interval(Duration::from_millis(20))
        .resync_interval(Duration::from_millis(500))
        .timeout(Duration::from_millis(300))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(200))
}

/// A plain connection for setting up and inspecting keys.
pub async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    Client::open(url)
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis answers")
}

/// Polls `check` every 5 ms until it holds, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::timeout(limit, async {
        loop {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().unwrap().port()
}

/// A directory of its own under the system's temporary directory.
pub fn scratch_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique_prefix(test));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A `redis-server` of our own, as a child process, on a port that was free.
pub struct Server {
    pub port: u16,
    child: Option<Child>,
    /// Arguments after the port and the bind address.
    args: Vec<String>,
    /// Environment of the server process.
    envs: Vec<(String, String)>,
    /// How the test reaches it.
    client: Client,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(Vec::new(), Vec::new(), None).await
    }

    /// A server with extra arguments and environment; `client` (by default
    /// a plain one on the port) tells when it is up.
    pub async fn start_with(
        args: Vec<String>,
        envs: Vec<(String, String)>,
        client: Option<Box<dyn FnOnce(u16) -> Client>>,
    ) -> Server {
        Server::start_on(free_port(), args, envs, client).await
    }

    pub async fn start_on(
        port: u16,
        args: Vec<String>,
        envs: Vec<(String, String)>,
        client: Option<Box<dyn FnOnce(u16) -> Client>>,
    ) -> Server {
        let client = match client {
            Some(make) => make(port),
            None => Client::open(format!("redis://127.0.0.1:{port}/")).unwrap(),
        };
        let mut s = Server {
            port,
            child: None,
            args,
            envs,
            client,
        };
        s.restart().await;
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the server (again) on the same port and waits until it answers.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let plain = !self.args.iter().any(|a| a == "--tls-port");
        let mut cmd = Command::new(server_binary());
        if plain {
            cmd.args(["--port", &self.port.to_string()]);
        }
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("redis-server is installed");
        self.child = Some(child);
        let client = self.client.clone();
        let up = eventually(Duration::from_secs(10), || {
            let client = client.clone();
            async move {
                match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        assert!(up, "redis-server on port {} did not come up", self.port);
    }

    /// Kills the server and waits for it to exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// Runs a command to completion within `limit`; its stdout, or a panic with
/// its stderr.
pub async fn run(program: &str, args: &[&str], limit: Duration) -> String {
    let out = tokio::time::timeout(
        limit,
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} took longer than {limit:?}"))
    .unwrap_or_else(|e| panic!("{program} could not start: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Redis Cluster of our own: `masters` masters with one replica each, on
/// free ports, every node a child process.
pub struct RedisCluster {
    pub nodes: Vec<Server>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub async fn start(masters: usize) -> RedisCluster {
        let dir = scratch_dir("cluster");
        let mut nodes = Vec::new();
        for _ in 0..masters * 2 {
            let port = free_port();
            // A directory per node: replication writes its snapshot there.
            let own = dir.join(port.to_string());
            std::fs::create_dir_all(&own).unwrap();
            let args = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                "nodes.conf".into(),
                "--cluster-node-timeout".into(),
                "1000".into(),
                "--dir".into(),
                own.display().to_string(),
                // Replicas sync at once, not after the default 5 s.
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ];
            nodes.push(Server::start_on(port, args, Vec::new(), None).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        run("redis-cli", &args, Duration::from_secs(30)).await;
        let cluster = RedisCluster { nodes, dir };
        assert!(
            cluster.healthy(Duration::from_secs(20)).await,
            "the cluster did not come up"
        );
        // A replica that never synced cannot take over from its master.
        let synced = eventually(Duration::from_secs(20), || async {
            let mut replicas_up = 0;
            for n in &cluster.nodes {
                let mut c = connection(&n.url()).await;
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
                    .unwrap_or_default();
                if info.contains("master_link_status:up") {
                    replicas_up += 1;
                }
            }
            replicas_up == masters
        })
        .await;
        assert!(synced, "the replicas did not sync with their masters");
        cluster
    }

    /// A URL per node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// Whether, within `limit`, every running node says the cluster is ok
    /// and every slot has a running master.
    pub async fn healthy(&self, limit: Duration) -> bool {
        eventually(limit, || async {
            for n in self.nodes.iter().filter(|n| n.is_running()) {
                let Ok(c) = Client::open(n.url()) else {
                    return false;
                };
                let Ok(mut c) = c.get_multiplexed_async_connection().await else {
                    return false;
                };
                let info: String = match redis::cmd("CLUSTER").arg("INFO").query_async(&mut c).await
                {
                    Ok(i) => i,
                    Err(_) => return false,
                };
                if !info.contains("cluster_state:ok") {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// The port of the running master that serves `slot`, as a running node
    /// sees it.
    pub async fn master_of(&self, slot: u16) -> Option<u16> {
        let node = self.nodes.iter().find(|n| n.is_running())?;
        let mut c = connection(&node.url()).await;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c)
            .await
            .ok()?;
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port: u16 = fields[1].split(['@', ':']).nth(1)?.parse().ok()?;
            for range in &fields[8..] {
                let mut ends = range.split('-').map(|p| p.parse::<u16>());
                let lo = match ends.next() {
                    Some(Ok(lo)) => lo,
                    _ => continue,
                };
                let hi = match ends.next() {
                    Some(Ok(hi)) => hi,
                    None => lo,
                    _ => continue,
                };
                if (lo..=hi).contains(&slot) {
                    return Some(port);
                }
            }
        }
        None
    }

    /// The slot of `key`.
    pub async fn slot(&self, key: &str) -> u16 {
        let node = self.nodes.iter().find(|n| n.is_running()).unwrap();
        let mut c = connection(&node.url()).await;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap()
    }

    /// Kills the node on `port`.
    pub async fn kill(&mut self, port: u16) {
        for n in &mut self.nodes {
            if n.port == port {
                n.kill().await;
            }
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
