//! One pass over a JSON document, key by key ([`walk`] and its [`Visit`]),
//! and the few fields it picks out to classify an LLM event ([`scan`]);
//! the spend guard's usage reader walks with it too. No allocation, no
//! recursion: malformed or truncated input stops the walk and keeps what
//! was found.

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ErrorFields<'a> {
    pub(super) ty: Option<&'a [u8]>,
    pub(super) code: Option<&'a [u8]>,
    pub(super) status: Option<&'a [u8]>,
    /// The error's `"message"`, as its raw string contents.
    pub(super) message: Option<&'a [u8]>,
}

#[derive(Debug, Default)]
pub(super) struct Fields<'a> {
    /// Top-level `"type"`.
    pub(super) ty: Option<&'a [u8]>,
    /// Top-level `"code"` (the Responses API's `error` event).
    pub(super) code: Option<&'a [u8]>,
    /// A top-level `"error"` (or `response.error`) that is not null.
    pub(super) error: Option<ErrorFields<'a>>,
    /// A finish reason or block reason that is a content filter.
    pub(super) filtered: bool,
    /// Gemini's `RetryInfo.retryDelay`.
    pub(super) retry_delay: Option<&'a [u8]>,
}

// === the walk ===

/// What one pass over a JSON document tells, key by key: each container as
/// it opens, and each scalar that is the value of a key. `Frame` is what
/// the visitor keeps of an open container; containers deeper than
/// [`MAX_DEPTH`] keep none, and their keys are never told (nothing a
/// visitor looks for lies that deep).
pub(crate) trait Visit<'a> {
    /// What the visitor keeps of each open container.
    type Frame: Copy + Default;

    /// A container (`object` or array) opens as the value of `key` (`""` in
    /// an array and for the document itself), `depth` containers deep (0:
    /// the document), inside `parent` (`None` for the document, or past
    /// [`MAX_DEPTH`]).
    fn open(
        &mut self,
        depth: usize,
        parent: Option<Self::Frame>,
        key: &'a [u8],
        object: bool,
    ) -> Self::Frame;

    /// A scalar that is the value of `key` in the object `frame`, `depth`
    /// containers deep: a string's raw contents (`string`), or the bytes
    /// of a number, `true`, `false` or `null`.
    fn value(
        &mut self,
        depth: usize,
        frame: Option<Self::Frame>,
        key: &'a [u8],
        v: &'a [u8],
        string: bool,
    );
}

/// The deepest containers a walk keeps frames for.
pub(crate) const MAX_DEPTH: usize = 16;

/// Walks `input` once, telling `visitor` its containers and keyed values,
/// without allocating or recursing. Malformed or truncated input stops the
/// walk (what was told stays told); nothing panics.
pub(crate) fn walk<'a, V: Visit<'a>>(input: &'a [u8], visitor: &mut V) {
    // The frames of the open containers, with whether each is an object.
    let mut stack = [(V::Frame::default(), false); MAX_DEPTH];
    let mut depth = 0usize;
    let mut key: Option<&'a [u8]> = None;
    let mut i = 0;
    let frame_at = |stack: &[(V::Frame, bool); MAX_DEPTH], depth: usize| {
        depth.checked_sub(1).and_then(|d| stack.get(d)).copied()
    };
    while let Some(&b) = input.get(i) {
        match b {
            b'{' | b'[' => {
                let k = key.take().unwrap_or(b"");
                let object = b == b'{';
                let parent = frame_at(&stack, depth).map(|(f, _)| f);
                let frame = visitor.open(depth, parent, k, object);
                if let Some(slot) = stack.get_mut(depth) {
                    *slot = (frame, object);
                }
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                if depth == 0 {
                    return;
                }
                depth -= 1;
                key = None;
                i += 1;
            }
            b'"' => {
                let Some((s, next)) = string(input, i) else {
                    return;
                };
                i = next;
                let here = frame_at(&stack, depth);
                if here.is_some_and(|(_, object)| object) && key.is_none() {
                    let j = skip_ws(input, i);
                    if input.get(j) == Some(&b':') {
                        key = Some(s);
                        i = j + 1;
                        continue;
                    }
                }
                if let Some(k) = key.take() {
                    visitor.value(depth, here.map(|(f, _)| f), k, s, true);
                }
            }
            b',' | b':' | b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                let end = input[i..]
                    .iter()
                    .position(|c| {
                        matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n' | b':')
                    })
                    .map_or(input.len(), |p| i + p);
                if let Some(k) = key.take() {
                    let here = frame_at(&stack, depth).map(|(f, _)| f);
                    visitor.value(depth, here, k, &input[i..end], false);
                }
                i = end.max(i + 1);
            }
        }
    }
}

// === the fields that classify an LLM event ===

/// What the classifier keeps of a container.
#[derive(Clone, Copy, Default)]
pub(super) struct Frame<'a> {
    /// The key this container is the value of (`""` in arrays).
    key: &'a [u8],
    error: bool,
}

pub(super) fn scan(input: &[u8]) -> Fields<'_> {
    let mut f = Fields::default();
    walk(input, &mut f);
    f
}

impl<'a> Visit<'a> for Fields<'a> {
    type Frame = Frame<'a>;

    fn open(
        &mut self,
        depth: usize,
        parent: Option<Frame<'a>>,
        key: &'a [u8],
        object: bool,
    ) -> Frame<'a> {
        let error = object && key == b"error" && is_error_position(depth, parent);
        if error {
            self.error.get_or_insert_with(ErrorFields::default);
        }
        Frame { key, error }
    }

    fn value(
        &mut self,
        depth: usize,
        frame: Option<Frame<'a>>,
        key: &'a [u8],
        v: &'a [u8],
        string: bool,
    ) {
        value(self, depth, frame, key, v, string);
    }
}

