//! Where the control socket lives and how it is made safe: the path rules, the private
//! directory, binding (a dead server's socket replaced, a live one kept), the socket
//! file's removal, and the peer credentials both ends check. The server and the client
//! apply the same directory rule ([`check_private_dir`]).

use std::fs::{self, DirBuilder, Permissions};
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ControlError;

/// The socket's mode: owner read/write only.
pub(crate) const SOCKET_MODE: u32 = 0o600;
/// The socket directory's mode: owner only.
const DIR_MODE: u32 = 0o700;

/// The credentials of the process at the other end of a Unix socket, from
/// `SO_PEERCRED` (taken by the kernel when the connection was made, or for a client,
/// when the server called `listen`; they cannot be forged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerCredentials {
    /// The peer's process id.
    pub pid: i32,
    /// The peer's effective uid.
    pub uid: u32,
    /// The peer's effective gid.
    pub gid: u32,
}

/// Reads the peer's credentials of a connected Unix stream (`SO_PEERCRED`).
pub(crate) fn peer_credentials(stream: &UnixStream) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is an open socket borrowed from `stream` for the whole call; `cred`
    // and `len` are live locals and `len` holds `cred`'s exact size, so the kernel
    // writes within bounds.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Connects to the Unix socket at `path`, giving up after `timeout` (`ErrorKind::TimedOut`).
