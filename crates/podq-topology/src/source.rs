//! Where sysfs files come from: a directory (the live `/` or an unpacked capture) or a
//! `.tar.gz` capture held in memory. The reader in `sysfs.rs` sees only [`Source`], so
//! both kinds share one code path; [`Recorder`] notes what was read so `capture` can
//! write exactly that back out.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::Error;

/// Read access to a sysfs tree. Paths are relative to the root, `/`-separated, and
/// start with `sys/`.
pub(crate) trait Source {
    /// Contents of a regular file; `None` when it does not exist.
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error>;

    /// The numbers `N` of the entries named `{prefix}N` in directory `rel` (files,
    /// directories and links alike, dangling links included), ascending; `None` when
    /// the directory does not exist.
    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error>;

    /// How to name `rel` in an error or warning.
    fn display(&self, rel: &str) -> PathBuf;
}

/// `name` is `{prefix}N` with `N` all digits.
fn number_after(name: &str, prefix: &str) -> Option<usize> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.root.join(rel);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error> {
        let path = self.root.join(rel);
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let mut numbers = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            if let Some(n) = entry
                .file_name()
                .to_str()
                .and_then(|s| number_after(s, prefix))
            {
                numbers.push(n);
            }
        }
        numbers.sort_unstable();
        Ok(Some(numbers))
    }

    fn display(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// Largest total of file contents accepted from an archive; far above any real
/// capture (the biggest shared fixture unpacks to a few MiB), it stops a hostile
/// archive from exhausting memory.
const MAX_ARCHIVE_BYTES: u64 = 256 << 20;

/// A sysfs tree held in memory: an unpacked `.tar.gz` capture with one top folder, or
/// files handed over directly (tests, fuzzing).
pub(crate) struct MemSource {
    /// What errors call the tree: the archive path and its top folder.
    label: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
    /// Every entry (file, directory, link) and every directory implied by a deeper
    /// entry, relative to the top folder.
    entries: BTreeSet<String>,
}

impl MemSource {
    /// Reads a `.tar.gz` capture from a file.
    pub(crate) fn open(archive: &Path) -> Result<Self, Error> {
        let file = fs::File::open(archive).map_err(|source| Error::Io {
            path: archive.to_path_buf(),
            source,
        })?;
        Self::from_archive(archive, file)
    }

    /// Reads a `.tar.gz` capture from `reader`; `name` is what errors call it.
    pub(crate) fn from_archive(name: &Path, reader: impl Read) -> Result<Self, Error> {
        let bad = |reason: String| Error::Malformed {
            path: name.to_path_buf(),
            reason,
        };
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(reader));
        let mut top: Option<String> = None;
        let mut source = Self::empty(PathBuf::new());
        let mut total = 0u64;
        for entry in tar
            .entries()
            .map_err(|e| bad(format!("not a .tar.gz archive: {e}")))?
        {
            let mut entry = entry.map_err(|e| bad(format!("corrupt archive: {e}")))?;
            let raw = entry
                .path()
                .map_err(|e| bad(format!("bad entry name: {e}")))?
                .to_string_lossy()
                .into_owned();
            let parts: Vec<&str> = raw
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .collect();
            if parts.contains(&"..") {
                return Err(bad(format!("entry `{raw}` leaves the archive")));
            }
            let Some((first, rest)) = parts.split_first() else {
                continue;
            };
            match &top {
                None => top = Some((*first).to_owned()),
                Some(t) if t == first => {}
                Some(t) => {
                    return Err(bad(format!(
                        "expected one top folder, found `{t}` and `{first}`"
                    )))
                }
            }
            if rest.is_empty() {
                continue;
            }
            let rel = rest.join("/");
            if entry.header().entry_type().is_file() {
                total += entry.size();
                if total > MAX_ARCHIVE_BYTES {
                    return Err(bad(format!(
                        "unpacks to more than {} MiB; not a sysfs capture",
                        MAX_ARCHIVE_BYTES >> 20
                    )));
                }
                let mut bytes = Vec::new();
                entry
                    .read_to_end(&mut bytes)
                    .map_err(|e| bad(format!("cannot read `{raw}`: {e}")))?;
                source.add_file(&rel, bytes);
            } else {
                source.add_entry(&rel);
            }
        }
        let top = top.ok_or_else(|| bad("empty archive".to_owned()))?;
        source.label = PathBuf::from(format!("{}:{top}", name.display()));
        Ok(source)
    }

    /// A tree of the given files, paths relative to the root (`sys/devices/...`).
    pub(crate) fn from_files(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        let mut source = Self::empty(PathBuf::from("<memory>"));
        for (rel, bytes) in files {
            let rel: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
            source.add_file(&rel.join("/"), bytes);
        }
        source
    }

    fn empty(label: PathBuf) -> Self {
        Self {
            label,
            files: BTreeMap::new(),
            entries: BTreeSet::new(),
        }
    }

    fn add_entry(&mut self, rel: &str) {
        let mut prefix = String::new();
        for part in rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.entries.insert(prefix.clone());
        }
    }

    fn add_file(&mut self, rel: &str, bytes: Vec<u8>) {
        self.add_entry(rel);
        self.files.insert(rel.to_owned(), bytes);
    }
}

impl Source for MemSource {
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.files.get(rel).cloned())
    }

    fn numbered(&self, rel: &str, prefix: &str) -> Result<Option<Vec<usize>>, Error> {
        if !self.entries.contains(rel) {
            return Ok(None);
        }
        let dir = format!("{rel}/");
        let mut numbers: Vec<usize> = self
            .entries
            .range(dir.clone()..)
            .take_while(|e| e.starts_with(&dir))
            .filter_map(|e| {
                let name = &e[dir.len()..];
                (!name.contains('/')).then(|| number_after(name, prefix))?
            })
            .collect();
        numbers.sort_unstable();
        Ok(Some(numbers))
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
