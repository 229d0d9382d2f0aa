//! Fuzzes the control server's input path: framing, request parsing and the attribute
//! value parsers. Any panic is a bug; errors are the expected answer to bad input.
//!
//! `cargo +nightly fuzz run control_request fuzz/corpus/control_request`
#![no_main]

use libfuzzer_sys::fuzz_target;
use podq::control::attr::{parse_default_scope, parse_value, Attr};
use podq::control::protocol::{parse_request, Frame, LineFramer, Request};
use podq::control::MAX_REQUEST_BYTES;

fuzz_target!(|data: &[u8]| {
    let _ = parse_request(data);
    let mut framer = LineFramer::new(MAX_REQUEST_BYTES);
    let mut frames = framer.push(data);
    frames.extend(framer.finish());
    for frame in frames {
        let Frame::Line(line) = frame else { continue };
        assert!(line.len() <= MAX_REQUEST_BYTES);
        match parse_request(&line) {
            Ok(Request::Set { attr, value, .. }) => {
                if let Ok(attr) = attr.parse::<Attr>() {
                    let _ = parse_value(attr, &value, 64);
                }
            }
            Ok(Request::SetDefaultScope { value }) => {
                let _ = parse_default_scope(&value);
            }
            _ => {}
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for attr in Attr::ALL {
            let _ = parse_value(attr, text, 4096);
        }
    }
});
