//! Where sysfs files come from: a directory (the live `/` or an unpacked capture) or a
//! `.tar.gz` capture held in memory. The reader in `sysfs.rs` sees only [`Source`], so
//! both kinds share one code path; [`Recorder`] notes what was read so `capture` can
//! write exactly that back out.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::error::quote;
use crate::{Error, MAX_CPUS, MAX_TEXT_BYTES};

/// Read access to a sysfs tree. Paths are relative to the root, `/`-separated, and
/// start with `sys/`.
pub(crate) trait Source {
    /// Contents of a regular file; `None` when it does not exist. A symbolic link, a
    /// directory, a FIFO or device, or a file larger than [`MAX_TEXT_BYTES`] is an
    /// error naming it: sysfs attributes are small regular files.
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error>;

    /// The numbers `N` of the entries named `{prefix}N` in directory `rel` (files,
    /// directories and links alike, dangling links included), ascending; `None` when
    /// the directory does not exist. An `N` from [`MAX_CPUS`] on is an error naming the
    /// entry: CPU, node and cache numbers all stay below it.
    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error>;

    /// How to name `rel` in an error or warning.
    fn display(&self, rel: &str) -> PathBuf;
}

/// `name` is `{prefix}N` with `N` all digits: `Ok(Some(N))`, or an error for an `N`
/// from [`MAX_CPUS`] on (a CPU number that large would size every set built from it).
fn number_after(name: &str, prefix: &str) -> Result<Option<usize>, String> {
    let Some(digits) = name.strip_prefix(prefix) else {
        return Ok(None);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    match digits.parse::<usize>() {
        Ok(n) if n < MAX_CPUS => Ok(Some(n)),
        _ => Err(format!(
            "number {} is beyond the {MAX_CPUS}-CPU limit",
            quote(digits)
        )),
    }
}

/// Sorted numbers of `names` that are `{prefix}N`; `at` names an entry for an error.
fn numbers_of<'n>(
    names: impl IntoIterator<Item = &'n str>,
    prefix: &str,
    at: impl Fn(&str) -> PathBuf,
) -> Result<Vec<usize>, Error> {
    let mut numbers = Vec::new();
    for name in names {
        match number_after(name, prefix) {
            Ok(Some(n)) => numbers.push(n),
            Ok(None) => {}
            Err(reason) => {
                return Err(Error::Malformed {
                    path: at(name),
                    reason,
                })
            }
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// A file over [`MAX_TEXT_BYTES`]; `size` when known.
fn too_large(path: PathBuf, size: Option<u64>) -> Error {
    let size = size.map_or_else(String::new, |n| format!("{n} bytes, "));
    Error::Malformed {
        path,
        reason: format!(
            "{size}over the {} KiB limit for a sysfs file",
            MAX_TEXT_BYTES >> 10
        ),
    }
}

fn not_regular(path: PathBuf, what: &str) -> Error {
    Error::Malformed {
        path,
        reason: format!("{what}, not a regular file; sysfs attributes are regular files"),
    }
}

/// What a non-regular file is, for an error.
fn kind_of(file_type: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// Opens `path` for reading without blocking on a FIFO; `follow` says whether a
/// symbolic link as the last component is followed.
fn open_nonblocking(path: &Path, follow: bool) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | nofollow)
        .open(path)
}

/// A directory tree on disk.
pub(crate) struct DirSource {
    root: PathBuf,
}

impl DirSource {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// Whether `rel` is a symbolic link, and where it points.
    fn link_target(&self, rel: &str) -> Option<PathBuf> {
        fs::read_link(self.root.join(rel)).ok()
    }
}

impl Source for DirSource {
    /// The last component is opened without following a link and without blocking, and
    /// checked to be a regular file before anything is read; at most
    /// [`MAX_TEXT_BYTES`] + 1 bytes are read. Links above it (`cpu0 -> ../cpu1`) are
    /// followed.
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.root.join(rel);
        let io_err = |path: PathBuf, source| Error::Io { path, source };
        let file = match open_nonblocking(&path, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(match fs::symlink_metadata(&path) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        not_regular(path, "a symbolic link")
                    }
                    _ => io_err(path, e),
                })
            }
            Err(source) => return Err(io_err(path, source)),
        };
        let meta = file.metadata().map_err(|e| io_err(path.clone(), e))?;
        if !meta.file_type().is_file() {
            return Err(not_regular(path, kind_of(meta.file_type())));
        }
        let mut bytes = Vec::new();
        (&file)
            .take(MAX_TEXT_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(path.clone(), e))?;
        if bytes.len() > MAX_TEXT_BYTES {
            // sysfs reports 4096 for every attribute; a plain file its true size.
            let size = (meta.len() > MAX_TEXT_BYTES as u64).then_some(meta.len());
            return Err(too_large(path, size));
        }
        Ok(Some(bytes))
    }

    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error> {
        let path = self.root.join(rel);
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        numbers_of(names.iter().map(String::as_str), prefix, |name| {
            path.join(name)
        })
        .map(Some)
    }

    fn display(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// Most bytes taken from an archive's decompressor (headers, names, contents, read or
/// skipped): about a second of decompression, and room for a capture of 20 000 CPUs.
/// It bounds the time a hostile archive (a gzip bomb, a huge skipped entry) can take.
const MAX_ARCHIVE_STREAM: u64 = 512 << 20;

/// Most memory an archive's tree may take: file contents, plus each tree node's name
/// and [`NODE_BYTES`]. Far above any real capture (the biggest shared fixture keeps
/// well under 2 MiB), it bounds what a hostile archive can make podq hold.
const MAX_ARCHIVE_BYTES: u64 = 256 << 20;

/// What one tree node is charged besides its name: about what it costs.
const NODE_BYTES: u64 = 128;

/// Longest entry name accepted from an archive, as Linux's `PATH_MAX`.
const MAX_PATH_BYTES: usize = 4096;

/// Only entries below this folder are kept: the reader looks nowhere else.
const KEPT_DIR: &str = "sys/devices/system";

/// Entries with more components (below the top folder) are not kept: the deepest file
/// the reader opens, `sys/devices/system/cpu/cpuN/cache/indexM/level`, has 8.
const MAX_KEPT_DEPTH: usize = 8;

/// One node of an in-memory tree.
#[derive(Default)]
struct Node {
    kind: Kind,
    children: BTreeMap<String, Node>,
}

/// What an archive entry was. A node may be both a file and a parent (an archive can
/// hold `a` and `a/b`); only [`Source::read`] looks at the kind.
#[derive(Default)]
enum Kind {
    /// A directory, listed or implied by a deeper entry.
    #[default]
    Dir,
    File(Vec<u8>),
    /// A regular file over [`MAX_TEXT_BYTES`], kept as its size: an error if read.
    TooLarge(u64),
    Link,
    /// A FIFO, device or hard link.
    Special,
}

impl Node {
    fn get(&self, rel: &str) -> Option<&Node> {
        rel.split('/')
            .try_fold(self, |node, part| node.children.get(part))
    }

    /// The node at `parts`, made (as directories) where missing, and the bytes the
    /// new nodes cost (names and [`NODE_BYTES`] each).
    fn make<'p>(&mut self, parts: impl IntoIterator<Item = &'p str>) -> (&mut Node, u64) {
        let mut cost = 0;
        let node = parts.into_iter().fold(self, |node, part| {
            node.children.entry(part.to_owned()).or_insert_with(|| {
                cost += NODE_BYTES + part.len() as u64;
                Node::default()
            })
        });
        (node, cost)
    }
}

