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

/// The server every test may share; tests keep apart by prefix.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379/";

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
        let mut cmd = Command::new("redis-server");
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
