//! The control server's thread: one `poll` loop that accepts, checks each peer and
//! serves every connection. It never creates a thread, so it keeps answering when the
//! process can create no more (a thread limit) — exactly when the failure counters
//! matter.
//!
//! Connections are few (an operator, a monitor) and requests take microseconds, so one
//! thread serves them all; a slow request (a `refresh` reading sysfs) delays the others
//! by its duration. When every slot is taken, a new connection evicts the one whose
//! last request is oldest (see the README for why not a reserved slot).
//!
//! Field legend: T: owned by the server thread.

use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::connection::{Connection, Limits, Next};
use super::error::chain_text;
use super::socket;
use super::{ControlError, ControlTarget, Reply};

/// How long accepting pauses after `accept` fails for want of resources (out of file
/// descriptors or memory), instead of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The server thread's state: everything here is T (owned by that thread).
pub(super) struct EventLoop {
    listener: UnixListener,
    /// Readable (EOF) once [`ControlServer::stop`](crate::control::ControlServer::stop) shuts the other end.
    wake: UnixStream,
    target: Arc<dyn ControlTarget>,
    server_uid: u32,
    max_connections: usize,
    limits: Limits,
    connections: Vec<Connection>,
    /// Set while accepting backs off after a resource failure.
    accept_paused_until: Option<Instant>,
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

impl EventLoop {
    /// The loop of a server listening on `listener` (non-blocking), which ends once the
    /// other end of `wake` is shut down.
    pub(super) fn new(
        listener: UnixListener,
        wake: UnixStream,
        target: Arc<dyn ControlTarget>,
        max_connections: usize,
        limits: Limits,
    ) -> EventLoop {
        EventLoop {
            listener,
            wake,
            target,
            server_uid: socket::euid(),
            max_connections,
            limits,
            connections: Vec::new(),
            accept_paused_until: None,
        }
    }

    /// Serves until woken, then closes every connection with a closing notice.
    pub(super) fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            let limits = self.limits;
            self.connections
                .retain_mut(|c| c.expire(now, limits) == Next::Keep);
            if self.accept_paused_until.is_some_and(|t| t <= now) {
                self.accept_paused_until = None;
            }
            let accepting = self.accept_paused_until.is_none();
            fds.clear();
            fds.push(pollfd(self.wake.as_raw_fd(), libc::POLLIN));
            fds.push(pollfd(
                self.listener.as_raw_fd(),
                if accepting { libc::POLLIN } else { 0 },
            ));
            for c in &self.connections {
                let mut events = 0;
                if c.wants_read() {
                    events |= libc::POLLIN;
                }
                if c.wants_write() {
                    events |= libc::POLLOUT;
                }
                fds.push(pollfd(c.stream().as_raw_fd(), events));
            }
            let next = self
                .connections
                .iter()
                .map(|c| c.deadline(limits))
                .chain(self.accept_paused_until)
                .min();
            let timeout_ms = next.map_or(-1, |at| {
                let wait = at.saturating_duration_since(now);
                // Round up, so the loop does not wake just before a deadline.
                i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            });
            // SAFETY: `fds` is a live, initialised vector of `fds.len()` pollfds whose
            // descriptors stay open for the call (owned by `self`).
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if rc < 0 {
                // EINTR, or EAGAIN/ENOMEM from the kernel: try again shortly.
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            if fds[0].revents != 0 {
                break;
            }
            let now = Instant::now();
            let mut index = 0;
            let target = &*self.target;
            self.connections.retain_mut(|c| {
                let revents = fds[index + 2].revents;
                index += 1;
                let mut next = Next::Keep;
                if revents & libc::POLLOUT != 0 {
                    next = c.write(now);
                }
                if next == Next::Keep && revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                    next = if c.wants_read() {
                        c.read(target, now)
                    } else {
                        // Hung up while its replies wait: nobody will read them.
                        Next::Close
                    };
                }
                if revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                    next = Next::Close;
                }
                next == Next::Keep
            });
            if fds[1].revents & libc::POLLIN != 0 {
                self.accept_ready(now);
            }
        }
        for c in &mut self.connections {
            c.close_with("the control server is stopping");
        }
    }

    /// Accepts every pending connection.
    fn accept_ready(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream, now),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(_) => {
                    // Out of descriptors or memory: back off instead of spinning.
                    self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Checks the peer and gives it a slot, evicting the longest-idle connection if all
    /// are taken.
    fn admit(&mut self, stream: UnixStream, now: Instant) {
        let refuse = |stream: &UnixStream, error: ControlError| {
            let line = Reply::closing_notice(chain_text(&error)).to_line();
            let _ = (&*stream).write_all(line.as_bytes());
        };
        if let Err(e) = stream.set_nonblocking(true) {
            refuse(
                &stream,
                ControlError::io("cannot configure the connection", e),
            );
            return;
        }
        let peer = match socket::peer_credentials(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                refuse(
                    &stream,
                    ControlError::io("cannot read the peer's credentials", e),
                );
                return;
            }
        };
        if !socket::peer_allowed(self.server_uid, peer.uid) {
            refuse(
                &stream,
                ControlError::PeerRefused {
                    server_uid: self.server_uid,
                    peer_uid: peer.uid,
                },
            );
            return;
        }
        if self.connections.len() >= self.max_connections {
            let oldest = self
                .connections
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.last_request())
                .map(|(i, _)| i);
            if let Some(i) = oldest {
                let mut evicted = self.connections.swap_remove(i);
                let idle = now.saturating_duration_since(evicted.last_request());
                evicted.close_with(&format!(
                    "closing this connection: all {} connection slots are taken and it \
                     went longest without a request ({:.1} s)",
                    self.max_connections,
                    idle.as_secs_f64()
                ));
            }
        }
        self.connections.push(Connection::new(stream, now));
    }
}