/// `UnixStream::connect` blocks without end when the listener's backlog is full of
/// connections it never accepts; a non-blocking `connect` says `EAGAIN` instead, and is
/// tried again until the deadline.
pub(crate) fn connect_within(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "the path is too long for a Unix socket",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    // SAFETY: socket() has no memory preconditions; the result is checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just created and owned by nobody else; the stream owns
    // and closes it from here on.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: `addr` is a live, initialised sockaddr_un and the length is its size;
        // `fd` is open (owned by `stream`).
        let rc = unsafe {
            libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(libc::EAGAIN) => return Err(io::Error::from(ErrorKind::TimedOut)),
            _ => return Err(e),
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// How long `bind` waits for a listener already at the path before calling it live.
const LIVE_CHECK: Duration = Duration::from_secs(1);

/// The access rule: a peer may use the server if it runs as the server's uid or as root.
pub(crate) fn peer_allowed(server_uid: u32, peer_uid: u32) -> bool {
    peer_uid == server_uid || peer_uid == 0
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The socket directory for this process's environment and uid:
/// `$XDG_RUNTIME_DIR/podq` when that variable names an existing absolute directory,
/// else `/tmp/podq-<euid>`.
fn socket_dir() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .map_or_else(
            || PathBuf::from(format!("/tmp/podq-{}", euid())),
            |dir| dir.join("podq"),
        )
}

/// The default socket path of process `pid`, as this process would compute it for
/// itself: `<socket dir>/<pid>.sock` (see the module README).
pub fn socket_path_for_pid(pid: u32) -> PathBuf {
    socket_dir().join(format!("{pid}.sock"))
}

/// Where the socket of process `pid`, running as `uid`, may be, most likely first: this
/// process's own rule, then the owner's `/run/user/<uid>/podq` and `/tmp/podq-<uid>`
/// (for root, or a client whose environment differs from the server's).
pub(crate) fn socket_candidates(pid: u32, uid: u32) -> Vec<PathBuf> {
    let mut paths = vec![socket_path_for_pid(pid)];
    for dir in [format!("/run/user/{uid}/podq"), format!("/tmp/podq-{uid}")] {
        let path = Path::new(&dir).join(format!("{pid}.sock"));
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

/// Why `dir` is not a directory that only `uid` controls: it must be a real directory
/// (not a symlink), owned by `uid`, with no group or other permission bits. Under
/// `/tmp` another user could otherwise have made it first.
pub(crate) fn check_private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = fs::symlink_metadata(dir).map_err(|e| format!("cannot inspect it: {e}"))?;
    if !meta.is_dir() {
        return Err("is not a directory".into());
    }
    if meta.uid() != uid {
        return Err(format!("is owned by uid {}, not by uid {uid}", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "has mode {:o}; it must be closed to group and others (700)",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// Creates `dir` with mode 0700 if missing, and checks it with [`check_private_dir`]
/// for this process's uid.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<(), ControlError> {
    match DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(ControlError::io(
                format!("cannot create {}", dir.display()),
                source,
            ))
        }
    }
    check_private_dir(dir, euid()).map_err(|reason| ControlError::SocketPath {
        path: dir.to_owned(),
        reason,
    })
}

/// The socket file of a bound listener; removed when this is dropped, so a server that
/// fails after binding (its thread cannot start) leaves nothing behind.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
}

impl SocketFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Binds `path`, replacing a stale socket left by a dead process, and sets `mode`.
pub(crate) fn bind(path: &Path, mode: u32) -> Result<(UnixListener, SocketFile), ControlError> {
    let bad = |reason: &str| ControlError::SocketPath {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let io_err =
        |what: &str, source| ControlError::io(format!("{what} {}", path.display()), source);
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match connect_within(path, LIVE_CHECK) {
                Err(e) if e.kind() != ErrorKind::TimedOut => {}
                // Connected, or a listener that does not accept: someone lives there.
                _ => return Err(bad("another control server is listening there")),
            }
            fs::remove_file(path).map_err(|e| io_err("cannot remove stale socket", e))?;
        }
        Ok(_) => return Err(bad("exists and is not a socket")),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot inspect", e)),
    }
    let listener = UnixListener::bind(path).map_err(|e| io_err("cannot bind", e))?;
    let file = SocketFile {
        path: path.to_owned(),
    };
    fs::set_permissions(path, Permissions::from_mode(mode))
        .map_err(|e| io_err("cannot set the mode of", e))?;
    Ok((listener, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_rule() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(1000, 0));
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(1000, 1001));
        assert!(!peer_allowed(0, 65534));
        assert!(!peer_allowed(1000, 65534));
    }

    #[test]
    fn private_dir_rules() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("podq");
        ensure_private_dir(&fresh).unwrap();
        assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o777, DIR_MODE);
        ensure_private_dir(&fresh).unwrap();
        fs::set_permissions(&fresh, Permissions::from_mode(0o755)).unwrap();
        let err = ensure_private_dir(&fresh).unwrap_err().to_string();
        assert!(err.contains("mode 755"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let err = ensure_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        fs::set_permissions(&fresh, Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            check_private_dir(&fresh, euid() + 1),
            Err(format!(
                "is owned by uid {}, not by uid {}",
                euid(),
                euid() + 1
            ))
        );
    }

    #[test]
    fn default_path_rules() {
        let path = socket_path_for_pid(42);
        assert!(path.ends_with("42.sock"), "{}", path.display());
        let parent = path.parent().unwrap();
        match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            Some(xdg) if xdg.is_absolute() && xdg.is_dir() => assert_eq!(parent, xdg.join("podq")),
            _ => assert_eq!(parent, Path::new(&format!("/tmp/podq-{}", euid()))),
        }
        let candidates = socket_candidates(42, 1234);
        assert_eq!(candidates[0], socket_path_for_pid(42));
        assert!(candidates.contains(&PathBuf::from("/run/user/1234/podq/42.sock")));
        assert!(candidates.contains(&PathBuf::from("/tmp/podq-1234/42.sock")));
    }

    /// A listener that never accepts, with a full backlog: `connect` gives up in time.
    #[test]
    fn connect_gives_up_on_a_full_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // SAFETY: the listener's fd is open; listen() again only shrinks its backlog.
        let rc = unsafe { libc::listen(listener.as_raw_fd(), 0) };
        assert_eq!(rc, 0);
        let mut held = Vec::new();
        let full = loop {
            match connect_within(&path, Duration::ZERO) {
                Ok(stream) => held.push(stream),
                Err(e) => break e,
            }
            assert!(held.len() < 64, "the backlog never filled");
        };
        assert_eq!(full.kind(), ErrorKind::TimedOut);
        let begun = Instant::now();
        let err = connect_within(&path, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert!(begun.elapsed() >= Duration::from_millis(200));
        assert!(begun.elapsed() < Duration::from_secs(5));
        let err = bind(&path, SOCKET_MODE).unwrap_err().to_string();
        assert!(
            err.ends_with("another control server is listening there"),
            "{err}"
        );
        let err = connect_within(&dir.path().join("none.sock"), Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let long = dir.path().join("x".repeat(200));
        let err = connect_within(&long, Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn a_failed_server_leaves_no_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let (listener, file) = bind(&path, SOCKET_MODE).unwrap();
        assert!(path.exists());
        drop(listener);
        drop(file);
        assert!(!path.exists());
    }
}
