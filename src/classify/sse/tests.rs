use super::*;

/// Everything the scanner dispatched, as comparable strings.
fn events(chunks: &[&[u8]]) -> (Vec<String>, bool) {
    let mut scanner = SseScanner::with_max_line(64);
    let mut seen = Vec::new();
    let mut push = |ev: &SseEvent<'_>| {
        seen.push(format!(
            "{}|{}|{}{}",
            ev.event(),
            String::from_utf8_lossy(ev.data()),
            if ev.is_data_truncated() { "T" } else { "" },
            if ev.is_complete() { "" } else { "I" },
        ));
        None
    };
    for chunk in chunks {
        assert_eq!(scanner.feed(chunk, &mut push), None);
    }
    let mid = scanner.is_mid_event();
    scanner.finish(&mut push);
    (seen, mid)
}

const SAMPLE: &[u8] = "\u{feff}: keep-alive\r\n\
    event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n\
    data: h\u{e9}llo \u{4e16}\u{754c} \u{1f980}\n\
    data: second line\n\nid: 7\nretry: 10\n\n\
    event:ping\rdata:x\r\r\
    data: {\"choices\":[{\"delta\":{\"content\":\"\u{1f980}\"},\"finish_reason\":null}]}\r\n\r\n\
    data\n\n\
    event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"
    .as_bytes();

fn sample_events() -> Vec<String> {
    vec![
        "message_start|{\"type\":\"message_start\"}|".into(),
        "message|h\u{e9}llo \u{4e16}\u{754c} \u{1f980}\nsecond line|".into(),
        "ping|x|".into(),
        "message||T".into(),
        "message||".into(),
        "error|{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}|".into(),
    ]
}

#[test]
fn sample_parses_in_one_chunk() {
    let (seen, mid) = events(&[SAMPLE]);
    assert_eq!(seen, sample_events());
    assert!(!mid);
}

#[test]
fn every_split_point_gives_the_same_events() {
    for i in 0..=SAMPLE.len() {
        let (a, b) = SAMPLE.split_at(i);
        let (seen, mid) = events(&[a, b]);
        assert_eq!(seen, sample_events(), "split at {i}");
        assert!(!mid, "split at {i}");
    }
}

#[test]
fn every_pair_of_split_points_gives_the_same_events() {
    for i in 0..=SAMPLE.len() {
        for j in i..=SAMPLE.len() {
            let (seen, _) = events(&[&SAMPLE[..i], &SAMPLE[i..j], &SAMPLE[j..]]);
            assert_eq!(seen, sample_events(), "split at {i} and {j}");
        }
    }
}

#[test]
fn byte_by_byte_gives_the_same_events() {
    let chunks: Vec<&[u8]> = SAMPLE.chunks(1).collect();
    assert_eq!(events(&chunks).0, sample_events());
}

#[test]
fn every_split_point_decides_the_same_outcome() {
    for i in 0..=SAMPLE.len() {
        let mut stream = SseStream::new();
        let (a, b) = SAMPLE.split_at(i);
        let decided = stream.on_data(a).or_else(|| stream.on_data(b));
        assert_eq!(decided, Some(Outcome::Failure), "split at {i}");
    }
}

#[test]
fn crlf_split_between_cr_and_lf_is_one_line_ending() {
    // A lone `\r` ends a line; a `\n` right after it, even in the next
    // chunk, must not end a second (blank) line and dispatch early.
    let (seen, _) = events(&[b"data: a\r", b"\ndata: b\r\n\r\n"]);
    assert_eq!(seen, ["message|a\nb|"]);
}

#[test]
fn oversized_line_is_discarded_and_the_stream_goes_on() {
    let long = vec![b'x'; 200];
    let mut body = b"data: ".to_vec();
    body.extend_from_slice(&long);
    body.extend_from_slice(b"\n\nevent: error\ndata: {}\n\n");
    for split in [1, 7, 64, 65, 100, 206, 207, 208] {
        let (a, b) = body.split_at(split);
        let (seen, mid) = events(&[a, b]);
        assert_eq!(seen, ["message||T", "error|{}|"], "split at {split}");
        assert!(!mid);
    }
}

#[test]
fn data_over_the_cap_across_lines_is_dropped() {
    let line = format!("data: {}\n", "y".repeat(40));
    let body = format!("{line}{line}\ndata: ok\n\n");
    let (seen, _) = events(&[body.as_bytes()]);
    assert_eq!(seen, ["message||T", "message|ok|"]);
}

#[test]
fn huge_body_without_newline_stays_bounded() {
    let mut scanner = SseScanner::new();
    let chunk = vec![b'a'; 16 * 1024];
    for _ in 0..(10 * 1024 * 1024 / chunk.len()) {
        assert_eq!(scanner.feed(&chunk, |_| Some(Outcome::Success)), None);
        assert!(scanner.buffered_capacity() <= 2 * DEFAULT_MAX_LINE);
    }
    assert!(scanner.is_mid_event());
    // Nothing to dispatch: the only line was thrown away.
    assert_eq!(scanner.finish(|_| Some(Outcome::Success)), None);

    let mut scanner = SseScanner::new();
    for _ in 0..(256 * 1024) {
        let _ = scanner.feed(b"b", |_| None);
    }
    assert!(scanner.buffered_capacity() <= 2 * DEFAULT_MAX_LINE);
}

#[test]
fn end_of_stream_judges_an_unclosed_event() {
    let (seen, mid) = events(&[b"event: error\ndata: {}"]);
    assert!(mid);
    assert_eq!(seen, ["error|{}|I"]);
    let (seen, mid) = events(&[b"data: 1\n\n: bye"]);
    assert!(!mid, "a trailing comment is not an event");
    assert_eq!(seen, ["message|1|"]);
}

#[test]
fn end_without_final_event() {
    let clean = b"data: {\"candidates\":[]}\n\n";
    let mut s = SseStream::new();
    assert_eq!(s.on_data(clean), None);
    assert_eq!(s.on_end(), Outcome::Success);

    let mut s = SseStream::new().require_final_event(true);
    assert_eq!(s.on_data(clean), None);
    assert_eq!(s.on_end(), Outcome::Failure);

    let mut s = SseStream::new();
    assert_eq!(
        s.on_data(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel"),
        None
    );
    assert_eq!(s.on_end(), Outcome::Failure);

    // A final marker without its blank line still counts.
    let mut s = SseStream::new().require_final_event(true);
    assert_eq!(s.on_data(b"data: {}\n\ndata: [DONE]"), None);
    assert_eq!(s.on_end(), Outcome::Success);

    // An empty body ends between events.
    assert_eq!(SseStream::new().on_end(), Outcome::Success);
}

#[test]
fn body_error_and_drop_use_the_defaults() {
    let mut s = SseStream::new();
    assert_eq!(s.on_data(b"data: {}\n\n"), None);
    assert_eq!(s.on_error(), Outcome::Failure);
    assert_eq!(SseStream::new().on_drop(), Outcome::Ignored);
}
