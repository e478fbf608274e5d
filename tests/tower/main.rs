//! The tower glue and composition: the service, the stack, retry, failover,
//! streams, gRPC, axum, recovery and the traffic controls, over mocks and
//! real connections.

#[path = "../support/mod.rs"]
mod support;

mod axum_app;
mod controls;
mod durations;
mod failover;
mod fallback_marker;
mod graded;
mod grpc;
mod half_open_pacing;
mod health_half_open;
mod keyed_stack;
mod llm_stream;
mod messages;
mod quota_pacing;
mod real_connection;
mod recovery;
mod retry;
mod scripted_outage;
mod service;
mod stack;
mod stream_deadlines;
