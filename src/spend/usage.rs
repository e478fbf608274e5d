//! [`Usage`]: the tokens an answer says it used, read from the `usage` of
//! an OpenAI, Anthropic or Gemini answer (JSON, or the events of a stream).
//!
//! One pass over each JSON document (the walk the LLM classifier reads
//! error events with) picks out the few fields that count, without
//! allocating or recursing; malformed or truncated input stops the walk and
//! keeps what was found.

use std::fmt;

use crate::classify::json::{self, Visit};

/// The tokens one answer used, and the model that answered.
///
/// Counts are normalised across providers: `input` is the input tokens
/// not read from a cache (cache writes included), `cached_input` those read
/// from a cache, `output` the generated ones (reasoning included).
///
/// ```
/// use tower_circuit_breaker::spend::Usage;
///
/// let body = br#"{"id":"chatcmpl-1","model":"gpt-4o-2024-08-06","choices":[],
///   "usage":{"prompt_tokens":1200,"completion_tokens":300,
///            "prompt_tokens_details":{"cached_tokens":1000}}}"#;
/// let usage = Usage::from_json(body).unwrap();
/// assert_eq!((usage.input(), usage.cached_input(), usage.output()), (200, 1000, 300));
/// assert_eq!(usage.model(), Some("gpt-4o-2024-08-06"));
/// assert_eq!(Usage::from_json(b"{\"usage\":"), None);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    input: u64,
    output: u64,
    cached_input: u64,
    model: Model,
}

/// A model name, kept inline (names longer than this are cut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Model {
    len: u8,
    bytes: [u8; MAX_MODEL],
}

const MAX_MODEL: usize = 63;

impl Default for Model {
    fn default() -> Self {
        Model {
            len: 0,
            bytes: [0; MAX_MODEL],
        }
    }
}

impl Model {
    fn new(raw: &[u8]) -> Self {
        let mut m = Model::default();
        // Only a plain name: an escape or anything not printable ASCII stops
        // it, so the name is valid UTF-8.
        let raw = &raw[..raw
            .iter()
            .position(|b| !b.is_ascii_graphic() || *b == b'\\')
            .unwrap_or(raw.len())];
        let n = raw.len().min(MAX_MODEL);
        m.bytes[..n].copy_from_slice(&raw[..n]);
        m.len = u8::try_from(n).unwrap_or(u8::MAX);
        m
    }

    fn get(&self) -> Option<&str> {
        let s = std::str::from_utf8(&self.bytes[..self.len as usize]).ok()?;
        (!s.is_empty()).then_some(s)
    }
}

impl Usage {
    /// A usage of `input` uncached input tokens, `cached_input` cached ones
    /// and `output` output tokens.
    #[must_use]
    pub const fn new(input: u64, cached_input: u64, output: u64) -> Self {
        Usage {
            input,
            output,
            cached_input,
            model: Model {
                len: 0,
                bytes: [0; MAX_MODEL],
            },
        }
    }

    /// The same usage, by `model` (cut at 63 bytes, and at the first byte
    /// that is not printable ASCII).
    #[must_use]
    pub fn with_model(mut self, model: &str) -> Self {
        self.model = Model::new(model.as_bytes());
        self
    }

    /// Input tokens not read from a cache.
    #[must_use]
    pub const fn input(&self) -> u64 {
        self.input
    }

    /// Input tokens read from a cache.
    #[must_use]
    pub const fn cached_input(&self) -> u64 {
        self.cached_input
    }

    /// Output tokens, reasoning included.
    #[must_use]
    pub const fn output(&self) -> u64 {
        self.output
    }

    /// Every token.
    #[must_use]
    pub const fn total(&self) -> u64 {
        self.input
            .saturating_add(self.cached_input)
            .saturating_add(self.output)
    }

    /// The model the answer names (`model`, Gemini's `modelVersion`).
    #[must_use]
    pub fn model(&self) -> Option<&str> {
        self.model.get()
    }

    /// The usage of a whole JSON answer: OpenAI's Chat Completions and
    /// Responses (`usage`, `response.usage`), Anthropic's Messages
    /// (`usage`, `message.usage`), Gemini's `usageMetadata`. `None` when it
    /// has none, or none that parses.
    #[must_use]
    pub fn from_json(body: &[u8]) -> Option<Usage> {
        let mut reader = UsageReader::default();
        reader.read(body);
        reader.usage()
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Usage")
            .field("input", &self.input)
            .field("cached_input", &self.cached_input)
            .field("output", &self.output)
            .field("model", &self.model())
            .finish()
    }
}

/// The usage fields met so far, over one document or the events of a
/// stream: a later value of a field replaces an earlier one (Anthropic's
/// `message_delta` carries the final output count after `message_start`
/// gave the input; Gemini repeats the running totals in every chunk).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UsageReader {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    details_cached: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    gemini_prompt: Option<u64>,
    gemini_candidates: Option<u64>,
    gemini_cached: Option<u64>,
    gemini_thoughts: Option<u64>,
    model: Option<Model>,
}

