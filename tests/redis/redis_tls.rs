//! A replica pair sharing state over `rediss://`, against a `redis-server`
//! the test starts with `--tls-port` and a certificate authority it makes
//! with the `openssl` command.

use crate::redis_support;
use crate::runner::{Rt, Trial};

use std::path::Path;
use std::time::Duration;

use redis::TlsCertificates;
use tower_circuit_breaker::redis::{Backend, Client};
use tower_circuit_breaker::{Breaker, Outcome, State, TripMode};

use redis_support::{eventually, free_port, run, scratch_dir, unique_prefix, Server};

const WAIT: Duration = Duration::from_secs(5);

/// A CA, and a certificate it signed for 127.0.0.1.
async fn make_certificates(dir: &Path) {
    let p = |f: &str| dir.join(f).display().to_string();
    let limit = Duration::from_secs(30);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let (ca_key, ca_crt) = (p("ca.key"), p("ca.crt"));
    let mut args = vec!["req", "-x509", "-days", "1", "-subj", "/CN=test ca"];
    args.extend(ec);
    args.extend(["-keyout", &ca_key, "-out", &ca_crt]);
    run("openssl", &args, limit).await;
    let (key, csr, crt, ext) = (p("server.key"), p("server.csr"), p("server.crt"), p("ext"));
    std::fs::write(&ext, "subjectAltName = IP:127.0.0.1\n").unwrap();
    let mut args = vec!["req", "-subj", "/CN=127.0.0.1"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr]);
    run("openssl", &args, limit).await;
    let args = [
        "x509",
        "-req",
        "-days",
        "1",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-extfile",
        &ext,
        "-out",
        &crt,
    ];
    run("openssl", &args, limit).await;
}

fn tls_client(port: u16, ca: &[u8]) -> Client {
    Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}/"),
        TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.to_vec()),
        },
    )
    .expect("a valid rediss url")
}

async fn replicas_share_state_over_rediss_with_a_certificate_the_test_made() {
    if redis_support::skip() {
        return;
    }
    let has_openssl = std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openssl {
        let why = "no `openssl` command to make the test's certificates";
        crate::runner::skip(why.to_string());
    }
    let dir = scratch_dir("tls");
    make_certificates(&dir).await;
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let port = free_port();
    let path = |f: &str| dir.join(f).display().to_string();
    let args = vec![
        "--port".into(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ];
    let ca_for_check = ca.clone();
    let mut server = Server::start_on(
        port,
        args,
        Vec::new(),
        Some(Box::new(move |port| tls_client(port, &ca_for_check))),
    )
    .await;

    // The port speaks TLS only, and only to who trusts the test's CA.
    let plain = Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let plain = tokio::time::timeout(Duration::from_secs(2), async {
        let mut c = plain.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await
    })
    .await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "no plain-text redis on the TLS port"
    );
    let untrusted = Client::open(format!("rediss://127.0.0.1:{port}/")).unwrap();
    let untrusted = tokio::time::timeout(
        Duration::from_secs(2),
        untrusted.get_multiplexed_async_connection(),
    )
    .await;
    assert!(
        !matches!(untrusted, Ok(Ok(_))),
        "a certificate from an unknown CA is refused"
    );

    let prefix = unique_prefix("tls");
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            let breaker = Breaker::builder()
                .trip_mode(TripMode::Open)
                .name("upstream")
                .consecutive_failures(2)
                .jitter(0.0)
                .open_duration(Duration::from_secs(30))
                .build()
                .unwrap();
            let attachment = Backend::builder(tls_client(port, &ca))
                .prefix(prefix.as_str())
                .flush_interval(Duration::from_millis(20))
                .build()
                .unwrap()
                .attach(&breaker)
                .unwrap();
            (breaker, attachment)
        })
        .collect();
    let shared = eventually(WAIT, || async {
        replicas.iter().all(|(_, a)| a.is_shared())
    })
    .await;
    assert!(shared, "both replicas reach redis over TLS");

    let began = tokio::time::Instant::now();
    for _ in 0..2 {
        replicas[0].0.admit().unwrap().record(Outcome::Failure);
    }
    let spread = eventually(WAIT, || async { replicas[1].0.state() == State::Open }).await;
    assert!(spread, "a trip reaches the other replica over TLS");
    eprintln!(
        "over TLS: a trip reached the other replica in {:?}",
        began.elapsed()
    );

    // Cluster-wide controls go over TLS too.
    replicas[1].1.reset_cluster("upstream").await.unwrap();
    let closed = eventually(WAIT, || async {
        replicas.iter().all(|(b, _)| b.state() == State::Closed)
    })
    .await;
    assert!(closed);

    server.kill().await;
    let _ = std::fs::remove_dir_all(dir);
}

pub fn trials() -> Vec<Trial> {
    vec![Trial::tokio(
        "redis_tls::replicas_share_state_over_rediss_with_a_certificate_the_test_made",
        Rt::Multi,
        replicas_share_state_over_rediss_with_a_certificate_the_test_made,
    )]
}
