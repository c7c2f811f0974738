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

/// `len` bytes at each of `addrs` in `pid`, in as few calls as the reads allow: one call takes up
/// to a thousand ranges (a read of each range on its own costs a syscall and the kernel's ptrace
/// access checks, which dominate when a new stack has thirty Python frames). A range that cannot
/// be read whole is None.
pub fn read_many(pid: u32, addrs: &[u64], len: usize) -> Vec<Option<Vec<u8>>> {
    const MAX_IOV: usize = 1024;
    let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(addrs.len());
    let mut bufs: Vec<Vec<u8>> = addrs.iter().map(|_| vec![0u8; len]).collect();
    let mut at = 0;
    while at < addrs.len() {
        let end = (at + MAX_IOV).min(addrs.len());
        let local: Vec<libc::iovec> = bufs[at..end]
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: len,
            })
            .collect();
        let remote: Vec<libc::iovec> = addrs[at..end]
            .iter()
            .map(|&a| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: each local iovec covers one buffer of `bufs`, which outlives the call; the
        // kernel checks the remote ones.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        // The transfer stops at the first range it cannot read: the ranges before it are whole,
        // that one is not, and the next call starts after it.
        let whole = if n <= 0 || len == 0 {
            0
        } else {
            n as usize / len
        };
        for b in bufs[at..at + whole].iter_mut() {
            out.push(Some(std::mem::take(b)));
        }
        if at + whole < end {
            out.push(None);
        }
        at += whole + 1;
    }
    out.truncate(addrs.len());
    out
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

    #[test]
    fn many_ranges_read_together_and_an_unreadable_one_is_none() {
        let a = [1u8; 16];
        let b = [2u8; 16];
        let addrs = [a.as_ptr() as u64, 8, b.as_ptr() as u64, a.as_ptr() as u64];
        let got = read_many(std::process::id(), &addrs, 16);
        assert_eq!(
            got,
            [Some(a.to_vec()), None, Some(b.to_vec()), Some(a.to_vec())]
        );
        assert!(read_many(std::process::id(), &[], 16).is_empty());
    }
}
