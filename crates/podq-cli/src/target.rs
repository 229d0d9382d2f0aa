//! `--pid N | --socket PATH`: which process's control server to talk to.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use podq::control::{socket_candidates_for_pid, Client};

/// How long to wait for a reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The process whose control server to use.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// The process id; its socket is found by the default path rules.
    #[arg(long, value_name = "N")]
    pub pid: Option<u32>,
    /// The control socket's path.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl TargetArgs {
    /// The socket path: as given, or the first existing candidate for `--pid`.
    pub fn socket_path(&self) -> Result<PathBuf> {
        if let Some(path) = &self.socket {
            return Ok(path.clone());
        }
        let Some(pid) = self.pid else {
            bail!("give --pid or --socket");
        };
        let candidates = socket_candidates_for_pid(pid);
        if let Some(found) = candidates.iter().find(|p| p.exists()) {
            return Ok(found.clone());
        }
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid}");
        }
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "process {pid} has no control socket (looked at {}); does it start the control server?",
            looked.join(", ")
        )
    }

    /// Connects to the server.
    pub fn connect(&self) -> Result<Client> {
        let path = self.socket_path()?;
        Client::connect(&path, REPLY_TIMEOUT)
            .with_context(|| format!("cannot reach the control server at {}", path.display()))
    }
}