impl UsageReader {
    /// The usage read so far, if any field of one was found.
    pub(crate) fn usage(&self) -> Option<Usage> {
        let usage = if self.gemini_prompt.is_some() || self.gemini_candidates.is_some() {
            let cached = self.gemini_cached.unwrap_or(0);
            Usage::new(
                self.gemini_prompt.unwrap_or(0).saturating_sub(cached),
                cached,
                self.gemini_candidates
                    .unwrap_or(0)
                    .saturating_add(self.gemini_thoughts.unwrap_or(0)),
            )
        } else if self.prompt_tokens.is_some() || self.completion_tokens.is_some() {
            let cached = self.details_cached.unwrap_or(0);
            Usage::new(
                self.prompt_tokens.unwrap_or(0).saturating_sub(cached),
                cached,
                self.completion_tokens.unwrap_or(0),
            )
        } else if self.input_tokens.is_some() || self.output_tokens.is_some() {
            let input = self.input_tokens.unwrap_or(0);
            let (input, cached) = match self.details_cached {
                // OpenAI's Responses: `input_tokens` counts the cached ones.
                Some(cached) => (input.saturating_sub(cached), cached),
                // Anthropic: cache reads and writes are counted apart.
                None => (
                    input.saturating_add(self.cache_creation.unwrap_or(0)),
                    self.cache_read.unwrap_or(0),
                ),
            };
            Usage::new(input, cached, self.output_tokens.unwrap_or(0))
        } else {
            return None;
        };
        Some(Usage {
            model: self.model.unwrap_or_default(),
            ..usage
        })
    }

    /// The model named so far, if any.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_ref().and_then(Model::get)
    }

    /// Reads one JSON document (a body, or one event's data).
    pub(crate) fn read(&mut self, input: &[u8]) {
        json::walk(input, self);
    }

    fn number(&mut self, role: Role, key: &[u8], v: u64) {
        let slot = match (role, key) {
            (Role::Usage, b"prompt_tokens") => &mut self.prompt_tokens,
            (Role::Usage, b"completion_tokens") => &mut self.completion_tokens,
            (Role::Usage, b"input_tokens") => &mut self.input_tokens,
            (Role::Usage, b"output_tokens") => &mut self.output_tokens,
            (Role::Usage, b"cache_read_input_tokens") => &mut self.cache_read,
            (Role::Usage, b"cache_creation_input_tokens") => &mut self.cache_creation,
            (Role::Details, b"cached_tokens") => &mut self.details_cached,
            (Role::Gemini, b"promptTokenCount") => &mut self.gemini_prompt,
            (Role::Gemini, b"candidatesTokenCount") => &mut self.gemini_candidates,
            (Role::Gemini, b"cachedContentTokenCount") => &mut self.gemini_cached,
            (Role::Gemini, b"thoughtsTokenCount") => &mut self.gemini_thoughts,
            _ => return,
        };
        *slot = Some(v);
    }
}

// === the walk ===

/// What a JSON object is, for the fields inside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// Anything else (and anything past the walk's depth).
    #[default]
    Other,
    /// The document itself.
    Root,
    /// Anthropic's `message` (of `message_start`), OpenAI's `response` (of
    /// the Responses API's events).
    Envelope,
    /// A `usage` object.
    Usage,
    /// `prompt_tokens_details`, `input_tokens_details` in a `usage`.
    Details,
    /// Gemini's `usageMetadata`.
    Gemini,
}

fn role_of(parent: Role, key: &[u8], object: bool) -> Role {
    if !object {
        return Role::Other;
    }
    match (parent, key) {
        (Role::Root, b"usage") | (Role::Envelope, b"usage") => Role::Usage,
        (Role::Root, b"usageMetadata") => Role::Gemini,
        (Role::Root, b"message") | (Role::Root, b"response") => Role::Envelope,
        (Role::Usage, b"prompt_tokens_details") | (Role::Usage, b"input_tokens_details") => {
            Role::Details
        }
        _ => Role::Other,
    }
}

impl<'a> Visit<'a> for UsageReader {
    type Frame = Role;

    fn open(&mut self, depth: usize, parent: Option<Role>, key: &'a [u8], object: bool) -> Role {
        match (depth, object) {
            (0, true) => Role::Root,
            (0, false) => Role::Other,
            _ => role_of(parent.unwrap_or_default(), key, object),
        }
    }

    fn value(&mut self, _: usize, frame: Option<Role>, key: &'a [u8], v: &'a [u8], string: bool) {
        let role = frame.unwrap_or_default();
        if string {
            if matches!(role, Role::Root | Role::Envelope)
                && (key == b"model" || key == b"modelVersion")
            {
                self.model = Some(Model::new(v));
            }
        } else if let Some(n) = count(v) {
            self.number(role, key, n);
        }
    }
}

/// A token count: a non-negative integer (a fraction or an exponent is
/// not a count; an overflow saturates).
fn count(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}
