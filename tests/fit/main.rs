//! Programs a new user writes from the docs alone: errors into anyhow and
//! boxes, and a rejection found through every wrapper.
#![cfg(not(loom))]

#[path = "../support/mod.rs"]
mod support;

mod errors;
