//! Libraries known to hold nothing to probe, told to the kernel side: a held process's thread that
//! maps the code of one is not stopped. Importing torch maps 94 libraries with code; 87 of them
//! were known from earlier runs, and each stop cost the job 0.2 to 2.6 ms (the event's way to
//! user space, the process's maps read again, the prober's answer, the thread let go): about
//! 50 ms of its start-up.
//!
//! The kernel side reads the inode behind the mapped descriptor (task → files → fdtable → file →
//! inode), at the offsets the running kernel's BTF gives; both those offsets and which of the
//! cached libraries are still as they were are found on a thread of their own while the
//! programs load (about 10 ms, the programs 40), and told before the first command starts.

use std::{path::Path, sync::mpsc, thread, time::Duration};

use aya::maps::{Array, HashMap as BpfHashMap};
use tracer_common::{FileKey, FileOffsets};

use super::{Probes, looked::WithPaths, sets::PROBE_SETS};
use crate::{error::Error, kernel_types::KernelTypes};

/// How long loading waits for [`find`] beyond the programs' loading.
const FIND_AT_MOST: Duration = Duration::from_millis(200);

/// What the kernel side needs to know the cached libraries, once found.
type Found = Result<(FileOffsets, Vec<FileKey>), String>;

/// The kernel side's knowledge of libraries without probes, owned by [`Probes`].
#[derive(Default)]
pub(super) struct KnownFiles {
    /// The kernel side reads descriptors' inodes (its offsets are set).
    pub(super) told: bool,
}

/// The probe sets' marker functions looked for in a file of this name.
pub(super) fn markers_for(path: &Path) -> Vec<&'static str> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    PROBE_SETS
        .iter()
        .filter(|set| set.file_prefix.is_none_or(|p| name.starts_with(p)))
        .map(|set| set.marker)
        .collect()
}

/// Where the running kernel keeps the inode behind a descriptor.
fn file_offsets(types: &KernelTypes) -> Option<FileOffsets> {
    let at = |s: &str, f: &str| u32::try_from(types.offset(s, &[f])?).ok();
    Some(FileOffsets {
        task_files: at("task_struct", "files")?,
        files_fdt: at("files_struct", "fdt")?,
        fdt_fd: at("fdtable", "fd")?,
        file_inode: at("file", "f_inode")?,
        inode_ino: at("inode", "i_ino")?,
        inode_sb: at("inode", "i_sb")?,
        sb_dev: at("super_block", "s_dev")?,
        pad: 0,
    })
}

/// Starts finding the kernel's offsets and which of `cached` are unchanged, on a thread of its
/// own (while the programs load).
pub(super) fn find(cached: WithPaths) -> mpsc::Receiver<Found> {
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = thread::Builder::new()
        .name("known-files".into())
        .spawn(move || {
            let offsets = KernelTypes::open().and_then(|t| {
                file_offsets(&t).ok_or_else(|| "no file → inode path in its BTF".into())
            });
            let keys = |o| {
                let still = cached.unchanged(markers_for).into_iter();
                (o, still.map(|(key, _)| key).collect())
            };
            let _ = tx.send(offsets.map(keys));
        });
    if let Err(e) = spawned {
        tracing::info!("every library's mapping is held for: {e}");
    }
    rx
}

impl Probes {
    /// Tells the kernel side the libraries known to hold nothing to probe, as `finding` finds
    /// them.
    pub(super) fn tell_known_files(&mut self, finding: &mpsc::Receiver<Found>) {
        let found = finding
            .recv_timeout(FIND_AT_MOST)
            .map_err(|_| "the kernel's offsets not found in time".to_string())
            .and_then(|f| f);
        let told = found.and_then(|(offsets, files)| {
            let n = files.len();
            files.into_iter().try_for_each(|k| self.know_file(k))?;
            self.set_file_offsets(offsets)?;
            tracing::debug!(
                files = n,
                "libraries without probes told to the kernel side"
            );
            Ok(())
        });
        match told {
            Ok(()) => self.known.told = true,
            Err(e) => tracing::info!("every library's mapping is held for: {e}"),
        }
    }

    /// The kernel side stops no thread for mapping `key`'s code.
    pub(super) fn know_file(&mut self, key: FileKey) -> Result<(), String> {
        let map = self.bpf.map_mut("NO_PROBES").ok_or("no NO_PROBES map")?;
        let mut files = BpfHashMap::<_, FileKey, u8>::try_from(map).map_err(|e| e.to_string())?;
        files
            .insert(&key, &1, 0)
            .map_err(|e| format!("NO_PROBES: {e}"))
    }

    fn set_file_offsets(&mut self, offsets: FileOffsets) -> Result<(), String> {
        let map = self
            .bpf
            .map_mut("FILE_OFFSETS")
            .ok_or("no FILE_OFFSETS map")?;
        let mut array = Array::<_, FileOffsets>::try_from(map).map_err(|e| e.to_string())?;
        array
            .set(0, &offsets, 0)
            .map_err(|e| format!("FILE_OFFSETS: {e}"))
    }

    /// Stops telling (`--step-symbol`, whose function any library may define): every mapping is
    /// held for again.
    pub(super) fn forget_known_files(&mut self) -> Result<(), Error> {
        if std::mem::take(&mut self.known.told) {
            self.set_file_offsets(FileOffsets::default())
                .map_err(|e| anyhow::anyhow!(e))?;
        }
        Ok(())
    }
}
