//! Reading the body of an error answer the failover moves on from.
//!
//! A failover that moves on from a 429 (or, with a rule table, a 400, 413
//! or 422) keeps that answer in case no later member answers, and drops it
//! once one does. Dropped unread, the answer's breaker hears of its head
//! only: a 429 counts as a rate limit, and OpenAI's `insufficient_quota`
//! body, which opens a quota-gated circuit, is never seen. So the kept
//! answer's body is read, through the member's own body wrapper (which
//! judges it), while the next member's attempt is under way, and once more
//! without waiting when that attempt answers, before the kept answer is
//! dropped.
//!
//! Bounds: at most [`MAX_KIND_BODY`] bytes (error bodies are a few hundred
//! bytes and come with their head); in time, no longer than the next
//! attempt, which has its own timeout. The caller never waits for it: a body
//! that has not arrived when the next attempt answers is dropped as before.
//! Nothing is read while the next member may still reject the call (until
//! its attempt is under way), so an answer that is handed back because every
//! later member rejected the call normally keeps its whole body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http::Response;
use http_body::Body;

use crate::classify::MAX_KIND_BODY;
use crate::kind::reads_body;

/// How much of the kept answer's body has been read.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Drained {
    read: usize,
    done: bool,
}

impl Drained {
    /// Reads what has arrived of the kept answer's body, up to the bound,
    /// without waiting; registers `cx` to be woken when more arrives.
    pub(super) fn read<B, E>(
        &mut self,
        kept: &mut Option<Result<Response<B>, E>>,
        cx: &mut Context<'_>,
    ) where
        B: Body + Unpin,
    {
        let Some(Ok(response)) = kept else {
            return;
        };
        if self.done || !reads_body(response.status().as_u16()) {
            return;
        }
        while self.read < MAX_KIND_BODY {
            if response.body().is_end_stream() {
                break;
            }
            match Pin::new(response.body_mut()).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    self.read += frame.data_ref().map_or(0, Buf::remaining);
                }
                Poll::Ready(Some(Err(_)) | None) => break,
                Poll::Pending => return,
            }
        }
        self.done = true;
    }

    /// Reads once more without waiting, then drops the kept answer: a later
    /// attempt answered.
    pub(super) fn drop_kept<B, E>(
        &mut self,
        kept: &mut Option<Result<Response<B>, E>>,
        cx: &mut Context<'_>,
    ) where
        B: Body + Unpin,
    {
        self.read(kept, cx);
        *kept = None;
        *self = Drained::default();
    }
}