/// Reads through `inner`, counting into `used` and failing once it passes
/// [`MAX_ARCHIVE_STREAM`].
struct Budgeted<'a, R> {
    inner: R,
    used: &'a Cell<u64>,
}

impl<R: Read> Read for Budgeted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.used.get() > MAX_ARCHIVE_STREAM {
            return Err(io::Error::other("over the archive's size limit"));
        }
        let n = self.inner.read(buf)?;
        self.used.set(self.used.get() + n as u64);
        Ok(n)
    }
}

/// A sysfs tree held in memory: an unpacked `.tar.gz` capture with one top folder, or
/// files handed over directly (tests, fuzzing).
pub(crate) struct MemSource {
    /// What errors call the tree: the archive path and its top folder.
    label: PathBuf,
    /// The tree below the top folder.
    root: Node,
}

impl MemSource {
    /// Reads a `.tar.gz` capture from a file, which must be a regular file (opening a
    /// FIFO does not block).
    pub(crate) fn open(archive: &Path) -> Result<Self, Error> {
        let io_err = |source| Error::Io {
            path: archive.to_path_buf(),
            source,
        };
        let file = open_nonblocking(archive, true).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if !meta.file_type().is_file() {
            return Err(Error::Malformed {
                path: archive.to_path_buf(),
                reason: format!(
                    "{}, neither a directory nor a .tar.gz capture",
                    kind_of(meta.file_type())
                ),
            });
        }
        Self::from_archive(archive, file)
    }

