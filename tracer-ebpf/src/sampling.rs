//! `--heap sampled`: which heap allocations are recorded. Sample points fall on the bytes a thread
//! allocates as a Poisson process with a mean interval of `HEAP_SAMPLING[0]` bytes (as jemalloc
//! and tcmalloc sample): an allocation is recorded when a point falls inside it, so one of `s`
//! bytes is recorded with probability 1 − e^(−s/mean), which user space divides by. Recorded
//! addresses go into `SAMPLED`; a free is sent only for those.

use aya_ebpf::{
    helpers::bpf_get_prandom_u32,
    macros::map,
    maps::{Array, HashMap},
};
use tracer_common::{Counter, MAX_SAMPLED, Pending, SampledKey};

use crate::shared::count;

/// The mean sampling interval in bytes; 0 records every allocation (`--heap full`).
#[map]
pub static HEAP_SAMPLING: Array<u64> = Array::with_max_entries(1, 0);

/// Sampled blocks still allocated. Their entries are allocated as they are inserted
/// (`BPF_F_NO_PREALLOC`): all 262,144 made at once took 7 ms of every start (2.5 ms now, for
/// the buckets), where most runs sample nothing.
#[map]
static SAMPLED: HashMap<SampledKey, u64> =
    HashMap::with_max_entries(MAX_SAMPLED, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// The sampling interval; 0 when every allocation is recorded.
#[inline(always)]
pub fn interval() -> u64 {
    HEAP_SAMPLING.get(0).copied().unwrap_or(0)
}

/// The sampling interval of a call: CPython's object allocator's own
/// ([`tracer_common::OBJECT_SAMPLE_BYTES`]: its objects are always sampled), else the heap's.
#[inline(always)]
pub fn interval_of(object: bool) -> u64 {
    if object {
        tracer_common::OBJECT_SAMPLE_BYTES
    } else {
        interval()
    }
}

/// log2(1 + (i + ½)/256) in 16.16 fixed point.
static LOG2: [u32; 256] = [
    184, 552, 919, 1284, 1648, 2010, 2371, 2730, 3088, 3445, 3801, 4155, 4507, 4859, 5209, 5558,
    5906, 6252, 6597, 6941, 7283, 7625, 7965, 8304, 8641, 8978, 9313, 9647, 9980, 10312, 10642,
    10972, 11300, 11627, 11953, 12278, 12602, 12925, 13246, 13567, 13886, 14205, 14522, 14838,
    15153, 15467, 15781, 16093, 16404, 16714, 17023, 17331, 17637, 17943, 18248, 18552, 18856,
    19158, 19459, 19759, 20058, 20356, 20654, 20950, 21245, 21540, 21834, 22126, 22418, 22709,
    22999, 23288, 23577, 23864, 24150, 24436, 24721, 25005, 25288, 25570, 25852, 26132, 26412,
    26691, 26969, 27246, 27523, 27798, 28073, 28347, 28620, 28893, 29164, 29435, 29706, 29975,
    30244, 30511, 30778, 31045, 31310, 31575, 31839, 32103, 32365, 32627, 32888, 33149, 33409,
    33668, 33926, 34184, 34441, 34697, 34952, 35207, 35461, 35715, 35968, 36220, 36471, 36722,
    36972, 37222, 37470, 37719, 37966, 38213, 38459, 38705, 38950, 39194, 39438, 39681, 39923,
    40165, 40406, 40647, 40887, 41126, 41365, 41603, 41841, 42077, 42314, 42550, 42785, 43019,
    43253, 43487, 43720, 43952, 44184, 44415, 44646, 44876, 45105, 45334, 45562, 45790, 46018,
    46244, 46471, 46696, 46921, 47146, 47370, 47593, 47816, 48039, 48261, 48482, 48703, 48924,
    49143, 49363, 49582, 49800, 50018, 50235, 50452, 50668, 50884, 51100, 51315, 51529, 51743,
    51956, 52169, 52382, 52594, 52805, 53016, 53227, 53437, 53647, 53856, 54064, 54273, 54481,
    54688, 54895, 55101, 55307, 55513, 55718, 55922, 56127, 56330, 56534, 56737, 56939, 57141,
    57343, 57544, 57745, 57945, 58145, 58344, 58543, 58742, 58940, 59138, 59335, 59532, 59729,
    59925, 60121, 60316, 60511, 60706, 60900, 61094, 61287, 61480, 61672, 61865, 62056, 62248,
    62439, 62629, 62820, 63010, 63199, 63388, 63577, 63765, 63953, 64141, 64328, 64515, 64701,
    64887, 65073, 65259, 65444,
];

/// Bytes until the next sample point: −ln(U)·mean for U uniform in (0, 1], in fixed point
/// (log2 from the leading bit and a 256-entry table of the mantissa: within 0.3% of exact).
#[inline(always)]
pub fn draw(mean: u64) -> i64 {
    // SAFETY: helper without arguments.
    let r = unsafe { bpf_get_prandom_u32() } | 1;
    let msb = 31 - r.leading_zeros();
    // The 8 bits after the leading one.
    let frac = (if msb >= 8 {
        r >> (msb - 8)
    } else {
        r << (8 - msb)
    }) & 0xff;
    let log2_r = (u64::from(msb) << 16) + u64::from(LOG2[frac as usize & 0xff]);
    // −log2(U) = 32 − log2(r); ln 2 = 45426 / 65536.
    let neg_log2_u = (32u64 << 16).saturating_sub(log2_r);
    let neg_ln_u = (neg_log2_u * 45426) >> 16;
    ((mean.min(1 << 40) * neg_ln_u) >> 16) as i64
}

/// A new thread's first sample points, the heap's and its objects'.
#[inline(always)]
pub fn first_points(p: &mut Pending) {
    let mean = interval();
    if mean != 0 {
        p.countdown = draw(mean);
    }
    p.object_countdown = draw(tracer_common::OBJECT_SAMPLE_BYTES);
}

/// Whether the allocation of `size` bytes at `addr` (by thread entry `p`, an object's when
/// `object`) is recorded; a recorded one is remembered for its free. Each kind counts down to
/// its own points.
#[inline(always)]
pub fn take(p: &mut Pending, object: bool, tgid: u32, addr: u64, size: u64) -> bool {
    let countdown = if object {
        &mut p.object_countdown
    } else {
        &mut p.countdown
    };
    *countdown -= size as i64;
    if *countdown > 0 {
        return false;
    }
    *countdown = draw(interval_of(object));
    remember(tgid, addr);
    true
}

/// Remembers a recorded block (its free is sent).
#[inline(always)]
pub fn remember(tgid: u32, addr: u64) {
    if SAMPLED.insert(&key(tgid, addr), &0, 0).is_err() {
        count(Counter::SampledFull);
    }
}

/// Whether `addr` was recorded (forgotten now: it is being freed).
#[inline(always)]
pub fn forget(tgid: u32, addr: u64) -> bool {
    SAMPLED.remove(&key(tgid, addr)).is_ok()
}

/// Whether `addr` is recorded, without forgetting it: a lookup takes no lock where a removal
/// takes the bucket's, and most frees are of blocks that were not recorded.
#[inline(always)]
pub fn recorded(tgid: u32, addr: u64) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { SAMPLED.get(&key(tgid, addr)) }.is_some()
}

#[inline(always)]
fn key(tgid: u32, addr: u64) -> SampledKey {
    SampledKey {
        tgid: u64::from(tgid),
        addr,
    }
}
