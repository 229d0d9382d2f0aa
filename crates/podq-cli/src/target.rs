//! `--pid N | --socket PATH`: which process's control server to talk to, and a session
//! with it that outlives the server's idle timeout.
//!
//! The server is trusted no more than it trusts us: with `--pid`, the socket must sit in
//! a directory only the process's user controls and belong to that user, and the
//! kernel must report that process `N` itself is listening (see
//! [`Client::connect_to_pid`]); with `--socket`, the server must run as our uid or
//! root. Every reply must arrive in full within [`REPLY_TIMEOUT`] and fit in
//! [`podq::control::MAX_REPLY_BYTES`]; text from it is escaped before it is printed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use podq::control::{Client, ControlError, Reply, Request};

/// How long a reply may take, in all.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The process whose control server to use.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// The process id; its socket is found by the default path rules and checked.
    #[arg(long, value_name = "N")]
    pub pid: Option<u32>,
    /// The control socket's path (its server must run as your uid or root).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl TargetArgs {
    /// Connects to the server.
    pub fn connect(&self) -> Result<Client> {
        let client = match (&self.socket, self.pid) {
            (Some(path), _) => Client::connect(path, REPLY_TIMEOUT)?,
            (None, Some(pid)) => Client::connect_to_pid(pid, REPLY_TIMEOUT)?,
            (None, None) => bail!("give --pid or --socket"),
        };
        Ok(client)
    }

    /// Sends one request on `client`. A server that closes the connection before acting
    /// on it (a `closing` notice: the connection was evicted to let another in) gets it
    /// once more on a new connection; that is safe for any request, writes included.
    pub fn call_on(&self, mut client: Client, request: &Request) -> Result<Reply> {
        match client.call(request) {
            Err(ControlError::Remote { closing: true, .. }) => Ok(self.connect()?.call(request)?),
            other => Ok(other?),
        }
    }
}

/// Whether `error` means the server ended this connection without acting on the request
/// just sent (idle timeout, eviction, shutdown), so that it can be sent again on a new one.
fn connection_ended(error: &ControlError) -> bool {
    match error {
        ControlError::Closed { .. } => true,
        ControlError::Remote { closing, .. } => *closing,
        ControlError::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        _ => false,
    }
}

/// Whether process `pid` is gone or a zombie (exited, not yet reaped by its parent).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Err(_) => true,
        Ok(status) => status
            .lines()
            .filter_map(|l| l.strip_prefix("State:"))
            .any(|state| matches!(state.trim_start().chars().next(), Some('Z' | 'X'))),
    }
}

/// A long-lived conversation with one process's control server, for requests that may
/// be repeated (reads). The server closes connections that go without a request for its
/// idle timeout (60 s) and may evict one when all its slots are taken; the session then
/// connects again — to the same process, checked as at first — and repeats the request.
#[derive(Debug)]
pub struct Session {
    target: TargetArgs,
    client: Client,
    pid: u32,
}

impl Session {
    /// Connects to the target.
    pub fn open(target: TargetArgs) -> Result<Session> {
        let client = target.connect()?;
        let pid = u32::try_from(client.server().pid)
            .map_err(|_| anyhow!("the control server reported no process id"))?;
        Ok(Session {
            target,
            client,
            pid,
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `request` (which must be safe to repeat) and returns the reply; an error
    /// reply is an error.
    pub fn call(&mut self, request: &Request) -> Result<Reply> {
        match self.client.call(request) {
            Err(e) if connection_ended(&e) => {}
            other => return Ok(other?),
        }
        self.reconnect()?;
        Ok(self.client.call(request)?)
    }

    fn reconnect(&mut self) -> Result<()> {
        let pid = self.pid;
        let client = match self.target.connect() {
            Ok(client) => client,
            Err(_) if exited(pid) => bail!("process {pid} exited"),
            Err(e) => return Err(e.context(format!("lost the control server of process {pid}"))),
        };
        let now = client.server().pid;
        if i64::from(now) != i64::from(pid) {
            bail!(
                "the control server at {} is now process {now}, not {pid} (process {pid} exited?)",
                client.path().display()
            );
        }
        self.client = client;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq::control::ControlServer;
    use std::thread;

    fn target_of(server: &ControlServer) -> TargetArgs {
        TargetArgs {
            pid: None,
            socket: Some(server.path().to_owned()),
        }
    }

    /// `podq monitor --interval 65` against a server that closes idle connections after
    /// 60 s: here an interval of three idle timeouts.
    #[test]
    fn a_session_outlives_the_idle_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_millis(100);
        let server = ControlServer::builder()
            .path(dir.path().join("s.sock"))
            .idle_timeout(idle)
            .build()
            .unwrap();
        let mut session = Session::open(target_of(&server)).unwrap();
        assert_eq!(session.pid(), std::process::id());
        let stats = Request::Stats { queue: None };
        for _ in 0..3 {
            session.call(&stats).unwrap();
            thread::sleep(idle * 3);
        }
        session.call(&stats).unwrap();
    }

    #[test]
    fn a_stopped_server_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let server = ControlServer::builder()
            .path(dir.path().join("s.sock"))
            .build()
            .unwrap();
        let mut session = Session::open(target_of(&server)).unwrap();
        session.call(&Request::List).unwrap();
        drop(server);
        let err = format!("{:#}", session.call(&Request::List).unwrap_err());
        assert!(
            err.starts_with(&format!(
                "lost the control server of process {}: cannot connect to ",
                std::process::id()
            )),
            "{err}"
        );
        assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    }

    #[test]
    fn an_evicted_request_is_sent_again() {
        let dir = tempfile::tempdir().unwrap();
        let server = ControlServer::builder()
            .path(dir.path().join("s.sock"))
            .max_connections(1)
            .build()
            .unwrap();
        let target = target_of(&server);
        let first = target.connect().unwrap();
        // The only slot goes to a second connection; the first is evicted unanswered.
        let mut second = target.connect().unwrap();
        second.call(&Request::GetDefaultScope).unwrap();
        let reply = target.call_on(first, &Request::GetDefaultScope).unwrap();
        assert_eq!(reply.value.as_deref(), Some(podq::default_scope().name()));
    }

    #[test]
    fn a_missing_socket_is_named_once() {
        let target = TargetArgs {
            pid: None,
            socket: Some("/nonexistent/podq.sock".into()),
        };
        let err = format!("{:#}", target.connect().unwrap_err());
        assert_eq!(
            err,
            "cannot connect to /nonexistent/podq.sock: No such file or directory (os error 2)"
        );
    }
}
