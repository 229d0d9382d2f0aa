//! One client connection as the server's event loop drives it: bytes in, framed
//! requests answered in order, replies out, and the clocks that end it. Non-blocking
//! throughout; the loop calls [`Connection::read`] and [`Connection::write`] when `poll`
//! says so and [`Connection::deadline`] tells it when to look again.
//!
//! Activity is a request answered: blank lines are skipped by the framer and move no
//! clock, so a client cannot hold a connection by sending newlines.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::error::seconds;
use super::framer::{Frame, LineFramer};
use super::protocol::{self, Reply, MAX_REQUEST_BYTES};
use super::{dispatch, ControlError, ControlTarget};

/// Replies waiting for a slow reader beyond this stop the reading of further requests
/// (a client that pipelines without reading cannot make the server buffer without end).
const OUT_HIGH_WATER: usize = 256 * 1024;

/// The timeouts a connection lives by (the server's settings).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Silence allowed between requests.
    pub(crate) idle: Duration,
    /// Time allowed for one request line to arrive, and for a reply write to progress.
    pub(crate) request: Duration,
}

/// What the event loop does with a connection after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Keep it.
    Keep,
    /// Close it now.
    Close,
}

/// A connection's state. Owned by the event loop's thread alone.
#[derive(Debug)]
pub(crate) struct Connection {
    stream: UnixStream,
    framer: LineFramer,
    /// Reply bytes not yet written; `out[written..]` is pending.
    out: Vec<u8>,
    written: usize,
    /// When the last request was answered (or the connection made).
    last_request: Instant,
    /// When the current, unfinished request line started.
    line_started: Option<Instant>,
    /// When the pending output last made progress.
    write_progress: Instant,
    /// The peer sent EOF: write what is pending, then close.
    draining: bool,
}

impl Connection {
    /// A connection accepted now; `stream` must be non-blocking.
    pub(crate) fn new(stream: UnixStream, now: Instant) -> Connection {
        Connection {
            stream,
            framer: LineFramer::new(MAX_REQUEST_BYTES),
            out: Vec::new(),
            written: 0,
            last_request: now,
            line_started: None,
            write_progress: now,
            draining: false,
        }
    }

    pub(crate) fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// When the last request was answered: the eviction order when every slot is taken.
    pub(crate) fn last_request(&self) -> Instant {
        self.last_request
    }

    fn pending(&self) -> usize {
        self.out.len() - self.written
    }

    /// Whether to poll for input.
    pub(crate) fn wants_read(&self) -> bool {
        !self.draining && self.pending() < OUT_HIGH_WATER
    }

    /// Whether to poll for output room.
    pub(crate) fn wants_write(&self) -> bool {
        self.pending() > 0
    }

    /// The next instant at which [`expire`](Self::expire) has something to do.
    pub(crate) fn deadline(&self, limits: Limits) -> Instant {
        let mut at = if self.wants_write() {
            self.write_progress + limits.request
        } else {
            self.last_request + limits.idle
        };
        if let Some(start) = self.line_started {
            at = at.min(start + limits.request);
        }
        at
    }

    /// Reads what is there and answers every complete request.
    pub(crate) fn read(&mut self, target: &dyn ControlTarget, now: Instant) -> Next {
        let mut buf = [0u8; 4096];
        let frames = match self.stream.read(&mut buf) {
            Ok(0) => {
                self.draining = true;
                self.framer.finish().into_iter().collect()
            }
            Ok(n) => self.framer.push(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Next::Keep
            }
            Err(_) => return Next::Close,
        };
        for frame in frames {
            let reply = answer(target, frame);
            self.out.extend_from_slice(reply.to_line().as_bytes());
            self.last_request = now;
        }
        self.line_started = match (self.framer.in_line(), self.line_started) {
            (false, _) => None,
            (true, Some(start)) => Some(start),
            (true, None) => Some(now),
        };
        self.write(now)
    }

    /// Writes as much pending output as the socket takes.
    pub(crate) fn write(&mut self, now: Instant) -> Next {
        if self.pending() == 0 {
            // Nothing was waiting: the clock starts with the next reply.
            self.write_progress = now;
        }
        while self.pending() > 0 {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => return Next::Close,
                Ok(n) => {
                    self.written += n;
                    self.write_progress = now;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Next::Close,
            }
        }
        if self.pending() == 0 {
            self.out.clear();
            self.written = 0;
            if self.draining {
                return Next::Close;
            }
        }
        Next::Keep
    }

    /// Ends the connection if one of its clocks ran out, telling the client why.
    pub(crate) fn expire(&mut self, now: Instant, limits: Limits) -> Next {
        if self.wants_write() && now >= self.write_progress + limits.request {
            // The client stopped reading; there is no room to tell it.
            return Next::Close;
        }
        if let Some(start) = self.line_started {
            if now >= start + limits.request {
                self.close_with(&format!(
                    "timed out: request line incomplete after {}",
                    seconds(limits.request)
                ));
                return Next::Close;
            }
        }
        // The idle clock runs while a request line is in progress too: otherwise a client
        // could keep a line always started (` \n ` every few seconds) and never be idle.
        if !self.wants_write() && now >= self.last_request + limits.idle {
            self.close_with(&format!(
                "closing idle connection after {}",
                seconds(limits.idle)
            ));
            return Next::Close;
        }
        Next::Keep
    }

    /// Queues a closing notice and writes what fits now; the caller then drops the
    /// connection. The notice is a few dozen bytes, so it fits unless the client has
    /// left earlier replies unread.
    pub(crate) fn close_with(&mut self, message: &str) {
        self.out.extend_from_slice(
            Reply::closing_notice(message.to_owned())
                .to_line()
                .as_bytes(),
        );
        let _ = self.write(Instant::now());
    }
}

/// The reply to one frame. A panicking target must not take the server down.
fn answer(target: &dyn ControlTarget, frame: Frame) -> Reply {
    let request = match frame {
        Frame::TooLong => Err(ControlError::TooLarge {
            limit: MAX_REQUEST_BYTES,
        }),
        Frame::Line(line) => protocol::parse_request(&line),
    };
    match request {
        Ok(request) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(target, request)))
                .unwrap_or_else(|_| {
                    Reply::error("internal error: the request handler panicked".into())
                })
        }
        Err(e) => Reply::error(super::error::chain_text(&e)),
    }
}
