//! `attach` to a running process: what it allocates from then on is exact, what it frees from
//! before is counted as unmatched, and the session ends when the target exits.

use std::process::{Command, Stdio};

use tests::fixture;

#[test]
fn attach_sees_what_happens_after_it_and_counts_earlier_frees() {
    if !fixture::bpf_available() {
        return;
    }
    let _x = fixture::exclusive();
    let bin = fixture::build("attach_target");
    let mut target = Command::new(&bin).stdout(Stdio::piped()).spawn().unwrap();
    fixture::wait_ready(&mut target);
    let tracer = fixture::attach(target.id(), "attach");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(target.id() as i32, libc::SIGUSR1) };
    assert!(target.wait().unwrap().success());
    let (code, log, r) = tracer.finish();
    assert_eq!(code, Some(0), "attach ends with the target: {log}");
    assert_eq!(r.site("heap", 0, "leak_after_attach"), (7000, 7));
    assert_eq!(
        r.site("heap", 0, "before_attach"),
        (0, 0),
        "allocated before attaching: unseen"
    );
    let p = r.process(target.id() as u64);
    assert_eq!(
        p["mismatches"]["unmatched_frees"], 3,
        "the 3 early blocks freed after attach"
    );
    assert_eq!(p["exited"], true);
}
