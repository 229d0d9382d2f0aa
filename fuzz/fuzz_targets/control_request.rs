//! Fuzzes the control server's input path: framing, request parsing and the attribute
//! and parameter value parsers. Any panic is a bug; errors are the expected answer to
//! bad input.
//!
//! `cargo +nightly fuzz run control_request fuzz/corpus/control_request`
#![no_main]

use libfuzzer_sys::fuzz_target;
use podq::control::fuzzing;

fuzz_target!(|data: &[u8]| {
    let _ = podq::control::parse_request(data);
    let _ = fuzzing::requests(data);
    if let Ok(text) = std::str::from_utf8(data) {
        fuzzing::attribute_values(text);
    }
});
