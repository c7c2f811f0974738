//! Per-thread storage (BPF_MAP_TYPE_TASK_STORAGE), which aya-ebpf does not wrap: a BTF map
//! definition in the layout libbpf and aya's loader read, and its two helpers. A lookup follows the
//! task's own storage pointer instead of hashing a key: the allocator probes do one per call.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{
        BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE,
    },
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_get},
};

/// A BTF-defined task storage map holding one `T` per thread (created zeroed on demand).
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are BTF placeholders the loader reads; they are never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    #[inline(always)]
    fn lookup(&self, flags: u64) -> Option<&mut T> {
        // SAFETY: the current task is a trusted BTF task pointer; the helper returns its value or
        // null.
        let p = unsafe {
            bpf_task_storage_get(
                ptr::from_ref(self).cast_mut().cast::<c_void>(),
                bpf_get_current_task_btf(),
                ptr::null_mut(),
                flags,
            )
        };
        // SAFETY: a non-null result is this task's value, alive while the task is.
        unsafe { p.cast::<T>().as_mut() }
    }

    /// The current thread's value, if it has one.
    #[inline(always)]
    pub fn current(&self) -> Option<&mut T> {
        self.lookup(0)
    }

    /// The current thread's value, created zeroed if missing (None when memory is short).
    #[inline(always)]
    pub fn current_or_create(&self) -> Option<&mut T> {
        self.lookup(BPF_LOCAL_STORAGE_GET_F_CREATE as u64)
    }
}
