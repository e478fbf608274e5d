//! Server-sent events, read incrementally while the body streams.

use std::fmt;

use super::{ClassifyStream, Outcome};

/// The longest line, and the largest event payload, kept by default: 64 KiB.
pub const DEFAULT_MAX_LINE: usize = 64 * 1024;

/// A byte-order mark, skipped at the start of the stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// An incremental, bounded parser of a `text/event-stream` body.
///
/// Feed it the body's chunks as they arrive, split anywhere: in the middle of
/// a line, of a `\r\n` pair or of a multi-byte UTF-8 character. It follows
/// the WHATWG event-stream format: lines end in `\n`, `\r\n` or `\r`; a line
/// starting with `:` is a comment; `event:` names the event; `data:` lines
/// are joined with `\n`; a blank line dispatches the event; a leading
/// byte-order mark is skipped.
///
/// Memory is bounded. A line longer than `max_line` bytes is discarded while
/// it streams, never buffered: a 10 MB body without a newline costs no more
/// than `max_line` bytes. An event whose `data` adds up to more than
/// `max_line` bytes is dispatched with its data dropped
/// ([`SseEvent::is_data_truncated`]).
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::classify::SseScanner;
/// use tower_circuit_breaker::Outcome;
///
/// let mut scanner = SseScanner::new();
/// let mut names = Vec::new();
/// let mut collect = |ev: &tower_circuit_breaker::classify::SseEvent<'_>| {
///     names.push(format!("{}={}", ev.event(), String::from_utf8_lossy(ev.data())));
///     (ev.event() == "error").then_some(Outcome::Failure)
/// };
/// // One event split across two chunks, in the middle of its name.
/// assert_eq!(scanner.feed(b"data: hel", &mut collect), None);
/// assert_eq!(scanner.feed(b"lo\r\n\r\nevent: err", &mut collect), None);
/// assert_eq!(scanner.feed(b"or\ndata: {}\n\n", &mut collect), Some(Outcome::Failure));
/// assert_eq!(names, ["message=hello", "error={}"]);
/// ```
pub struct SseScanner {
    max_line: usize,
    /// The start of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// The current line outgrew `max_line`: skip to its end.
    skipping: bool,
    /// The previous chunk ended in `\r`: a `\n` starting this one belongs to it.
    after_cr: bool,
    /// No line has been completed yet (a byte-order mark may lead).
    first_line: bool,
    event: Vec<u8>,
    has_event: bool,
    data: Vec<u8>,
    has_data: bool,
    data_truncated: bool,
    /// A field line (or part of one) was seen since the last dispatch.
    in_event: bool,
}

impl SseScanner {
    /// A scanner with lines and event payloads capped at
    /// [`DEFAULT_MAX_LINE`].
    #[must_use]
    pub fn new() -> Self {
        SseScanner::with_max_line(DEFAULT_MAX_LINE)
    }

    /// A scanner with lines and event payloads capped at `max_line` bytes
    /// (at least 3, so that a leading byte-order mark always fits and the
    /// byte after it tells a comment from a field).
    #[must_use]
    pub fn with_max_line(max_line: usize) -> Self {
        SseScanner {
            max_line: max_line.max(BOM.len()),
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            first_line: true,
            event: Vec::new(),
            has_event: false,
            data: Vec::new(),
            has_data: false,
            data_truncated: false,
            in_event: false,
        }
    }

