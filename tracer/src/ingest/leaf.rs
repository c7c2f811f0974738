//! Leaf words ([`LeafWords`]): the frames a frame-pointer walk skips. A program built with frame
//! pointers calls the allocator through library functions built without (libstdc++'s `operator
//! new`, libc's `strdup`). Such a function leaves `rbp` as its caller's, so the walk goes from the
//! allocator's return straight to the caller's caller: the line that allocated is missing. The
//! kernel sends the top of the stack with the walk; the call-frame information unwinds it through
//! the frameless functions, and the walk's frames go on from where the unwind joins them.

use tracer_common::{LEAF_WORDS, LeafWords};

/// Frames an unwind of leaf words gives at most (the ip and a few frameless callers).
pub const LEAF_FRAMES: usize = LEAF_WORDS;

/// The leaf words as the stack bytes they were read from.
pub fn bytes(leaf: &LeafWords) -> [u8; 8 * LEAF_WORDS] {
    let mut out = [0; 8 * LEAF_WORDS];
    for (chunk, w) in out.as_chunks_mut::<8>().0.iter_mut().zip(leaf.words) {
        *chunk = w.to_le_bytes();
    }
    out
}

/// How a walk (`walked`: the ip, then the frame-pointer chain's return addresses) and an unwind
/// of its leaf words from the same ip (`unwound`) join: the stack is `unwound[..k]`, then
/// `walked[1..]`. Where the unwind meets the walk's first return address, the walk goes on from
/// there; when the unwind stops before (a frame-pointer function whose frame lies above the leaf
/// words), the walk's frames follow the unwind's: the chain starts at the frame of the last
/// function the unwind reached. None when the unwind is not of this ip (the walk stands).
pub fn joined(walked: &[u64], unwound: &[u64]) -> Option<usize> {
    let (&ip, &first) = (walked.first()?, unwound.first()?);
    if ip != first {
        return None;
    }
    let meet = walked
        .get(1)
        .and_then(|ret| unwound[1..].iter().position(|f| f == ret));
    Some(meet.map_or(unwound.len(), |i| i + 1))
}

#[cfg(test)]
mod tests {
    use super::joined;

    fn spliced(walked: &[u64], unwound: &[u64]) -> Vec<u64> {
        match joined(walked, unwound) {
            Some(k) => [&unwound[..k], &walked[1..]].concat(),
            None => walked.to_vec(),
        }
    }

    #[test]
    fn a_frameless_callers_caller_goes_back_between_the_ip_and_the_chain() {
        // malloc returns into operator new (0x10); the walk goes on from main (0x30): the
        // constructor that called operator new (0x20) is skipped.
        assert_eq!(
            spliced(&[0x10, 0x30, 0x40], &[0x10, 0x20]),
            [0x10, 0x20, 0x30, 0x40]
        );
    }

    #[test]
    fn an_unwind_that_reaches_the_chain_joins_it() {
        assert_eq!(
            spliced(&[0x10, 0x30, 0x40], &[0x10, 0x20, 0x30, 0x40, 0x50]),
            [0x10, 0x20, 0x30, 0x40]
        );
        // A caller with frame pointers: nothing was skipped.
        assert_eq!(spliced(&[0x10, 0x30], &[0x10, 0x30]), [0x10, 0x30]);
        assert_eq!(spliced(&[0x10, 0x30], &[0x10]), [0x10, 0x30]);
    }

    #[test]
    fn an_unwind_of_another_ip_or_none_leaves_the_walk() {
        assert_eq!(spliced(&[0x10, 0x30], &[0x11, 0x20]), [0x10, 0x30]);
        assert_eq!(spliced(&[0x10, 0x30], &[]), [0x10, 0x30]);
        assert_eq!(spliced(&[], &[0x10]), Vec::<u64>::new());
    }
}
