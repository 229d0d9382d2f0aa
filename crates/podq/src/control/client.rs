//! A blocking client for the control protocol, which trusts a server no more than the
//! server trusts it: it checks the socket's directory and owner as the server made them,
//! the peer's credentials (`SO_PEERCRED`), and bounds each reply's size and total time.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::{Reply, Request};
use super::socket::{self, check_private_dir, PeerCredentials};
use super::ControlError;

/// The longest reply read: stats of many workqueues on a large machine fit easily; a
/// server sending more is not a podq server.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// Who must be listening: checked after `connect`, with the kernel's credentials.
#[derive(Clone, Copy, Debug)]
struct Expected {
    /// The server's process id, when the caller named one.
    pid: Option<u32>,
    /// The uid the server must run as.
    uid: Uid,
}

#[derive(Clone, Copy, Debug)]
enum Uid {
    /// Exactly this uid (the owner of the process asked for).
    Exactly(u32),
    /// This process's uid or root; any uid when this process is root.
    OursOrRoot,
}

/// A connection to a control server.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    stream: UnixStream,
    /// Bytes received after the last reply's newline (the start of the next line).
    pending: Vec<u8>,
    /// The time allowed for each request's whole reply.
    timeout: Duration,
    server: PeerCredentials,
}

/// The effective uid of process `pid` (`Uid:` in `/proc/<pid>/status`).
fn process_uid(pid: u32) -> Result<u32, ControlError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            ControlError::NoProcess { pid }
        } else {
            ControlError::io(format!("cannot read {path}"), e)
        }
    })?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| {
            ControlError::io(
                format!("cannot read {path}"),
                std::io::Error::new(ErrorKind::InvalidData, "no effective uid in it"),
            )
        })
}

