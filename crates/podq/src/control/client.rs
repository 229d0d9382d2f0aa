//! A blocking client for the control protocol.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{Reply, Request};
use super::server::{peer_credentials, PeerCredentials};
use crate::Error;

/// The longest reply read (stats of many queues and pools fit easily).
const MAX_REPLY_BYTES: u64 = 64 << 20;

/// A connection to a control server.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to the server at `path`; replies are awaited for at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Client, Error> {
        let io_err = |what: &str, source| Error::ControlIo {
            what: format!("{what} {}", path.display()),
            source,
        };
        let writer = UnixStream::connect(path).map_err(|e| io_err("cannot connect to", e))?;
        writer
            .set_read_timeout(Some(timeout))
            .and_then(|()| writer.set_write_timeout(Some(timeout)))
            .map_err(|e| io_err("cannot set timeouts on", e))?;
        let reader = writer
            .try_clone()
            .map_err(|e| io_err("cannot use the connection to", e))?;
        Ok(Client {
            path: path.to_owned(),
            reader: BufReader::new(reader),
            writer,
        })
    }

    /// The server process's credentials (its pid, to read its threads' stats).
    pub fn server_credentials(&self) -> Result<PeerCredentials, Error> {
        peer_credentials(&self.writer).map_err(|source| Error::ControlIo {
            what: format!("cannot read the credentials of {}", self.path.display()),
            source,
        })
    }

    /// Sends one request and returns the reply as sent, error replies included.
    pub fn request(&mut self, request: &Request) -> Result<Reply, Error> {
        let io_err = |what: &str, path: &Path, source| Error::ControlIo {
            what: format!("{what} {}", path.display()),
            source,
        };
        let sent = self.writer.write_all(request.to_line().as_bytes());
        let mut line = String::new();
        let read = (&mut self.reader)
            .take(MAX_REPLY_BYTES)
            .read_line(&mut line);
        // A server that refuses a connection (peer check, connection cap) replies and
        // closes at once, so the send may fail; its reply is still there to read.
        let n = match (sent, read) {
            (_, Ok(n)) if n > 0 => n,
            (Err(e), _) => return Err(io_err("cannot send a request to", &self.path, e)),
            (Ok(()), read) => read.map_err(|e| io_err("no reply from", &self.path, e))?,
        };
        if n == 0 {
            return Err(Error::BadReply(format!(
                "{} closed the connection without replying",
                self.path.display()
            )));
        }
        Reply::from_line(line.trim_end_matches('\n'))
    }

    /// Sends one request; an error reply becomes [`Error::Remote`] with the
    /// server's message.
    pub fn call(&mut self, request: &Request) -> Result<Reply, Error> {
        let reply = self.request(request)?;
        match reply.error_text() {
            Some(message) => Err(Error::Remote(message.to_owned())),
            None => Ok(reply),
        }
    }
}
