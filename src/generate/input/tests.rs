//! Lines, ids and the pre-pass, on small files.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use serde_json::json;

use super::*;

fn parse(number: u64, text: &str) -> Line {
    parse_line(number, text.as_bytes(), &mut Ids::default())
}

fn s(text: &str) -> Id {
    Id {
        text: text.into(),
        numeric: false,
    }
}

#[test]
fn plain_chat_and_batch_lines() {
    let l = parse(1, r#"{"id":"a","prompt":"hi"}"#);
    assert_eq!(l.id, s("a"));
    assert_eq!(l.parsed.unwrap().prompt, Prompt::Text("hi".into()));

    let l = parse(2, r#"{"id":7,"messages":[{"role":"user","content":"x"}]}"#);
    assert_eq!(
        l.id,
        Id {
            text: "7".into(),
            numeric: true
        }
    );
    assert!(matches!(l.parsed.unwrap().prompt, Prompt::Messages(_)));

    let l = parse(
        3,
        r#"{"custom_id":"req-1","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100,"seed":1}}"#,
    );
    assert_eq!(l.id.text, "req-1");
    let p = l.parsed.unwrap();
    assert_eq!(p.max_tokens, Some(100));
    assert_eq!(p.api, Some(Api::Chat));
    let extra = p.extra.unwrap();
    assert_eq!(extra.get("model"), Some(&json!("m")));
    assert_eq!(extra.get("seed"), Some(&json!(1)));
    assert!(!extra.contains_key("messages"));
}

#[test]
fn a_batch_body_with_both_token_fields_keeps_the_one_chat_reads() {
    let both = |body: &str| {
        let line = format!(r#"{{"custom_id":"b","url":"/v1/chat/completions","body":{body}}}"#);
        parse(1, &line).parsed
    };
    let m = r#""messages":[{"role":"user","content":"x"}]"#;
    let p = both(&format!(
        r#"{{{m},"max_tokens":100,"max_completion_tokens":300}}"#
    ))
    .unwrap();
    assert_eq!(p.max_tokens, Some(300));
    let extra = p.extra.unwrap();
    assert!(!extra.contains_key("max_tokens") && !extra.contains_key("max_completion_tokens"));
    let p = both(&format!(
        r#"{{{m},"max_tokens":100,"max_completion_tokens":null}}"#
    ))
    .unwrap();
    assert_eq!(p.max_tokens, Some(100));
    assert_eq!(
        both(&format!(r#"{{{m},"max_completion_tokens":-1}}"#))
            .unwrap_err()
            .to_string(),
        "body.max_completion_tokens must be a positive integer, got -1"
    );
}

#[test]
fn bad_lines_say_why_and_keep_an_id() {
    let l = parse(13, r#"{"id":"x","prompt":"unterminated"#);
    assert!(
        l.parsed
            .unwrap_err()
            .to_string()
            .contains("not a JSON object")
    );
    assert!(l.id.text.starts_with("sha256:"), "named after its content");
    let l = parse(14, r#"{"id":"y","prompt":5}"#);
    assert_eq!(l.id, s("y"));
    assert_eq!(
        l.parsed.unwrap_err().to_string(),
        "`prompt` must be a string, got a number"
    );
    assert!(
        parse(15, r#"{"id":"z"}"#)
            .parsed
            .unwrap_err()
            .to_string()
            .contains("missing `prompt`")
    );
    // A JSON array is not a prompt line, however many fields it would fill.
    let l = parse(16, r#"["a", "hi", null, null, null, null]"#);
    assert_eq!(
        l.parsed.unwrap_err().to_string(),
        "a prompt line must be a JSON object"
    );
    let l = parse(17, r#"{"id": 1.5, "prompt": "x"}"#);
    assert_eq!(
        l.parsed.unwrap_err().to_string(),
        "an id must be a string or an integer, got 1.5"
    );
}

#[test]
fn invalid_utf8_makes_one_line_malformed() {
    let l = parse_line(
        3,
        b"{\"id\":\"a\",\"prompt\":\"\xff\xfe\"}",
        &mut Ids::default(),
    );
    assert_eq!(
        l.parsed.unwrap_err().to_string(),
        "not valid UTF-8 (at byte 21 of the line)"
    );
    assert!(l.id.text.starts_with("sha256:"));
}

#[test]
fn big_integer_ids_are_kept_digit_for_digit() {
    let a = parse(1, r#"{"id": 12345678901234567890123, "prompt": "a"}"#);
    let b = parse(2, r#"{"id": 12345678901234567890124, "prompt": "b"}"#);
    assert_eq!(a.id.text, "12345678901234567890123");
    assert_ne!(a.id.key(), b.id.key());
    assert_eq!(
        serde_json::to_string(&a.id).unwrap(),
        "12345678901234567890123",
        "written back as the same number"
    );
    assert_eq!(serde_json::to_value(s("3")).unwrap(), json!("3"));
    // `1` and `"1"` are one id.
    assert_eq!(
        parse(3, r#"{"id":1,"prompt":"x"}"#).id.key(),
        parse(4, r#"{"id":"1","prompt":"x"}"#).id.key()
    );
}

#[test]
fn an_id_less_line_is_named_after_its_content_not_its_place() {
    let a = parse(1, r#"{"prompt":"hi"}"#);
    let moved = parse(40, r#"{"prompt":"hi"}"#);
    assert_eq!(a.id, moved.id);
    assert_eq!(a.id.text.len(), "sha256:".len() + 16);
    assert_ne!(a.id, parse(1, r#"{"prompt":"ho"}"#).id);
    let mut ids = Ids::new(HashMap::from([(content_hash(br#"{"prompt":"hi"}"#), 0)]));
    let first = parse_line(1, br#"{"prompt":"hi"}"#, &mut ids);
    let second = parse_line(2, br#"{"prompt":"hi"}"#, &mut ids);
    assert_eq!(first.id, a.id);
    assert_eq!(second.id.text, format!("{}#2", a.id.text));
}

fn file(lines: &[&str]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f
}

fn nothing() -> (HashSet<u128>, HashMap<u128, Option<u64>>) {
    (HashSet::new(), HashMap::new())
}

fn known<'a>(completed: &'a HashSet<u128>, failed: &'a HashMap<u128, Option<u64>>) -> Known<'a> {
    Known {
        completed,
        failed,
        retry: RetryFailed::No,
    }
}

#[test]
fn duplicate_ids_are_found_with_both_lines() {
    let f = file(&[
        r#"{"id":"a","prompt":"1"}"#,
        "",
        r#"{"id":"b","prompt":"2"}"#,
        r#"{"id":"a","prompt":"3"}"#,
    ]);
    let (c, x) = nothing();
    match scan(f.path(), None, &known(&c, &x)) {
        Err(InputError::Duplicate {
            id,
            first_line,
            line,
            ..
        }) => assert_eq!((id.as_str(), first_line, line), ("a", 1, 4)),
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert_eq!(scan(f.path(), Some(2), &known(&c, &x)).unwrap().total, 2);
}

#[test]
fn the_scan_finds_where_pending_work_starts_and_the_reader_resumes_there() {
    let f = file(&[
        r#"{"id":"a","prompt":"1"}"#,
        "",
        r#"{"id":"b","prompt":"2"}"#,
        r#"{"id":"c","prompt":"3"}"#,
    ]);
    let done: HashSet<u128> = [key_of("a"), key_of("c")].into();
    let none = HashMap::new();
    let sc = scan(f.path(), Some(3), &known(&done, &none)).unwrap();
    assert_eq!((sc.total, sc.completed), (3, 2));
    let at = sc.first_pending.unwrap();
    assert_eq!((at.line, at.yielded), (1, 1));
    let mut ids = Ids::new(sc.repeats.clone());
    let mut r = Reader::open_at(f.path(), Some(3), at)
        .unwrap()
        .until(sc.end);
    let l = r.next_line(&mut ids).unwrap().unwrap();
    assert_eq!((l.number, l.id.text.as_str()), (3, "b"));
    assert_eq!(r.next_line(&mut ids).unwrap().unwrap().id.text, "c");
    assert!(
        r.next_line(&mut ids).unwrap().is_none(),
        "the limit still counts from the top"
    );
    let all: HashSet<u128> = ["a", "b", "c"].map(key_of).into();
    assert_eq!(
        scan(f.path(), None, &known(&all, &none))
            .unwrap()
            .first_pending,
        None
    );
}

#[test]
fn repeated_id_less_lines_are_numbered_and_a_resume_keeps_their_numbers() {
    let f = file(&[
        r#"{"prompt":"same"}"#,
        r#"{"prompt":"other"}"#,
        r#"{"prompt":"same"}"#,
        r#"{"prompt":"same"}"#,
    ]);
    let (c, x) = nothing();
    let all = scan(f.path(), None, &known(&c, &x)).unwrap();
    assert_eq!(all.total, 4);
    let mut ids = Ids::new(all.repeats.clone());
    let mut r = Reader::open(f.path(), None).unwrap().until(all.end);
    let names: Vec<String> = std::iter::from_fn(|| r.next_line(&mut ids).unwrap())
        .map(|l| l.id.text)
        .collect();
    let same = Id::content(content_hash(br#"{"prompt":"same"}"#), 1).text;
    assert_eq!(names[0], same);
    assert_eq!(names[2], format!("{same}#2"));
    assert_eq!(names[3], format!("{same}#3"));
    // The first two are done: the reader starts at line 3 and still names it #2.
    let done: HashSet<u128> = [key_of(&names[0]), key_of(&names[1])].into();
    let none = HashMap::new();
    let rest = scan(f.path(), None, &known(&done, &none)).unwrap();
    let at = rest.first_pending.unwrap();
    assert_eq!(at.line, 2);
    let mut ids = Ids::new(rest.repeats.clone());
    let mut r = Reader::open_at(f.path(), None, at).unwrap().until(rest.end);
    let l = r.next_line(&mut ids).unwrap().unwrap();
    assert_eq!((l.number, l.id.text.clone()), (3, format!("{same}#2")));
}

#[test]
fn a_bom_is_skipped_and_blank_lines_and_the_limit_are_honoured() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(b"\xEF\xBB\xBF{\"id\":\"a\",\"prompt\":\"1\"}\n   \n{\"prompt\":\"2\"}\n{\"prompt\":\"3\"}\n")
        .unwrap();
    let mut r = Reader::open(f.path(), Some(2)).unwrap();
    let mut ids = Ids::default();
    let first = r.next_line(&mut ids).unwrap().unwrap();
    assert_eq!((first.number, first.id.text.as_str()), (1, "a"));
    assert!(first.parsed.is_ok());
    assert_eq!(r.next_line(&mut ids).unwrap().unwrap().number, 3);
    assert!(r.next_line(&mut ids).unwrap().is_none());
}

#[test]
fn the_reader_ignores_appended_lines_and_notices_a_file_that_shrank() {
    let f = file(&[r#"{"id":"a","prompt":"1"}"#, r#"{"id":"b","prompt":"2"}"#]);
    let (c, x) = nothing();
    let sc = scan(f.path(), None, &known(&c, &x)).unwrap();
    let mut more = std::fs::OpenOptions::new()
        .append(true)
        .open(f.path())
        .unwrap();
    writeln!(more, r#"{{"id":"c","prompt":"3"}}"#).unwrap();
    let mut ids = Ids::default();
    let mut r = Reader::open(f.path(), None).unwrap().until(sc.end);
    assert_eq!(r.next_line(&mut ids).unwrap().unwrap().id.text, "a");
    assert_eq!(r.next_line(&mut ids).unwrap().unwrap().id.text, "b");
    assert!(
        r.next_line(&mut ids).unwrap().is_none(),
        "the appended line is left out"
    );

    let short = file(&[r#"{"id":"a","prompt":"1"}"#]);
    let mut r = Reader::open(short.path(), None).unwrap().until(sc.end);
    r.next_line(&mut ids).unwrap();
    assert!(matches!(
        r.next_line(&mut ids),
        Err(InputError::Shrank {
            expected: 48,
            at: 24,
            ..
        })
    ));
}

#[test]
fn retry_failed_picks_the_edited_lines_or_all_of_them() {
    let f = file(&[
        r#"{"id":"a","prompt":"fixed"}"#,
        r#"{"id":"b","prompt":"same"}"#,
    ]);
    let completed = HashSet::new();
    let failed = HashMap::from([
        (
            key_of("a"),
            Some(content_hash(br#"{"id":"a","prompt":"broken"}"#)),
        ),
        (
            key_of("b"),
            Some(content_hash(br#"{"id":"b","prompt":"same"}"#)),
        ),
    ]);
    let mut k = known(&completed, &failed);
    let sc = scan(f.path(), None, &k).unwrap();
    assert_eq!((sc.failed, sc.retry.len()), (2, 0));
    assert_eq!(sc.first_pending, None, "nothing to do");
    k.retry = RetryFailed::Changed;
    let sc = scan(f.path(), None, &k).unwrap();
    assert_eq!(sc.retry, HashSet::from([key_of("a")]));
    assert_eq!(sc.failed, 1);
    assert_eq!(sc.first_pending.map(|p| p.line), Some(0));
    k.retry = RetryFailed::All;
    assert_eq!(scan(f.path(), None, &k).unwrap().retry.len(), 2);
}

#[test]
fn the_id_column_hash_changes_when_lines_move_or_ids_change() {
    let (c, x) = nothing();
    let hash = |lines: &[&str]| {
        let f = file(lines);
        scan(f.path(), None, &known(&c, &x)).unwrap().ids_hash
    };
    let ab = hash(&[r#"{"id":"a","prompt":"1"}"#, r#"{"id":"b","prompt":"2"}"#]);
    assert_eq!(ab.len(), 64);
    assert_eq!(
        ab,
        hash(&[r#"{"id":"a","prompt":"x"}"#, r#"{"id":"b","prompt":"y"}"#])
    );
    assert_ne!(
        ab,
        hash(&[r#"{"id":"b","prompt":"2"}"#, r#"{"id":"a","prompt":"1"}"#])
    );
    assert_ne!(ab, hash(&[r#"{"id":"a","prompt":"1"}"#]));
}

#[test]
fn the_scan_gives_the_files_identity_facts_from_the_same_open() {
    let (c, x) = nothing();
    let expect = |path: &std::path::Path| {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(path).unwrap();
        let head = &bytes[..bytes.len().min(HEAD_BYTES as usize)];
        let mtime = std::fs::metadata(path)
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        FileFacts {
            size: bytes.len() as u64,
            mtime_unix: mtime,
            head_sha256: hex(&Sha256::digest(head)),
        }
    };
    // Longer than the head, with a blank line and a BOM: the head is the file's bytes as they are.
    let mut lines: Vec<String> = (0..3000)
        .map(|i| json!({"id": format!("p{i}"), "prompt": "x".repeat(40)}).to_string())
        .collect();
    lines[0] = format!("\u{feff}{}", lines[0]);
    lines.insert(5, String::new());
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let long = file(&refs);
    assert!(std::fs::metadata(long.path()).unwrap().len() > HEAD_BYTES);
    let all = scan(long.path(), None, &known(&c, &x)).unwrap();
    assert_eq!(all.file, expect(long.path()));
    // --limit stops the lines early, not the head.
    let one = scan(long.path(), Some(1), &known(&c, &x)).unwrap();
    assert_eq!((one.total, &one.file), (1, &expect(long.path())));
    // A short file; and repeated id-less lines, which take the second pass.
    let short = file(&[r#"{"prompt":"same"}"#, r#"{"prompt":"same"}"#]);
    let sc = scan(short.path(), None, &known(&c, &x)).unwrap();
    assert_eq!((sc.total, &sc.file), (2, &expect(short.path())));
}
