//! Where `-o FILE` output goes: a temporary file beside FILE that replaces it only once the
//! report is written, so a run that fails (a typo in an option, a missing permission) leaves
//! the previous result in place instead of an empty file.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::error::{Failure, fail};

/// A file written under a temporary name in FILE's directory and renamed over FILE by
/// [`AtomicFile::commit`] (rename(2) within one filesystem replaces atomically). Dropped
/// without a commit, it removes the temporary file and FILE is untouched.
///
/// Special files (`/dev/null`, `/dev/stdout`, a FIFO) are written directly: renaming over them
/// would replace the device node or pipe with a regular file.
pub struct AtomicFile {
    writer: BufWriter<File>,
    /// `(temporary, final)` paths until committed; `None` once renamed or for special files.
    pending: Option<(PathBuf, PathBuf)>,
}

impl AtomicFile {
    pub fn create(path: &Path) -> io::Result<Self> {
        // Resolve a symlink to the file it names, so the link survives and its target changes,
        // as with a plain open(O_TRUNC).
        let destination = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let existing = std::fs::metadata(&destination).ok();
        if let Some(meta) = &existing
            && !meta.is_file()
        {
            return Ok(Self {
                writer: BufWriter::new(File::create(&destination)?),
                pending: None,
            });
        }
        let directory = match destination.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = destination
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?
            .to_string_lossy()
            .into_owned();
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let temporary = directory.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        if let Some(meta) = existing {
            // The replacement keeps the old file's mode (a report kept private stays private).
            let _ = file.set_permissions(meta.permissions());
        }
        Ok(Self {
            writer: BufWriter::new(file),
            pending: Some((temporary, destination)),
        })
    }

    /// Flushes and renames the temporary file over FILE. Later writes still go to the same
    /// (now renamed) file, so `-I` output can be committed at its first interval and stream on.
    /// Committing again only flushes.
    pub fn commit(&mut self) -> io::Result<()> {
        self.writer.flush()?;
        if let Some((temporary, destination)) = &self.pending {
            std::fs::rename(temporary, destination)?;
            self.pending = None;
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some((temporary, _)) = self.pending.take() {
            let _ = std::fs::remove_file(temporary);
        }
    }
}

/// The report's destination: stdout, or an [`AtomicFile`] for `-o FILE`.
pub enum Output {
    Stdout(io::Stdout),
    File(AtomicFile),
}

impl Output {
    /// Opens `-o FILE` (or stdout without one); a path that cannot be written is a usage error.
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        match path {
            None => Ok(Output::Stdout(io::stdout())),
            Some(path) => AtomicFile::create(path).map(Output::File).map_err(|err| {
                fail(
                    Failure::Usage,
                    format!("cannot write {}: {err}", path.display()),
                )
            }),
        }
    }

    /// Flushes, and for a file puts it in place of FILE (see [`AtomicFile::commit`]).
    pub fn commit(&mut self) -> anyhow::Result<()> {
        use anyhow::Context as _;
        match self {
            Output::Stdout(stdout) => stdout.flush().context("writing the report"),
            Output::File(file) => file.commit().context("writing the report"),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Stdout(stdout) => stdout.write(buf),
            Output::File(file) => file.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(stdout) => stdout.flush(),
            Output::File(file) => file.flush(),
        }
    }
}

/// Lets `output.as_mut()` hand out `&mut dyn Write` as a `Box<dyn Write>` did.
impl AsMut<dyn Write + 'static> for Output {
    fn as_mut(&mut self) -> &mut (dyn Write + 'static) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_dropped_writer_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        std::fs::write(&path, "last result\n").unwrap();
        {
            let mut file = AtomicFile::create(&path).unwrap();
            file.write_all(b"half a rep").unwrap();
            file.flush().unwrap();
            assert_eq!(entries(dir.path()).len(), 2, "a temporary beside FILE");
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "last result\n");
        assert_eq!(entries(dir.path()), ["result.json"]);
    }

    #[test]
    fn commit_replaces_the_file_and_later_writes_land_in_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        std::fs::write(&path, "last result, longer than the new one\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"new\n").unwrap();
        file.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        file.write_all(b"more\n").unwrap();
        file.commit().unwrap();
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\nmore\n");
        assert_eq!(entries(dir.path()), ["result.json"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_new_file_appears_only_on_commit_and_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.csv");
        let mut output = Output::open(Some(&path)).unwrap();
        output.write_all(b"a,b\n").unwrap();
        assert!(!path.exists());
        output.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b\n");

        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let mut output = Output::open(Some(&link)).unwrap();
        output.write_all(b"c\n").unwrap();
        output.commit().unwrap();
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "c\n");
    }

    #[test]
    fn special_files_are_written_in_place_and_bad_paths_are_usage_errors() {
        let mut output = Output::open(Some(Path::new("/dev/null"))).unwrap();
        output.write_all(b"discarded").unwrap();
        output.commit().unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .map(|meta| !meta.is_file())
                .unwrap()
        );

        let err = Output::open(Some(Path::new("/nonexistent-dir/out.json")))
            .err()
            .unwrap();
        assert_eq!(
            crate::error::failure_of(&err),
            Some(crate::error::Failure::Usage)
        );
        assert!(
            err.to_string()
                .starts_with("cannot write /nonexistent-dir/out.json:"),
            "{err}"
        );
    }
}