    /// Reads a `.tar.gz` capture from `reader`; `name` is what errors call it. Only
    /// entries below `sys/devices/system`, at most as deep as the reader looks, are
    /// kept; every entry counts toward the limits and must be in the one top folder.
    pub(crate) fn from_archive(name: &Path, reader: impl Read) -> Result<Self, Error> {
        let streamed = Cell::new(0u64);
        let bad = |reason: String| Error::Malformed {
            path: name.to_path_buf(),
            reason,
        };
        let too_big = |what: &str, limit: u64| {
            bad(format!(
                "{what} more than {} MiB; not a sysfs capture",
                limit >> 20
            ))
        };
        // An error once the stream limit is passed is the limit's.
        let failed = |what: &str, e: io::Error| {
            if streamed.get() > MAX_ARCHIVE_STREAM {
                too_big("unpacks to", MAX_ARCHIVE_STREAM)
            } else {
                bad(format!("{what}: {e}"))
            }
        };
        let mut tar = tar::Archive::new(Budgeted {
            inner: flate2::read::GzDecoder::new(reader),
            used: &streamed,
        });
        let mut top: Option<String> = None;
        let mut root = Node::default();
        let mut kept = 0u64;
        for entry in tar
            .entries()
            .map_err(|e| failed("not a .tar.gz archive", e))?
        {
            let mut entry = entry.map_err(|e| failed("corrupt archive", e))?;
            let raw_bytes = entry.path_bytes();
            if raw_bytes.len() > MAX_PATH_BYTES {
                return Err(bad(format!(
                    "entry name {} is over the {MAX_PATH_BYTES}-byte limit",
                    quote(&String::from_utf8_lossy(&raw_bytes)),
                )));
            }
            let raw = entry
                .path()
                .map_err(|e| failed("bad entry name", e))?
                .to_string_lossy()
                .into_owned();
            let parts: Vec<&str> = raw
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .collect();
            if parts.contains(&"..") {
                return Err(bad(format!("entry {} leaves the archive", quote(&raw))));
            }
            let Some((first, rest)) = parts.split_first() else {
                continue;
            };
            match &top {
                None => top = Some((*first).to_owned()),
                Some(t) if t == first => {}
                Some(t) => {
                    return Err(bad(format!(
                        "expected one top folder, found {} and {}",
                        quote(t),
                        quote(first)
                    )))
                }
            }
            let below_kept = rest.len() >= 3 && rest[..3].join("/") == KEPT_DIR;
            if !below_kept || rest.len() > MAX_KEPT_DEPTH {
                continue;
            }
            let kind = entry.header().entry_type();
            let (node, cost) = root.make(rest.iter().copied());
            kept += cost;
            if kind.is_file() {
                let size = entry.size();
                node.kind = if size > MAX_TEXT_BYTES as u64 {
                    Kind::TooLarge(size)
                } else {
                    kept += size;
                    let mut bytes = Vec::new();
                    entry
                        .read_to_end(&mut bytes)
                        .map_err(|e| failed(&format!("cannot read {}", quote(&raw)), e))?;
                    Kind::File(bytes)
                };
            } else if kind.is_symlink() {
                node.kind = Kind::Link;
            } else if !kind.is_dir() {
                node.kind = Kind::Special;
            }
            if kept > MAX_ARCHIVE_BYTES {
                return Err(too_big(
                    &format!("keeps (contents, names, {NODE_BYTES} bytes an entry)"),
                    MAX_ARCHIVE_BYTES,
                ));
            }
        }
        let top = top.ok_or_else(|| bad("empty archive".to_owned()))?;
        Ok(Self {
            label: PathBuf::from(format!("{}:{top}", name.display())),
            root,
        })
    }

    /// A tree of the given files, paths relative to the root (`sys/devices/...`).
    pub(crate) fn from_files(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        let mut root = Node::default();
        for (rel, bytes) in files {
            let (node, _) = root.make(rel.split('/').filter(|p| !p.is_empty()));
            node.kind = if bytes.len() > MAX_TEXT_BYTES {
                Kind::TooLarge(bytes.len() as u64)
            } else {
                Kind::File(bytes)
            };
        }
        Self {
            label: PathBuf::from("<memory>"),
            root,
        }
    }
}