/// `"error"` counts at the top level and as `response.error` (the
/// Responses API); deeper ones belong to tools and content.
fn is_error_position(depth: usize, parent: Option<Frame<'_>>) -> bool {
    depth == 1 || (depth == 2 && parent.is_some_and(|p| p.key == b"response"))
}

fn value<'a>(
    f: &mut Fields<'a>,
    depth: usize,
    frame: Option<Frame<'a>>,
    key: &'a [u8],
    v: &'a [u8],
    is_string: bool,
) {
    if depth == 1 {
        match key {
            b"type" if is_string => f.ty = Some(v),
            b"code" => f.code = Some(v),
            _ => {}
        }
    }
    if key == b"error" && is_string && !v.is_empty() && is_error_position(depth, frame) {
        f.error.get_or_insert_with(ErrorFields::default);
    }
    if let (Some(fr), Some(e)) = (frame, f.error.as_mut())
        && fr.error
    {
        match key {
            b"type" => e.ty = Some(v),
            b"code" => e.code = Some(v),
            b"status" => e.status = Some(v),
            b"message" if is_string => e.message = Some(v),
            _ => {}
        }
    }
    if !is_string {
        return;
    }
    match key {
        b"finish_reason" | b"finishReason" | b"stop_reason" => f.filtered |= is_filter(v),
        b"blockReason" => f.filtered |= !v.is_empty() && v != b"BLOCK_REASON_UNSPECIFIED",
        b"reason" if frame.is_some_and(|fr| fr.key == b"incomplete_details") => {
            f.filtered |= is_filter(v)
        }
        b"retryDelay" => f.retry_delay = Some(v),
        _ => {}
    }
}

fn is_filter(v: &[u8]) -> bool {
    [
        &b"content_filter"[..],
        b"SAFETY",
        b"PROHIBITED_CONTENT",
        b"BLOCKLIST",
        b"SPII",
        b"RECITATION",
        b"IMAGE_SAFETY",
        b"refusal",
    ]
    .iter()
    .any(|t| v.eq_ignore_ascii_case(t))
}

/// The raw contents of the string starting at `input[start] == '"'` and
/// the index after its closing quote; `None` if it never closes.
fn string(input: &[u8], start: usize) -> Option<(&[u8], usize)> {
    let mut i = start + 1;
    while let Some(at) = input
        .get(i..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        i += at;
        if input[i] == b'"' {
            return Some((&input[start + 1..i], i + 1));
        }
        i += 2;
    }
    None
}

fn skip_ws(input: &[u8], mut i: usize) -> usize {
    while input.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tells every key it is told, with its depth and what its container
    /// was opened as.
    #[derive(Default)]
    struct Keys(Vec<(usize, Option<&'static str>, String)>);

    impl<'a> Visit<'a> for Keys {
        type Frame = &'static str;

        fn open(
            &mut self,
            _: usize,
            _: Option<&'static str>,
            key: &'a [u8],
            _: bool,
        ) -> &'static str {
            if key == b"usage" {
                "usage"
            } else {
                "other"
            }
        }

        fn value(
            &mut self,
            depth: usize,
            frame: Option<&'static str>,
            key: &'a [u8],
            _: &'a [u8],
            _: bool,
        ) {
            self.0
                .push((depth, frame, String::from_utf8_lossy(key).into_owned()));
        }
    }

    #[test]
    fn the_walk_tells_keys_with_their_container_and_never_past_its_depth() {
        let doc = br#"{"a":1,"usage":{"b":"x","c":[1,{"d":null}]},"e":"\"q\"","f":true}"#;
        let mut keys = Keys::default();
        walk(doc, &mut keys);
        let told: Vec<_> = keys
            .0
            .iter()
            .map(|(d, f, k)| (*d, *f, k.as_str()))
            .collect();
        assert_eq!(
            told,
            [
                (1, Some("other"), "a"),
                (2, Some("usage"), "b"),
                (4, Some("other"), "d"),
                (1, Some("other"), "e"),
                (1, Some("other"), "f"),
            ]
        );
        // Past the deepest frame kept, keys are not told.
        let deep = format!(
            "{}\"k\":1{}",
            "{\"x\":".repeat(MAX_DEPTH + 2),
            "}".repeat(MAX_DEPTH + 2)
        );
        let mut keys = Keys::default();
        walk(deep.as_bytes(), &mut keys);
        assert!(keys.0.is_empty(), "{:?}", keys.0);
    }

    #[test]
    fn a_truncated_or_garbled_document_stops_the_walk_without_a_panic() {
        let doc =
            br#"{"error":{"type":"overloaded_error","message":"a \\ \" b"},"usage":{"n":[1,2]}}"#;
        for end in 0..=doc.len() {
            walk(&doc[..end], &mut Keys::default());
            let _ = scan(&doc[..end]);
        }
        for garbage in [&b"}}]]"[..], b"\"\\", b":::\"", b"{\"a\"", b"[{\"a\":\"\\"] {
            walk(garbage, &mut Keys::default());
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2_000 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let alphabet = b"{}[]\":,\\ ab1";
                    alphabet[(rng % alphabet.len() as u64) as usize]
                })
                .collect();
            walk(&bytes, &mut Keys::default());
        }
    }
}
