//! A single pass over a JSON document that picks out the few fields that
//! classify an LLM event, without allocating or recursing. Malformed or
//! truncated input stops the walk and keeps what was found.

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

const MAX_DEPTH: usize = 16;

#[derive(Clone, Copy)]
struct Frame<'a> {
    /// The key this container is the value of (`""` in arrays).
    key: &'a [u8],
    object: bool,
    error: bool,
}

pub(super) fn scan(input: &[u8]) -> Fields<'_> {
    let mut f = Fields::default();
    let mut stack = [Frame {
        key: b"",
        object: false,
        error: false,
    }; MAX_DEPTH];
    let mut depth = 0usize;
    let mut key: Option<&[u8]> = None;
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        match b {
            b'{' | b'[' => {
                let k = key.take().unwrap_or(b"");
                let parent = depth.checked_sub(1).and_then(|d| stack.get(d)).copied();
                let error = b == b'{' && k == b"error" && is_error_position(depth, parent);
                if error {
                    f.error.get_or_insert_with(ErrorFields::default);
                }
                if let Some(slot) = stack.get_mut(depth) {
                    *slot = Frame {
                        key: k,
                        object: b == b'{',
                        error,
                    };
                }
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
                key = None;
                i += 1;
            }
            b'"' => {
                let Some((s, next)) = string(input, i) else {
                    break;
                };
                i = next;
                let in_object = depth
                    .checked_sub(1)
                    .and_then(|d| stack.get(d))
                    .is_some_and(|fr| fr.object);
                if in_object && key.is_none() {
                    let j = skip_ws(input, i);
                    if input.get(j) == Some(&b':') {
                        key = Some(s);
                        i = j + 1;
                        continue;
                    }
                }
                value(&mut f, &stack, depth, key.take(), s, true);
            }
            b',' | b':' | b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                let end = input[i..]
                    .iter()
                    .position(|c| {
                        matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n' | b':')
                    })
                    .map_or(input.len(), |p| i + p);
                value(&mut f, &stack, depth, key.take(), &input[i..end], false);
                i = end.max(i + 1);
            }
        }
    }
    f
}

/// `"error"` counts at the top level and as `response.error` (the
/// Responses API); deeper ones belong to tools and content.
fn is_error_position(depth: usize, parent: Option<Frame<'_>>) -> bool {
    depth == 1 || (depth == 2 && parent.is_some_and(|p| p.key == b"response"))
}

fn value<'a>(
    f: &mut Fields<'a>,
    stack: &[Frame<'a>; MAX_DEPTH],
    depth: usize,
    key: Option<&'a [u8]>,
    v: &'a [u8],
    is_string: bool,
) {
    let Some(key) = key else {
        return;
    };
    let frame = depth.checked_sub(1).and_then(|d| stack.get(d));
    if depth == 1 {
        match key {
            b"type" if is_string => f.ty = Some(v),
            b"code" => f.code = Some(v),
            _ => {}
        }
    }
    if key == b"error" && is_string && !v.is_empty() && is_error_position(depth, frame.copied()) {
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
