//! The server's input path as one call, for the `control_request` fuzz target and the
//! corpus replay test (the `test-util` feature): framing, request parsing and the
//! attribute value parsers, exactly as a connection runs them.

use super::attr::{parse_default_scope, parse_value, Attr};
use super::framer::{Frame, LineFramer};
use super::param::{parse_param, Param};
use super::{parse_request, ControlError, Request, MAX_REQUEST_BYTES};

/// Frames `bytes` as a connection would and parses every request line; a `set`,
/// `set_default_scope` or `set_param` value is also run through its parser. Returns each frame's
/// result in order (an over-long line is [`ControlError::TooLarge`]). Never panics.
pub fn requests(bytes: &[u8]) -> Vec<Result<Request, ControlError>> {
    let mut framer = LineFramer::new(MAX_REQUEST_BYTES);
    let mut frames = framer.push(bytes);
    frames.extend(framer.finish());
    frames
        .into_iter()
        .map(|frame| match frame {
            Frame::TooLong => Err(ControlError::TooLarge {
                limit: MAX_REQUEST_BYTES,
            }),
            Frame::Line(line) => {
                assert!(line.len() <= MAX_REQUEST_BYTES, "the framer kept too much");
                let request = parse_request(&line)?;
                match &request {
                    Request::Set { attr, value, .. } => {
                        if let Ok(attr) = attr.parse::<Attr>() {
                            let _ = parse_value(attr, value, 64);
                        }
                    }
                    Request::SetDefaultScope { value } => {
                        let _ = parse_default_scope(value);
                    }
                    Request::SetParam { name, value } => {
                        if let Ok(param) = name.parse::<Param>() {
                            let _ = parse_param(param, value);
                        }
                    }
                    _ => {}
                }
                Ok(request)
            }
        })
        .collect()
}

/// Runs `text` through every attribute's value parser, with a wide cpumask, and every
/// parameter's.
pub fn attribute_values(text: &str) {
    for attr in Attr::ALL {
        let _ = parse_value(attr, text, 4096);
    }
    for param in Param::ALL {
        let _ = parse_param(param, text);
    }
}
