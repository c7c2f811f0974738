//! Reading another process's memory (process_vm_readv): what a CPython code object holds.

/// Up to `len` bytes at `addr` in `pid`; None when nothing there could be read (unmapped, the
/// process gone).
pub fn read(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` covers `buf`, which outlives the call; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

pub fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

pub fn u32_at(bytes: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

pub fn i32_at(bytes: &[u8], offset: usize) -> Option<i32> {
    u32_at(bytes, offset).map(|v| v as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_memory_and_refuses_unmapped_addresses() {
        let data: Vec<u8> = (0..=255).collect();
        let got = read(std::process::id(), data.as_ptr() as u64, 256).unwrap();
        assert_eq!(got, data);
        assert_eq!(
            u64_at(&got, 8),
            Some(u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]))
        );
        assert_eq!(
            read(std::process::id(), 8, 16),
            None,
            "page zero is never mapped"
        );
    }
}
