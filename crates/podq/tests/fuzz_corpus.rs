//! Replays the checked-in fuzz corpus through the control request parser: every file
//! must parse or be refused with a message, never panic; `valid_*` files must parse and
//! `invalid_*` files must be refused.

use std::path::Path;

use podq::control::protocol::{parse_request, Frame, LineFramer};
use podq::control::MAX_REQUEST_BYTES;

#[test]
fn corpus_replays_without_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/control_request");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus shrank to {} files", files.len());
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let mut framer = LineFramer::new(MAX_REQUEST_BYTES);
        let mut frames = framer.push(&bytes);
        frames.extend(framer.finish());
        let results: Vec<Result<(), String>> = frames
            .into_iter()
            .map(|frame| match frame {
                Frame::Line(line) => parse_request(&line).map(drop).map_err(|e| e.to_string()),
                Frame::TooLong => Err("too long".into()),
            })
            .collect();
        for result in &results {
            if let Err(message) = result {
                assert!(!message.is_empty(), "{name}: empty error message");
            }
        }
        if name.starts_with("valid_") {
            assert!(!results.is_empty(), "{name}: no request found");
            for result in &results {
                assert!(result.is_ok(), "{name}: {result:?}");
            }
        } else if name.starts_with("invalid_") {
            assert!(results.iter().any(Result::is_err), "{name} was accepted");
        }
        // The whole file as one line, unframed, must not panic either.
        let _ = parse_request(&bytes);
    }
}
