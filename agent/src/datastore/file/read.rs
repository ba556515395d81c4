//! Reading the file datastore's tree: list the input paths under the root without opening
//! anything but the directory ([`list_inputs`]), and read one file bounded by the size limit,
//! never blocking on a FIFO, re-read until two reads agree ([`read_settled_all`]).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the root's listing shows for one input path.
pub(super) enum Listed {
    /// A regular file (or a symlink to one).
    Regular,
    /// A symlink whose target does not exist.
    Dangling,
    /// A FIFO, socket, device or directory: never opened.
    NotRegular(&'static str),
}

/// Why a file could not be read.
pub(super) enum ReadError {
    /// Over the size limit (its length in bytes); not read.
    TooLarge(u64),
    Io(std::io::Error),
}

/// One file's path and what reading it gave.
pub(super) type FileRead = (PathBuf, Result<String, ReadError>);

/// Read every path of `paths` (at most `max` bytes each, never blocking on a FIFO swapped in
/// after the listing). A file whose content differs from its `seen` hash was probably just
/// written: every such file is read again after `settle`, all of them after one pause, until
/// two reads of each agree (at most 10 rounds), so a file caught mid-write is not used. One
/// pause a round for the whole tree, not one a file (5,000 new files would otherwise take
/// 5,000 pauses at start). Returns the reads in `paths`' order and the number of pauses.
///
/// `meanwhile` is called once, before the first pause, with each read that has to wait for
/// it (path, text and the text's [`hash`]): work on that text (the loader parses it) fills
/// the pause, which then only sleeps what is left of `settle`. The second read still comes at
/// least `settle` after the first; a caller keeps what `meanwhile` made only for a final text
/// equal to the one it saw (compare [`hash`]es).
pub(super) fn read_settled_all(
    paths: Vec<(PathBuf, Option<u64>)>,
    settle: Duration,
    max: u64,
    mut meanwhile: impl FnMut(&Path, &str, u64),
) -> (Vec<FileRead>, usize) {
    let mut out: Vec<FileRead> = Vec::with_capacity(paths.len());
    // Indexes into `out` of the reads that still have to agree with a second one, with the
    // hash of their first read.
    let mut unsettled: Vec<usize> = Vec::new();
    let mut first_hashes: Vec<u64> = Vec::new();
    for (path, seen) in paths {
        let text = read_bounded(&path, max);
        if let (false, Ok(t)) = (settle.is_zero(), &text) {
            let h = hash(t);
            if seen != Some(h) {
                unsettled.push(out.len());
                first_hashes.push(h);
            }
        }
        out.push((path, text));
    }
    let read_at = Instant::now();
    for (&i, &h) in unsettled.iter().zip(&first_hashes) {
        if let (path, Ok(text)) = &out[i] {
            meanwhile(path, text, h);
        }
    }
    let mut pauses = 0;
    for _ in 0..10 {
        if unsettled.is_empty() {
            break;
        }
        // The first pause counts from the first reads: `meanwhile`'s work is part of it.
        let wait = if pauses == 0 { settle.saturating_sub(read_at.elapsed()) } else { settle };
        std::thread::sleep(wait);
        pauses += 1;
        unsettled.retain(|&i| {
            let again = read_bounded(&out[i].0, max);
            let agrees = matches!((&again, &out[i].1), (Ok(a), Ok(b)) if a == b);
            let changing = again.is_ok() && !agrees;
            out[i].1 = again;
            changing
        });
    }
    (out, pauses)
}

fn read_bounded(path: &Path, max: u64) -> Result<String, ReadError> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::Io(std::io::Error::other("not a regular file")));
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| ReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8: {e}"))))
}

pub(super) fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// What a non-regular file is, for the error message.
fn describe_type(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// The input paths under `root`, sorted: `root` itself if it is a regular file, else its
/// `*.yaml`/`*.yml`/`*.json` entries (skipping hidden names), each with what it is. Never opens
/// anything but the directory.
///
/// Errors: `root` is missing or unreadable, or is neither a regular file nor a directory.
pub(super) fn list_inputs(root: &Path) -> std::io::Result<Vec<(PathBuf, Listed)>> {
    let meta = std::fs::metadata(root)?;
    if meta.is_file() {
        return Ok(vec![(root.to_path_buf(), Listed::Regular)]);
    }
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!("{} is neither a regular file nor a directory: refused", describe_type(meta.file_type()))));
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name.starts_with('.') {
            continue;
        }
        let ext_ok = Path::new(name).extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if !ext_ok {
            continue;
        }
        let listed = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Listed::Regular,
            Ok(m) => Listed::NotRegular(describe_type(m.file_type())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Listed::Dangling,
            Err(_) => Listed::Regular, // unreadable metadata: reading it reports why
        };
        out.push((path, listed));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{hash, read_settled_all};

    /// 5,000 new one-block files must not take one 50-ms pause each to first sync: they are
    /// settled together, one pause for all of them, and none for files whose content is the
    /// one seen before.
    #[test]
    fn five_thousand_new_files_settle_after_one_pause() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<_> = (0..5_000)
            .map(|i| {
                let p = dir.path().join(format!("block-{i}.yaml"));
                std::fs::write(&p, format!("apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: 10-{}-{}-0-26}}\n", i / 250, i % 250))
                    .unwrap();
                p
            })
            .collect();
        let (reads, pauses) = read_settled_all(paths.iter().map(|p| (p.clone(), None)).collect(), Duration::from_millis(50), 1 << 20, |_, _, _| {});
        assert_eq!((reads.len(), pauses), (5_000, 1));
        assert!(reads.iter().all(|(_, r)| r.is_ok()));
        // Read again with what was seen: unchanged files need no pause.
        let seen: Vec<_> = reads.into_iter().map(|(p, r)| (p, r.ok().map(|t| hash(&t)))).collect();
        let (_, pauses) = read_settled_all(seen, Duration::from_millis(50), 1 << 20, |_, _, _| {});
        assert_eq!(pauses, 0);
    }

    /// The work done on a first read during its pause never stands in for the settled read:
    /// a file rewritten while `meanwhile` runs (longer than the pause itself) is read again,
    /// another round is taken, and the final text is the rewritten one; `meanwhile` saw only
    /// the reads that had to wait (not an unchanged file), once each.
    #[test]
    fn a_file_written_during_the_work_in_the_pause_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let (changing, steady) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&changing, "kind: List\nitems: []\n").unwrap();
        std::fs::write(&steady, "kind: NodeList\nitems: []\n").unwrap();
        let steady_seen = Some(hash("kind: NodeList\nitems: []\n"));
        let mut seen_meanwhile = Vec::new();
        let (reads, pauses) =
            read_settled_all(vec![(changing.clone(), None), (steady.clone(), steady_seen)], Duration::from_millis(20), 1 << 20, |path, text, _| {
                seen_meanwhile.push((path.to_path_buf(), text.to_owned()));
                std::fs::write(&changing, "kind: List\nitems: [] # rewritten\n").unwrap();
                std::thread::sleep(Duration::from_millis(40));
            });
        assert_eq!(seen_meanwhile, vec![(changing.clone(), "kind: List\nitems: []\n".to_owned())]);
        assert_eq!(pauses, 2, "the rewrite must cost one more round");
        let texts: Vec<_> = reads.into_iter().map(|(p, r)| (p, r.ok())).collect();
        assert_eq!(texts, vec![(changing, Some("kind: List\nitems: [] # rewritten\n".to_owned())), (steady, Some("kind: NodeList\nitems: []\n".to_owned()))]);
    }
}