impl Client {
    /// Connects to the server at `path`, which must run as this process's uid or as
    /// root (any uid when this process is root). Each request's reply must arrive in
    /// full within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, ControlError> {
        Client::connect_expecting(
            path,
            Expected {
                pid: None,
                uid: Uid::OursOrRoot,
            },
            timeout,
        )
    }

    /// Connects to process `pid`'s control server, found by the default path rules
    /// (see the module README). A candidate socket is used only if its directory is a
    /// real directory owned by the process's uid and closed to everyone else, the
    /// socket is owned by that uid, and the process listening is `pid` itself running
    /// as that uid. A non-root client may reach only its own processes (the server
    /// refuses others anyway).
    pub fn connect_to_pid(pid: u32, timeout: Duration) -> Result<Client, ControlError> {
        let owner = process_uid(pid)?;
        let me = socket::euid();
        if me != 0 && owner != me {
            return Err(ControlError::NotPermitted { pid, owner });
        }
        let expected = Expected {
            pid: Some(pid),
            uid: Uid::Exactly(owner),
        };
        let mut tried = Vec::new();
        for path in socket::socket_candidates(pid, owner) {
            if std::fs::symlink_metadata(&path).is_err() {
                tried.push(format!("{}: no such socket", path.display()));
                continue;
            }
            match Client::connect_verified(&path, expected, timeout) {
                Ok(client) => return Ok(client),
                Err(e) => tried.push(super::error::chain_text(&e)),
            }
        }
        Err(ControlError::NoServer { pid, tried })
    }

    /// One candidate of [`connect_to_pid`](Self::connect_to_pid): its directory and
    /// socket file checked, then the peer.
    fn connect_verified(
        path: &Path,
        expected: Expected,
        timeout: Duration,
    ) -> Result<Client, ControlError> {
        if let Uid::Exactly(uid) = expected.uid {
            Client::check_socket(path, uid)?;
        }
        Client::connect_expecting(path, expected, timeout)
    }

    /// The directory and socket file checks of [`connect_to_pid`](Self::connect_to_pid).
    fn check_socket(path: &Path, uid: u32) -> Result<(), ControlError> {
        let untrusted = |reason: String| ControlError::Untrusted {
            path: path.to_owned(),
            reason,
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        check_private_dir(dir, uid)
            .map_err(|reason| untrusted(format!("its directory {} {reason}", dir.display())))?;
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| ControlError::io(format!("cannot inspect {}", path.display()), e))?;
        if !meta.file_type().is_socket() {
            return Err(untrusted("is not a socket".into()));
        }
        if meta.uid() != uid {
            return Err(untrusted(format!(
                "the socket is owned by uid {}, not by uid {uid}",
                meta.uid()
            )));
        }
        Ok(())
    }

    fn connect_expecting(
        path: &Path,
        expected: Expected,
        timeout: Duration,
    ) -> Result<Client, ControlError> {
        let stream = socket::connect_within(path, timeout).map_err(|e| {
            if e.kind() == ErrorKind::TimedOut {
                ControlError::Timeout {
                    path: path.to_owned(),
                    after: timeout,
                }
            } else {
                ControlError::io(format!("cannot connect to {}", path.display()), e)
            }
        })?;
        let server = socket::peer_credentials(&stream).map_err(|e| {
            ControlError::io(
                format!("cannot read the credentials of {}", path.display()),
                e,
            )
        })?;
        let untrusted = |reason: String| ControlError::Untrusted {
            path: path.to_owned(),
            reason,
        };
        if let Some(pid) = expected.pid {
            if i64::from(server.pid) != i64::from(pid) {
                return Err(untrusted(format!(
                    "the process listening is pid {}, not {pid}",
                    server.pid
                )));
            }
        }
        let me = socket::euid();
        let uid_ok = match expected.uid {
            Uid::Exactly(uid) => server.uid == uid,
            Uid::OursOrRoot => me == 0 || server.uid == me || server.uid == 0,
        };
        if !uid_ok {
            return Err(untrusted(format!(
                "the process listening runs as uid {}",
                server.uid
            )));
        }
        Ok(Client {
            path: path.to_owned(),
            stream,
            pending: Vec::new(),
            timeout,
            server,
        })
    }

    /// The server process's credentials, as the kernel reported them at `connect`.
    pub fn server(&self) -> PeerCredentials {
        self.server
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and returns the reply as sent, error replies included. The
    /// whole exchange must end within the client's timeout.
    pub fn request(&mut self, request: &Request) -> Result<Reply, ControlError> {
        let deadline = Instant::now() + self.timeout;
        let sent = self.send(request.to_line().as_bytes(), deadline);
        // A server that refuses a connection (peer check) replies and closes at once,
        // so the send may fail; its reply is still there to read.
        match (self.read_line(deadline), sent) {
            (Ok(line), _) => self.parse(&line),
            (Err(ControlError::Closed { .. }), Err(e)) => Err(e),
            (Err(e), _) => Err(e),
        }
    }

    /// Sends one request; an error reply becomes [`ControlError::Remote`] with the
    /// server's message.
    pub fn call(&mut self, request: &Request) -> Result<Reply, ControlError> {
        let reply = self.request(request)?;
        match reply.error_text() {
            Some(message) => Err(ControlError::Remote {
                message: message.to_owned(),
                closing: reply.closing,
            }),
            None => Ok(reply),
        }
    }

    fn timed_out(&self) -> ControlError {
        ControlError::Timeout {
            path: self.path.clone(),
            after: self.timeout,
        }
    }

    fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), ControlError> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out());
            }
            let io_err = |e| {
                ControlError::io(
                    format!("cannot send a request to {}", self.path.display()),
                    e,
                )
            };
            self.stream.set_write_timeout(Some(left)).map_err(io_err)?;
            match self.stream.write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timed_out())
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Ok(())
    }

    /// Reads up to the next newline, within `deadline` and [`MAX_REPLY_BYTES`].
    fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, ControlError> {
        let mut scanned = 0;
        loop {
            if let Some(end) = self.pending[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + end;
                let rest = self.pending.split_off(end + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                return Ok(line);
            }
            scanned = self.pending.len();
            if self.pending.len() > MAX_REPLY_BYTES {
                return Err(ControlError::ReplyTooLarge {
                    path: self.path.clone(),
                    limit: MAX_REPLY_BYTES,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out());
            }
            let io_err = |e| ControlError::io(format!("no reply from {}", self.path.display()), e);
            self.stream.set_read_timeout(Some(left)).map_err(io_err)?;
            let mut buf = [0u8; 64 * 1024];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(ControlError::Closed {
                        path: self.path.clone(),
                    })
                }
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timed_out())
                }
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    return Err(ControlError::Closed {
                        path: self.path.clone(),
                    })
                }
                Err(e) => return Err(io_err(e)),
            }
        }
    }

    fn parse(&self, line: &[u8]) -> Result<Reply, ControlError> {
        let bad = |source| {
            let text = String::from_utf8_lossy(line);
            ControlError::BadReply {
                path: self.path.clone(),
                excerpt: text.chars().take(80).collect(),
                source,
            }
        };
        serde_json::from_slice(line).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::super::socket::euid;
    use super::*;
    use std::fs::{self, Permissions};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    use std::thread;

    const SHORT: Duration = Duration::from_millis(300);

    fn me() -> u32 {
        std::process::id()
    }

    fn expect(pid: u32, uid: u32) -> Expected {
        Expected {
            pid: Some(pid),
            uid: Uid::Exactly(uid),
        }
    }

    /// A private directory holding a socket, as a real server makes them.
    fn planted() -> (tempfile::TempDir, PathBuf, UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("podq");
        fs::create_dir(&sub).unwrap();
        fs::set_permissions(&sub, Permissions::from_mode(0o700)).unwrap();
        let path = sub.join("1.sock");
        let listener = UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    /// A fake server: accepts one connection, reads the request line, then runs `reply`.
    fn fake(listener: UnixListener, reply: impl FnOnce(&mut UnixStream) + Send + 'static) {
        thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            while stream.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {}
            reply(&mut stream);
        });
    }

    fn refusal(result: Result<Client, ControlError>) -> String {
        super::super::error::chain_text(&result.unwrap_err())
    }

    #[test]
    fn a_good_socket_is_accepted() {
        let (_dir, path, listener) = planted();
        fake(listener, |s| {
            let _ = s.write_all(b"{\"ok\":true,\"value\":\"smt\"}\n");
        });
        let mut client = Client::connect_verified(&path, expect(me(), euid()), SHORT).unwrap();
        assert_eq!(client.server().pid, me() as i32);
        let reply = client.call(&Request::GetDefaultScope).unwrap();
        assert_eq!(reply.value.as_deref(), Some("smt"));
    }

    #[test]
    fn a_planted_directory_is_refused() {
        let (_dir, path, _listener) = planted();
        let sub = path.parent().unwrap();
        fs::set_permissions(sub, Permissions::from_mode(0o755)).unwrap();
        let text = refusal(Client::connect_verified(&path, expect(me(), euid()), SHORT));
        assert!(text.contains("is not a trusted control server"), "{text}");
        assert!(text.contains("has mode 755"), "{text}");
        fs::set_permissions(sub, Permissions::from_mode(0o700)).unwrap();
        // Owned by someone else: tried as the owner this directory is not.
        let text = refusal(Client::connect_verified(
            &path,
            expect(me(), euid() + 1),
            SHORT,
        ));
        assert!(
            text.contains(&format!(
                "is owned by uid {}, not by uid {}",
                euid(),
                euid() + 1
            )),
            "{text}"
        );
    }

    #[test]
    fn a_socket_of_another_owner_is_refused() {
        if euid() != 0 {
            eprintln!("NOT RUN: changing a socket's owner needs root");
            return;
        }
        let (_dir, path, _listener) = planted();
        std::os::unix::fs::lchown(&path, Some(65534), Some(65534)).unwrap();
        let text = refusal(Client::connect_verified(&path, expect(me(), 0), SHORT));
        assert!(
            text.contains("the socket is owned by uid 65534, not by uid 0"),
            "{text}"
        );
        // The directory too.
        std::os::unix::fs::lchown(&path, Some(0), Some(0)).unwrap();
        std::os::unix::fs::lchown(path.parent().unwrap(), Some(65534), Some(65534)).unwrap();
        let text = refusal(Client::connect_verified(&path, expect(me(), 0), SHORT));
        assert!(
            text.contains("is owned by uid 65534, not by uid 0"),
            "{text}"
        );
    }

    #[test]
    fn a_server_of_another_pid_is_refused() {
        let (_dir, path, _listener) = planted();
        let text = refusal(Client::connect_verified(&path, expect(1, euid()), SHORT));
        assert!(
            text.ends_with(&format!("the process listening is pid {}, not 1", me())),
            "{text}"
        );
        let text = refusal(Client::connect_expecting(
            &path,
            Expected {
                pid: None,
                uid: Uid::Exactly(euid() + 1),
            },
            SHORT,
        ));
        assert!(
            text.ends_with(&format!("the process listening runs as uid {}", euid())),
            "{text}"
        );
    }

    #[test]
    fn a_trickling_reply_ends_at_the_deadline() {
        let (_dir, path, listener) = planted();
        fake(listener, |s| {
            // One byte every 50 ms: no single read ever waits long.
            for _ in 0..200 {
                if s.write_all(b" ").is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        let mut client = Client::connect(&path, SHORT).unwrap();
        let begun = Instant::now();
        let err = client.call(&Request::List).unwrap_err();
        assert!(
            begun.elapsed() < Duration::from_secs(3),
            "{:?}",
            begun.elapsed()
        );
        assert_eq!(
            err.to_string(),
            format!("no reply from {} within 300 ms", path.display())
        );
        assert!(std::error::Error::source(&err).is_none(), "said once");
    }

    #[test]
    fn a_listener_that_never_accepts_ends_at_the_deadline() {
        let (_dir, path, listener) = planted();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        // SAFETY: the listener's fd is open; listen() again only shrinks its backlog.
        let rc = unsafe { libc::listen(fd, 0) };
        assert_eq!(rc, 0);
        let mut held = Vec::new();
        while let Ok(stream) = socket::connect_within(&path, Duration::ZERO) {
            held.push(stream);
            assert!(held.len() < 64, "the backlog never filled");
        }
        let begun = Instant::now();
        let err = Client::connect(&path, SHORT).unwrap_err();
        assert!(
            begun.elapsed() < Duration::from_secs(3),
            "{:?}",
            begun.elapsed()
        );
        assert_eq!(
            err.to_string(),
            format!("no reply from {} within 300 ms", path.display())
        );
    }

    #[test]
    fn an_oversized_reply_is_cut_off() {
        let (_dir, path, listener) = planted();
        fake(listener, |s| {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_REPLY_BYTES >> 20) + 4 {
                if s.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        let mut client = Client::connect(&path, Duration::from_secs(20)).unwrap();
        let err = client.call(&Request::List).unwrap_err();
        assert!(
            matches!(err, ControlError::ReplyTooLarge { limit, .. } if limit == MAX_REPLY_BYTES),
            "{err}"
        );
    }

    #[test]
    fn escape_sequences_in_replies_are_not_printed_raw() {
        let (_dir, path, listener) = planted();
        fake(listener, |s| {
            let _ = s.write_all(b"{\"ok\":false,\"error\":\"\\u001b]0;pwned\\u0007\\u001b[2J\"}\n");
        });
        let mut client = Client::connect(&path, SHORT).unwrap();
        let err = client.call(&Request::List).unwrap_err().to_string();
        assert_eq!(err, r"\u{1b}]0;pwned\u{7}\u{1b}[2J");
        let (_dir, path, listener) = planted();
        fake(listener, |s| {
            let _ = s.write_all(b"\x1b[31mnot json\n");
        });
        let mut client = Client::connect(&path, SHORT).unwrap();
        let err = client.call(&Request::List).unwrap_err().to_string();
        assert!(err.ends_with(r": `\u{1b}[31mnot json`"), "{err}");
    }

    #[test]
    fn connect_failures_name_the_cause_once() {
        let err = Client::connect(Path::new("/nonexistent/x.sock"), SHORT).unwrap_err();
        assert_eq!(err.to_string(), "cannot connect to /nonexistent/x.sock");
        assert_eq!(
            super::super::error::chain_text(&err),
            "cannot connect to /nonexistent/x.sock: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_process_without_a_socket_is_named() {
        // A pid no process has (above the kernel's pid_max limit).
        let err = Client::connect_to_pid(1 << 23, SHORT)
            .unwrap_err()
            .to_string();
        assert_eq!(err, format!("no process with pid {}", 1 << 23));
        // A live process (this one) with no control server.
        let err = Client::connect_to_pid(me(), SHORT).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("process {} has no usable control socket (", me())),
            "{err}"
        );
        assert!(err.contains("no such socket"), "{err}");
    }
}