    /// Reads one chunk, calling `on_event` for every event it completes.
    ///
    /// Stops at, and returns, the first outcome `on_event` returns; the rest
    /// of the chunk is not read.
    pub fn feed<F>(&mut self, mut chunk: &[u8], mut on_event: F) -> Option<Outcome>
    where
        F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
    {
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            let (head, rest) = chunk.split_at(end);
            let eol = match rest {
                [b'\r', b'\n', ..] => 2,
                [b'\r'] => {
                    self.after_cr = true;
                    1
                }
                _ => 1,
            };
            chunk = &rest[eol..];
            if let Some(outcome) = self.end_line(head, &mut on_event) {
                return Some(outcome);
            }
        }
        self.push_partial(chunk);
        None
    }

    /// Ends the stream: reads a last line that had no line ending and
    /// dispatches an event that had no closing blank line (marked
    /// [incomplete](SseEvent::is_complete)).
    ///
    /// Call [`is_mid_event`](Self::is_mid_event) first to learn whether the
    /// stream stopped inside an event.
    pub fn finish<F>(&mut self, mut on_event: F) -> Option<Outcome>
    where
        F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
    {
        if !self.line.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.line);
            let outcome = self.process_line(&line, &mut on_event);
            self.line = line;
            self.line.clear();
            if outcome.is_some() {
                return outcome;
            }
        }
        self.line.clear();
        self.skipping = false;
        if self.has_event || self.has_data {
            return self.dispatch(false, &mut on_event);
        }
        None
    }

    /// Whether the stream so far stops inside an event: a line without its
    /// ending, or fields without the blank line that dispatches them.
    #[must_use]
    pub fn is_mid_event(&self) -> bool {
        let partial = match self.line.as_slice() {
            [] => false,
            [b':', ..] => false,
            [0xEF, 0xBB, 0xBF, b':', ..] if self.first_line => false,
            _ => true,
        };
        self.in_event || partial
    }

    /// Bytes of memory the scanner holds for partial lines and event
    /// payloads. Never more than a small multiple of `max_line`.
    #[must_use]
    pub fn buffered_capacity(&self) -> usize {
        self.line.capacity() + self.data.capacity() + self.event.capacity()
    }

    fn push_partial(&mut self, bytes: &[u8]) {
        if self.skipping || bytes.is_empty() {
            return;
        }
        if self.line.len() + bytes.len() > self.max_line {
            self.discard_line(bytes);
            self.skipping = true;
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    /// Gives up on the current line, of which `more` is the part not yet
    /// buffered: it is longer than `max_line`. Unless it is a comment, it
    /// counts as a field whose value was lost (taken to be data: the only
    /// field that grows long).
    fn discard_line(&mut self, more: &[u8]) {
        let mut bytes = self.line.iter().chain(more);
        let mut first = bytes.next().copied();
        if self.first_line && first == Some(BOM[0]) && bytes.clone().take(2).eq(&BOM[1..]) {
            // A byte-order mark leads: look past it (at least one more byte
            // is known, as the line is longer than `max_line`).
            first = bytes.nth(2).copied();
        }
        if first != Some(b':') {
            self.in_event = true;
            self.data_truncated = true;
        }
        self.first_line = false;
        self.line.clear();
        if self.line.capacity() > self.max_line {
            self.line.shrink_to(self.max_line);
        }
    }

    fn end_line<F>(&mut self, tail: &[u8], on_event: &mut F) -> Option<Outcome>
    where
        F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
    {
        if self.skipping {
            // The end of a line that was already thrown away.
            self.skipping = false;
            return None;
        }
        if self.line.len() + tail.len() > self.max_line {
            self.discard_line(tail);
            return None;
        }
        if self.line.is_empty() {
            return self.process_line(tail, on_event);
        }
        let mut line = std::mem::take(&mut self.line);
        line.extend_from_slice(tail);
        let outcome = self.process_line(&line, on_event);
        line.clear();
        self.line = line;
        outcome
    }

    fn process_line<F>(&mut self, mut line: &[u8], on_event: &mut F) -> Option<Outcome>
    where
        F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
    {
        if std::mem::take(&mut self.first_line) {
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch(true, on_event);
        }
        if line[0] == b':' {
            return None;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        self.in_event = true;
        match field {
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
                self.has_event = true;
            }
            b"data" => {
                if self.data_truncated {
                    return None;
                }
                let extra = usize::from(self.has_data) + value.len();
                if self.data.len() + extra > self.max_line {
                    self.data_truncated = true;
                    self.data.clear();
                } else {
                    if self.has_data {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                }
                self.has_data = true;
            }
            // `id`, `retry` and unknown fields say nothing about health.
            _ => {}
        }
        None
    }

    fn dispatch<F>(&mut self, complete: bool, on_event: &mut F) -> Option<Outcome>
    where
        F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
    {
        let outcome = if self.has_event || self.has_data || self.data_truncated {
            let name = if self.has_event {
                std::str::from_utf8(&self.event).unwrap_or("")
            } else {
                "message"
            };
            on_event(&SseEvent {
                event: name,
                data: if self.data_truncated { &[] } else { &self.data },
                data_truncated: self.data_truncated,
                complete,
            })
        } else {
            None
        };
        self.event.clear();
        self.data.clear();
        self.has_event = false;
        self.has_data = false;
        self.data_truncated = false;
        self.in_event = false;
        outcome
    }
}

impl Default for SseScanner {
    fn default() -> Self {
        SseScanner::new()
    }
}

impl fmt::Debug for SseScanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseScanner")
            .field("max_line", &self.max_line)
            .field("buffered", &self.line.len())
            .field("mid_event", &self.is_mid_event())
            .finish()
    }
}

