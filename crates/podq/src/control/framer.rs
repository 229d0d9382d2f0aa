//! Cutting a connection's byte stream into request lines without ever holding more
//! than the limit. Pure and total: any bytes, in any chunks, give frames or nothing.

/// One unit cut from the byte stream by [`LineFramer`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A complete line, without its newline; never longer than the limit.
    Line(Vec<u8>),
    /// A line that exceeded the limit; its bytes were dropped.
    TooLong,
}

/// Splits a byte stream into lines, holding at most `limit` bytes: an over-long line is
/// dropped as it arrives and reported as [`Frame::TooLong`] when its newline comes, so
/// the next line is read normally. Blank lines are skipped.
#[derive(Debug)]
pub(crate) struct LineFramer {
    /// The current line so far (empty while dropping an over-long line).
    buf: Vec<u8>,
    /// Whether the current line already exceeded `limit`.
    overflowed: bool,
    /// The longest line accepted.
    limit: usize,
}

impl LineFramer {
    /// A framer accepting lines of at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> LineFramer {
        LineFramer {
            buf: Vec::new(),
            overflowed: false,
            limit,
        }
    }

    /// Whether a line has started and not yet ended.
    pub(crate) fn in_line(&self) -> bool {
        self.overflowed || !self.buf.is_empty()
    }

    /// Feeds bytes; returns the frames they complete.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            let (data, complete) = match piece.split_last() {
                Some((b'\n', data)) => (data, true),
                _ => (piece, false),
            };
            if !self.overflowed {
                if self.buf.len() + data.len() > self.limit {
                    self.overflowed = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(data);
                }
            }
            if complete {
                if let Some(frame) = self.take() {
                    frames.push(frame);
                }
            }
        }
        frames
    }

    /// Ends the stream: a last line without a newline still counts.
    pub(crate) fn finish(&mut self) -> Option<Frame> {
        self.take()
    }

    fn take(&mut self) -> Option<Frame> {
        let frame = if std::mem::take(&mut self.overflowed) {
            Some(Frame::TooLong)
        } else if self.buf.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(Frame::Line(std::mem::take(&mut self.buf)))
        };
        self.buf.clear();
        frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn framer_bounds_lines() {
        let mut f = LineFramer::new(8);
        assert_eq!(f.push(b"abc\n\n  \nde"), vec![Frame::Line(b"abc".to_vec())]);
        assert!(f.in_line());
        assert_eq!(f.push(b"f\n"), vec![Frame::Line(b"def".to_vec())]);
        assert!(!f.in_line());
        assert_eq!(f.push(b"0123456"), vec![]);
        assert_eq!(f.push(b"789abc"), vec![]);
        assert!(f.buf.is_empty(), "over-long bytes are not kept");
        assert_eq!(
            f.push(b"def\nok\n"),
            vec![Frame::TooLong, Frame::Line(b"ok".to_vec())]
        );
        assert_eq!(
            f.push(b"12345678\n"),
            vec![Frame::Line(b"12345678".to_vec())]
        );
        assert_eq!(f.push(b"tail"), vec![]);
        assert_eq!(f.finish(), Some(Frame::Line(b"tail".to_vec())));
        assert_eq!(f.finish(), None);
    }

    proptest! {
        #[test]
        fn framer_matches_split(chunks in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), Just(b' ')], 0..30), 0..10)) {
            let limit = 6;
            let mut f = LineFramer::new(limit);
            let mut got = Vec::new();
            for c in &chunks {
                got.extend(f.push(c));
            }
            got.extend(f.finish());
            let all: Vec<u8> = chunks.concat();
            let want: Vec<Frame> = all
                .split(|&b| b == b'\n')
                .filter_map(|l| {
                    if l.len() > limit {
                        Some(Frame::TooLong)
                    } else if l.iter().all(u8::is_ascii_whitespace) {
                        None
                    } else {
                        Some(Frame::Line(l.to_vec()))
                    }
                })
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
