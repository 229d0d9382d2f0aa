//! `CpuSet`: a growable set of CPU numbers, with the kernel's two text forms.
//!
//! Written by hand rather than taken from a bitset crate because the text formats are
//! the product: sysfs cpulists (`0-3,8-11`) and comma-grouped hex masks
//! (`00000000,0000ffff`, lowest group last) must round-trip exactly, tolerate the
//! quirks of real captures (trailing newlines, NUL bytes) and reject garbage with an
//! error that names the text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::quote;
use crate::Error;

const BITS: usize = 64;

/// A set of CPU numbers of any size (machines with more than 1024 CPUs exist).
///
/// Equality, ordering and hashing ignore capacity: two sets with the same members are
/// equal however they were built.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(into = "Vec<usize>", from = "Vec<usize>")]
pub struct CpuSet {
    /// Bit `i % 64` of word `i / 64` is CPU `i`. No trailing zero words.
    words: Vec<u64>,
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        Self { words: Vec::new() }
    }

    /// The set `{0, 1, ..., n-1}`.
    pub fn first_n(n: usize) -> Self {
        (0..n).collect()
    }

    /// The set holding only `cpu`.
    pub fn single(cpu: usize) -> Self {
        let mut set = Self::new();
        set.insert(cpu);
        set
    }

    /// Adds `cpu`; returns whether it was absent.
    pub fn insert(&mut self, cpu: usize) -> bool {
        let (w, b) = (cpu / BITS, cpu % BITS);
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !was
    }

    /// Adds `lo..=hi` a word at a time, so a range costs its length / 64, not its length.
    fn insert_range(&mut self, lo: usize, hi: usize) {
        let (first, last) = (lo / BITS, hi / BITS);
        if last >= self.words.len() {
            self.words.resize(last + 1, 0);
        }
        let low_mask = !0u64 << (lo % BITS);
        let high_mask = !0u64 >> (BITS - 1 - hi % BITS);
        if first == last {
            self.words[first] |= low_mask & high_mask;
            return;
        }
        self.words[first] |= low_mask;
        self.words[first + 1..last].fill(!0);
        self.words[last] |= high_mask;
    }

    /// Removes `cpu`; returns whether it was present.
    pub fn remove(&mut self, cpu: usize) -> bool {
        let (w, b) = (cpu / BITS, cpu % BITS);
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let was = *word & (1 << b) != 0;
        *word &= !(1 << b);
        self.trim();
        was
    }

    /// Whether `cpu` is a member.
    pub fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / BITS)
            .is_some_and(|w| w & (1 << (cpu % BITS)) != 0)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set has no member.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The lowest member.
    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    /// The highest member.
    pub fn last(&self) -> Option<usize> {
        let w = self.words.len().checked_sub(1)?;
        Some(w * BITS + (BITS - 1 - self.words[w].leading_zeros() as usize))
    }

    /// The `n`-th lowest member (0-based).
    pub fn nth(&self, n: usize) -> Option<usize> {
        self.iter().nth(n)
    }

    /// Members in ascending order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            words: &self.words,
            index: 0,
            current: self.words.first().copied().unwrap_or(0),
        }
    }

    /// Members of both sets.
    pub fn intersection(&self, other: &Self) -> Self {
        let mut words: Vec<u64> = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        trim_words(&mut words);
        Self { words }
    }

    /// Members of either set.
    pub fn union(&self, other: &Self) -> Self {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, s) in words.iter_mut().zip(&short.words) {
            *w |= s;
        }
        Self { words }
    }

    /// Members of `self` that are not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        let mut words = self.words.clone();
        for (w, o) in words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        trim_words(&mut words);
        Self { words }
    }

    /// Whether every member of `self` is in `other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether the sets share a member.
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    /// Parses a sysfs cpulist such as `0-3,8-11`. Empty text, a trailing newline and
    /// trailing NUL bytes are tolerated; stride syntax (`0-15:4`) is rejected because
    /// sysfs never prints it. CPUs from [`MAX_CPUS`] on and texts longer than
    /// [`MAX_TEXT_BYTES`] are refused.
    pub fn parse_list(text: &str) -> Result<Self, Error> {
        let err = |reason: &str| Error::CpuList {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text.len() > MAX_TEXT_BYTES {
            return Err(err(&too_long(text)));
        }
        let body = trim_sysfs(text);
        let mut set = Self::new();
        if body.is_empty() {
            return Ok(set);
        }
        for part in body.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let bad = || err(&format!("bad CPU number in {}", quote(part)));
            let lo: usize = parse_cpu(lo).ok_or_else(bad)?;
            let hi: usize = parse_cpu(hi).ok_or_else(bad)?;
            if lo > hi {
                return Err(err(&format!("range {} runs backwards", quote(part))));
            }
            if hi >= MAX_CPUS {
                return Err(err(&format!("CPU {hi} is beyond the {MAX_CPUS}-CPU limit")));
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// Parses a comma-grouped hex mask of any width, most significant group first, as
    /// sysfs prints `cpumap`/`shared_cpu_map` (`00000000,0000ffff`). A `0x` prefix, a
    /// trailing newline and trailing NUL bytes are tolerated; masks wider than
    /// [`MAX_CPUS`] and texts longer than [`MAX_TEXT_BYTES`] are refused.
    pub fn parse_mask(text: &str) -> Result<Self, Error> {
        let err = |reason: &str| Error::CpuMask {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text.len() > MAX_TEXT_BYTES {
            return Err(err(&too_long(text)));
        }
        let body = trim_sysfs(text);
        let body = body.strip_prefix("0x").unwrap_or(body);
        if body.is_empty() {
            return Err(err("empty mask"));
        }
        let digits: Vec<u8> = body.bytes().filter(|&b| b != b',').collect();
        if body.split(',').any(str::is_empty) {
            return Err(err("empty group between commas"));
        }
        if digits.len() > MAX_CPUS / 4 {
            return Err(err(&format!("wider than {MAX_CPUS} CPUs")));
        }
        let mut set = Self::new();
        for (nibble_index, &c) in digits.iter().rev().enumerate() {
            let value = (c as char).to_digit(16).ok_or_else(|| {
                err(&format!(
                    "{} is not a hex digit",
                    quote(&char::from(c).to_string())
                ))
            })?;
            for bit in 0..4 {
                if value & (1 << bit) != 0 {
                    set.insert(nibble_index * 4 + bit);
                }
            }
        }
        Ok(set)
    }

    /// The cpulist form, e.g. `0-3,8-11`; empty for the empty set.
    pub fn to_list(&self) -> String {
        self.to_string()
    }

    /// The hex mask form in 32-bit groups, most significant first, e.g. `0000ffff`
    /// or `00000001,00000000`. The empty set prints as `0`.
    pub fn to_mask(&self) -> String {
        let Some(last) = self.last() else {
            return "0".to_owned();
        };
        let groups = last / 32 + 1;
        (0..groups)
            .rev()
            .map(|g| {
                let word = self.words[g * 32 / BITS];
                let group = (word >> (g * 32 % BITS)) as u32;
                format!("{group:08x}")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn trim(&mut self) {
        trim_words(&mut self.words);
    }
}

/// The largest CPU number plus one that text input may name. Far above any real
/// machine; it bounds the memory a hostile input can make the parser allocate.
pub const MAX_CPUS: usize = 1 << 16;

/// The longest cpulist or mask text accepted, and the largest sysfs file read. The
/// longest list of CPUs below [`MAX_CPUS`] (every other CPU) is 187 KiB; real sysfs
/// files are a few KiB. Together with [`MAX_CPUS`] it bounds a parse's work: at most
/// 32 Ki ranges of at most 1 Ki words each.
pub const MAX_TEXT_BYTES: usize = 256 << 10;

fn too_long(text: &str) -> String {
    format!(
        "{} bytes, more than the {} KiB limit",
        text.len(),
        MAX_TEXT_BYTES >> 10
    )
}

fn parse_cpu(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Strips what sysfs and captures leave around a value: whitespace, newlines, NULs.
pub(crate) fn trim_sysfs(text: &str) -> &str {
    text.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace())
}

fn trim_words(words: &mut Vec<u64>) {
    while words.last() == Some(&0) {
        words.pop();
    }
}

/// Ascending iterator over a [`CpuSet`].
pub struct Iter<'a> {
    words: &'a [u64],
    index: usize,
    current: u64,
}

impl Iterator for Iter<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        loop {
            if self.current != 0 {
                let bit = self.current.trailing_zeros() as usize;
                self.current &= self.current - 1;
                return Some(self.index * BITS + bit);
            }
            self.index += 1;
            self.current = *self.words.get(self.index)?;
        }
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = usize;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut set = Self::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
    }
}

impl From<Vec<usize>> for CpuSet {
    fn from(cpus: Vec<usize>) -> Self {
        cpus.into_iter().collect()
    }
}

impl From<CpuSet> for Vec<usize> {
    fn from(set: CpuSet) -> Self {
        set.iter().collect()
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &Self) -> bool {
        self.words == other.words
    }
}

impl Eq for CpuSet {}

impl std::hash::Hash for CpuSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

impl PartialOrd for CpuSet {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CpuSet {
    /// Orders by members in ascending order, lexicographically (so sets sort by their
    /// first CPU, as pods are listed).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
        while let Some(lo) = iter.next() {
            let mut hi = lo;
            while iter.peek() == Some(&(hi + 1)) {
                hi = iter.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl FromStr for CpuSet {
    type Err = Error;
    /// Parses the cpulist form.
    fn from_str(text: &str) -> Result<Self, Error> {
        Self::parse_list(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trips() {
        for text in ["", "0", "0-3", "0-3,8-11", "1,3,5", "0-1023,2048", "63-65"] {
            let set = CpuSet::parse_list(text).unwrap();
            assert_eq!(set.to_list(), text);
        }
    }

    #[test]
    fn list_tolerates_sysfs_quirks() {
        assert_eq!(CpuSet::parse_list("0-3\n\0").unwrap(), CpuSet::first_n(4));
        assert_eq!(CpuSet::parse_list("\n").unwrap(), CpuSet::new());
    }

    #[test]
    fn list_rejects_garbage_naming_the_text() {
        for text in [
            "a",
            "1-",
            "-1",
            "3-1",
            "1,,2",
            "1 2",
            "0x3",
            "99999999999999999999",
        ] {
            let err = CpuSet::parse_list(text).unwrap_err().to_string();
            assert!(err.contains(&format!("`{text}`")), "{err}");
        }
    }

    #[test]
    fn mask_parses_any_width() {
        assert_eq!(
            CpuSet::parse_mask("0000ffff\n").unwrap(),
            CpuSet::first_n(16)
        );
        let set = CpuSet::parse_mask("00000001,00000000,00000003").unwrap();
        assert_eq!(set.to_list(), "0-1,64");
        assert_eq!(set.to_mask(), "00000001,00000000,00000003");
        assert_eq!(
            CpuSet::parse_mask("00000000,00000000").unwrap(),
            CpuSet::new()
        );
        assert_eq!(CpuSet::parse_mask("0xf").unwrap(), CpuSet::first_n(4));
        assert_eq!(CpuSet::parse_mask("fff").unwrap(), CpuSet::first_n(12));
    }

    #[test]
    fn mask_rejects_garbage() {
        for text in ["", "xyz", "ff,,ff", "0000,g000"] {
            assert!(CpuSet::parse_mask(text).is_err(), "{text}");
        }
    }

    #[test]
    fn set_algebra() {
        let a: CpuSet = [0, 1, 2, 100].into_iter().collect();
        let b: CpuSet = [2, 3, 100].into_iter().collect();
        assert_eq!(a.intersection(&b).to_list(), "2,100");
        assert_eq!(a.union(&b).to_list(), "0-3,100");
        assert_eq!(a.difference(&b).to_list(), "0-1");
        assert!(CpuSet::single(100).is_subset(&a));
        assert_eq!(a.last(), Some(100));
        let mut c = b.clone();
        c.remove(100);
        assert_eq!(c, CpuSet::parse_list("2-3").unwrap());
        assert_eq!(a.difference(&a), CpuSet::new());
        assert!(a.difference(&a).is_empty());
    }
}