/// One dispatched server-sent event, borrowed from the scanner.
#[derive(Debug, Clone, Copy)]
pub struct SseEvent<'a> {
    event: &'a str,
    data: &'a [u8],
    data_truncated: bool,
    complete: bool,
}

impl<'a> SseEvent<'a> {
    /// A new event, for testing an [`ClassifyEvent`] implementation.
    #[must_use]
    pub fn new(event: &'a str, data: &'a [u8]) -> Self {
        SseEvent {
            event,
            data,
            data_truncated: false,
            complete: true,
        }
    }

    /// The event type: the `event:` field, or `"message"` when it had none
    /// (as `EventSource` does). A name that is not UTF-8 reads as `""`.
    #[must_use]
    pub fn event(&self) -> &'a str {
        self.event
    }

    /// The `data:` lines joined with `\n` (raw bytes, not necessarily UTF-8).
    /// Empty when the payload was over the cap.
    #[must_use]
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Whether the payload was over the cap (or a line of it was) and was
    /// dropped.
    #[must_use]
    pub fn is_data_truncated(&self) -> bool {
        self.data_truncated
    }

    /// Whether a blank line closed the event; `false` for an event cut short
    /// by the end of the stream.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}

/// Decides what one server-sent event says about the upstream.
///
/// Return `Some` to decide now (an error event, or a final event after which
/// nothing matters); `None` to keep reading. Closures over [`SseEvent`]
/// implement it.
///
/// # Example
///
/// An upstream that announces failures with `event: failure`:
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{
///     Classify, ClassifyStream, ErrorRef, HttpClassifier, SseEvent, SseStream, Verdict,
/// };
/// use tower_circuit_breaker::Outcome;
///
/// type Events = fn(&SseEvent<'_>) -> Option<Outcome>;
///
/// fn on_event(ev: &SseEvent<'_>) -> Option<Outcome> {
///     match ev.event() {
///         "failure" => Some(Outcome::Failure),
///         "done" => Some(Outcome::Success),
///         _ => None,
///     }
/// }
///
/// #[derive(Clone, Copy)]
/// struct Feed;
///
/// impl Classify for Feed {
///     type Stream = SseStream<Events>;
///
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<Self::Stream> {
///         if status == StatusCode::OK {
///             return Verdict::Defer(SseStream::with_events(on_event as Events));
///         }
///         match HttpClassifier.classify_response(status, headers) {
///             Verdict::Done(outcome) => Verdict::Done(outcome),
///             Verdict::Defer(never) => match never {},
///         }
///     }
///
///     fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
///         Outcome::Failure
///     }
/// }
///
/// let Verdict::Defer(mut stream) = Feed.classify_response(StatusCode::OK, &HeaderMap::new()) else {
///     unreachable!()
/// };
/// assert_eq!(stream.on_data(b"event: tick\ndata: 1\n\n"), None);
/// assert_eq!(stream.on_data(b"event: failure\ndata: disk full\n\n"), Some(Outcome::Failure));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify server-sent events: it does not implement `ClassifyEvent`",
    label = "not an SSE event classifier",
    note = "implement `tower_circuit_breaker::classify::ClassifyEvent`, or pass a closure `FnMut(&SseEvent<'_>) -> Option<Outcome>`"
)]
pub trait ClassifyEvent {
    /// Classifies one event.
    fn classify_event(&mut self, event: &SseEvent<'_>) -> Option<Outcome>;
}

impl<F> ClassifyEvent for F
where
    F: FnMut(&SseEvent<'_>) -> Option<Outcome>,
{
    fn classify_event(&mut self, event: &SseEvent<'_>) -> Option<Outcome> {
        self(event)
    }
}

/// A [`ClassifyStream`] for `text/event-stream` bodies: scans the stream
/// with an [`SseScanner`] and asks a [`ClassifyEvent`] about every event.
///
/// What an event means is the [`ClassifyEvent`]'s business: the scanner
/// knows nothing of any API. [`LlmEvents`](super::LlmEvents) judges OpenAI,
/// Anthropic and Gemini streams (`SseStream::new()`).
///
/// How the stream ends decides when no event did:
///
/// | end | outcome |
/// |---|---|
/// | an event decided (error event, `[DONE]`, `message_stop`, ...) | that outcome, at once |
/// | body error (connection reset, stream cut mid-body) | `Failure` |
/// | clean end inside an event (a partial line, or fields without their closing blank line) | the incomplete event is judged first; if it decides nothing, `Failure`: the stream was truncated |
/// | clean end between events, no final event | `Success`, or `Failure` with [`require_final_event`](Self::require_final_event) |
/// | the caller dropped the body first | `Ignored` |
///
/// A clean end without a final event counts as a success by default because
/// streams that never send one (Gemini, most non-LLM event streams) would
/// otherwise all count as failures; turn `require_final_event` on for
/// upstreams that always send one.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::classify::{ClassifyStream, SseEvent, SseStream};
/// use tower_circuit_breaker::Outcome;
///
/// // A feed whose `event: outage` means the upstream is in trouble.
/// let judge = |ev: &SseEvent<'_>| (ev.event() == "outage").then_some(Outcome::Failure);
/// let mut stream = SseStream::with_events(judge);
/// assert_eq!(stream.on_data(b"data: all good\n\n"), None);
/// assert_eq!(stream.on_data(b"event: outage\ndata: eu-west\n\n"), Some(Outcome::Failure));
///
/// // A stream cut in the middle of an event is a failure.
/// let mut stream = SseStream::with_events(judge);
/// assert_eq!(stream.on_data(b"data: half an ev"), None);
/// assert_eq!(stream.on_end(), Outcome::Failure);
/// ```
#[derive(Debug)]
pub struct SseStream<E> {
    scanner: SseScanner,
    events: E,
    require_final: bool,
}

impl<E> SseStream<E> {
    /// A stream classifier that judges events with `events`.
    pub fn with_events(events: E) -> Self {
        SseStream {
            scanner: SseScanner::new(),
            events,
            require_final: false,
        }
    }

    /// Caps lines and event payloads at `max_line` bytes (default
    /// [`DEFAULT_MAX_LINE`]).
    #[must_use]
    pub fn max_line(mut self, max_line: usize) -> Self {
        self.scanner = SseScanner::with_max_line(max_line);
        self
    }

    /// Whether a stream that ends cleanly without a deciding event is a
    /// failure (default: `false`, a success).
    #[must_use]
    pub fn require_final_event(mut self, on: bool) -> Self {
        self.require_final = on;
        self
    }

    /// The scanner, to inspect how much it buffers.
    pub fn scanner(&self) -> &SseScanner {
        &self.scanner
    }
}

impl<E: ClassifyEvent> ClassifyStream for SseStream<E> {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        let events = &mut self.events;
        self.scanner.feed(chunk, |ev| events.classify_event(ev))
    }

    fn on_end(mut self) -> Outcome {
        let truncated = self.scanner.is_mid_event();
        let events = &mut self.events;
        match self.scanner.finish(|ev| events.classify_event(ev)) {
            Some(outcome) => outcome,
            None if truncated || self.require_final => Outcome::Failure,
            None => Outcome::Success,
        }
    }
}

#[cfg(test)]
mod tests;
