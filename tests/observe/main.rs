//! Observability, each behind its feature: metrics through the `metrics`
//! facade scraped as Prometheus reads them, and the status page in a real
//! browser.

#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "status")]
mod status;