impl Source for MemSource {
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        let Some(node) = self.root.get(rel) else {
            return Ok(None);
        };
        match &node.kind {
            Kind::File(bytes) => Ok(Some(bytes.clone())),
            Kind::TooLarge(size) => Err(too_large(self.display(rel), Some(*size))),
            Kind::Dir => Err(not_regular(self.display(rel), "a directory")),
            Kind::Link => Err(not_regular(self.display(rel), "a symbolic link")),
            Kind::Special => Err(not_regular(self.display(rel), "a special file")),
        }
    }

    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error> {
        let Some(node) = self.root.get(rel) else {
            return Ok(None);
        };
        numbers_of(node.children.keys().map(String::as_str), prefix, |name| {
            self.display(&format!("{rel}/{name}"))
        })
        .map(Some)
    }

    fn display(&self, rel: &str) -> PathBuf {
        PathBuf::from(format!("{}/{rel}", self.label.display()))
    }
}

/// Wraps a [`DirSource`] and remembers every file read and every numbered entry
/// listed, so that exactly what the reader used can be written to a capture.
pub(crate) struct Recorder {
    inner: DirSource,
    files: RefCell<BTreeMap<String, Vec<u8>>>,
    /// Listed entries: path, and link target when the entry is a symbolic link.
    listed: RefCell<BTreeMap<String, Option<PathBuf>>>,
}

impl Recorder {
    pub(crate) fn new(inner: DirSource) -> Self {
        Self {
            inner,
            files: RefCell::default(),
            listed: RefCell::default(),
        }
    }

    /// Writes what was read as a `.tar.gz` with top folder `top`.
    pub(crate) fn write_archive(&self, out: &Path, top: &str) -> Result<usize, Error> {
        let io_err = |source| Error::Write {
            path: out.to_path_buf(),
            source,
        };
        let file = fs::File::create(out).map_err(io_err)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let files = self.files.borrow();
        let listed = self.listed.borrow();
        let mut dirs: BTreeSet<String> = BTreeSet::new();
        for rel in files.keys().chain(listed.keys()) {
            let parts: Vec<&str> = rel.split('/').collect();
            for depth in 1..parts.len() {
                dirs.insert(parts[..depth].join("/"));
            }
        }
        for (rel, target) in listed.iter() {
            if target.is_none() && !files.contains_key(rel) {
                dirs.insert(rel.clone());
            }
        }
        let header = |kind: tar::EntryType, mode: u32, size: u64| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(size);
            h.set_mtime(0);
            h
        };
        for dir in &dirs {
            let mut h = header(tar::EntryType::Directory, 0o755, 0);
            tar.append_data(&mut h, format!("{top}/{dir}/"), io::empty())
                .map_err(io_err)?;
        }
        for (rel, bytes) in files.iter() {
            let mut h = header(tar::EntryType::Regular, 0o444, bytes.len() as u64);
            tar.append_data(&mut h, format!("{top}/{rel}"), bytes.as_slice())
                .map_err(io_err)?;
        }
        for (rel, target) in listed.iter() {
            if let Some(target) = target {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                tar.append_link(&mut h, format!("{top}/{rel}"), target)
                    .map_err(io_err)?;
            }
        }
        let gz = tar.into_inner().map_err(io_err)?;
        gz.finish().map_err(io_err)?;
        Ok(files.len())
    }
}

impl Source for Recorder {
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        let bytes = self.inner.read(rel)?;
        if let Some(b) = &bytes {
            self.files.borrow_mut().insert(rel.to_owned(), b.clone());
        }
        Ok(bytes)
    }

    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error> {
        let numbers = self.inner.numbered(rel, prefix)?;
        let Some(found) = &numbers else {
            // An absent directory stays absent in the capture.
            return Ok(None);
        };
        let mut listed = self.listed.borrow_mut();
        listed.insert(rel.to_owned(), None);
        for n in found {
            let child = format!("{rel}/{prefix}{n}");
            let target = self.inner.link_target(&child);
            listed.insert(child, target);
        }
        Ok(numbers)
    }

    fn display(&self, rel: &str) -> PathBuf {
        self.inner.display(rel)
    }
}
