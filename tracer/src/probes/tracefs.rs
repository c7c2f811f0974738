//! tracefs: mounted by the tool when missing (syscall tracepoints need it), and the field offsets
//! of the process tracepoints read from their format files (they differ between kernels).

use std::path::{Path, PathBuf};

use crate::error::Error;

const TRACEFS: &str = "/sys/kernel/tracing";

/// Mounts tracefs at /sys/kernel/tracing unless it is already there.
pub fn ensure_mounted() -> Result<PathBuf, Error> {
    let root = PathBuf::from(TRACEFS);
    if root.join("events").is_dir() {
        return Ok(root);
    }
    let debugfs_tracing = Path::new("/sys/kernel/debug/tracing");
    if debugfs_tracing.join("events").is_dir() {
        return Ok(debugfs_tracing.to_path_buf());
    }
    tracing::info!(path = TRACEFS, "tracefs not mounted: mounting it");
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS])
        .status()
        .map_err(|e| Error::Kernel(format!("cannot run mount for tracefs: {e}")))?;
    if !status.success() || !root.join("events").is_dir() {
        return Err(Error::Kernel(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed"
        )));
    }
    Ok(root)
}

/// Byte offset of `field` in tracepoint `category/name`, from its format file.
pub fn field_offset(root: &Path, category: &str, name: &str, field: &str) -> Option<u32> {
    let text =
        std::fs::read_to_string(root.join("events").join(category).join(name).join("format"))
            .ok()?;
    parse_offset(&text, field)
}

fn parse_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let fname = decl.rsplit([' ', '*']).next()?.split('[').next()?;
        if fname != field {
            return None;
        }
        rest.trim()
            .strip_prefix("offset:")?
            .split(';')
            .next()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_offsets_from_a_format_file() {
        let f = "\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n";
        assert_eq!(super::parse_offset(f, "clone_flags"), Some(32));
        assert_eq!(super::parse_offset(f, "comm"), Some(12));
        assert_eq!(super::parse_offset(f, "pid"), Some(8));
        assert_eq!(super::parse_offset(f, "group_dead"), None);
    }
}
