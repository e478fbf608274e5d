//! The tower glue and composition: the service, the stack, retry, failover,
//! streams, gRPC, axum, recovery and the traffic controls, over mocks and
//! real connections.

#[path = "../support/mod.rs"]
mod support;

mod axum_app;
mod by_kind;
mod controls;
mod durations;
mod failover;
mod failover_last_resort_keys;
mod failover_quota_body;
mod fallback_marker;
mod graded;
mod grpc;
mod half_open_pacing;
mod health_half_open;
mod health_half_open_real;
mod hedge;
mod keyed_open_cap;
mod keyed_stack;
mod limit;
mod llm_stream;
mod messages;
mod quota_pacing;
mod rate_limit_wait;
mod real_connection;
mod recovery;
mod retry;
mod retry_budget_rejections;
mod scripted_outage;
mod scripted_repeat;
mod select;
mod service;
mod spend;
mod stack;
mod stack_health;
mod stream_deadlines;
