//! Replays the checked-in fuzz corpus through the control server's input path: every
//! file must frame and parse or be refused with a message, never panic; every request
//! of a `valid_*` file must parse and some request of an `invalid_*` file must be
//! refused.

use std::path::Path;

use podq::control::fuzzing;

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
        let results = fuzzing::requests(&bytes);
        for result in &results {
            if let Err(e) = result {
                assert!(!e.to_string().is_empty(), "{name}: empty error message");
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
        let _ = podq::control::parse_request(&bytes);
        if let Ok(text) = std::str::from_utf8(&bytes) {
            fuzzing::attribute_values(text);
        }
    }
}

/// The duplicate-key request of issue 13 is in the corpus and refused.
#[test]
fn duplicate_keys_are_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/control_request");
    let bytes = std::fs::read(dir.join("invalid_duplicate_cmd.json")).unwrap();
    let results = fuzzing::requests(&bytes);
    assert_eq!(results.len(), 1);
    let err = results[0].as_ref().unwrap_err();
    assert_eq!(err.to_string(), "malformed request: duplicate field `cmd`");
}
