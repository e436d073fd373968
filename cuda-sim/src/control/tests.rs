//! The request protocol against the measured driver facts (docs/driver-facts.md). The helper
//! thread is played by a test thread; a controller's death is the closing of its description.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::shm::{control_memfd, ControlPage};

struct Page {
    fd: OwnedFd,
    page: ControlPage,
}

fn page() -> Arc<Page> {
    let fd = control_memfd("t").unwrap();
    let page = ControlPage::map(&fd, false).unwrap();
    page.block().init(1, 2);
    Arc::new(Page { fd, page })
}

impl Page {
    fn block(&self) -> &ControlBlock {
        self.page.block()
    }

    /// A controller's own open description of the memfd.
    fn open(&self) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .unwrap()
    }

    fn slot(&self) -> u32 {
        self.block().slot.load(Ordering::SeqCst)
    }
}

fn lock(timeout_ms: u32) -> Request {
    Request {
        op: Op::Lock,
        timeout_ms,
        fault: Fault::None,
        pairs: vec![],
    }
}

const ALIVE: &dyn Fn() -> bool = &|| false;

/// Waits (10 s at most) for the event a test must see before it looks for an absence.
fn until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Plays the helper thread for `n` requests: answers each with `op * 10`, after `work`.
fn helper(p: &Arc<Page>, n: usize, work: Duration) -> std::thread::JoinHandle<Vec<Request>> {
    let p = p.clone();
    std::thread::spawn(move || {
        (0..n)
            .map(|_| {
                let req = p.block().next_request(&p.fd);
                std::thread::sleep(work);
                p.block().complete(req.op as u32 * 10);
                req
            })
            .collect()
    })
}

#[test]
fn requests_reach_the_helper_and_results_come_back() {
    let p = page();
    let h = helper(&p, 1, Duration::ZERO);
    let req = Request {
        op: Op::Restore,
        timeout_ms: 5,
        fault: Fault::Delay(7),
        pairs: vec![([1; 16], [2; 16])],
    };
    let done = p.block().call(&p.open(), &req, ALIVE).unwrap();
    assert_eq!(done.result, 30);
    assert!(done.started_ns > 0 && done.finished_ns >= done.started_ns);
    assert_eq!(h.join().unwrap(), vec![req]);
    assert_eq!(p.slot(), slot::FREE);
}

/// F2: a request waits for the helper without limit; no pickup timeout, whatever the lock's.
#[test]
fn f2_a_request_waits_for_the_helper_however_long() {
    let p = page();
    let caller = {
        let p = p.clone();
        std::thread::spawn(move || p.block().call(&p.open(), &lock(1), ALIVE))
    };
    until("the request is posted", || p.slot() == slot::PENDING);
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !caller.is_finished(),
        "still waiting, well past the lock's 1 ms"
    );
    assert_eq!(p.slot(), slot::PENDING);
    let h = helper(&p, 1, Duration::ZERO);
    assert_eq!(caller.join().unwrap().unwrap().result, 10);
    h.join().unwrap();
}

/// F3, first half: a request whose caller died before the helper took it is dropped.
#[test]
fn f3_a_request_of_a_dead_caller_not_yet_taken_is_dropped() {
    let p = page();
    let caller = p.open();
    assert!(ofd::try_lock(&caller, LIVE_LOCK + 1).unwrap());
    p.block().post(1, &lock(0));
    drop(caller); // the caller dies while the process cannot run its helper
                  // A process another test spawns meanwhile holds every open description of this one from
                  // its fork to its exec: the caller is dead once nobody holds its lock.
    until("the dead caller's lock is released", || {
        !ofd::held_by_another(p.open(), LIVE_LOCK + 1).unwrap()
    });
    let h = helper(&p, 1, Duration::ZERO);
    // Carried out, it would end in DONE with nobody to collect it: FREE means dropped.
    until("the helper has looked at the request", || {
        p.slot() != slot::PENDING
    });
    assert_eq!(p.slot(), slot::FREE);
    assert!(
        !h.is_finished(),
        "the dead caller's request was not carried out"
    );
    // The next live request is served.
    let done = p
        .block()
        .call(
            &p.open(),
            &Request {
                op: Op::Unlock,
                ..lock(0)
            },
            ALIVE,
        )
        .unwrap();
    assert_eq!(done.result, 40);
    assert_eq!(h.join().unwrap()[0].op, Op::Unlock);
}

/// F3, first half, when another controller comes first: it drops the dead caller's request.
#[test]
fn f3_the_next_caller_drops_a_dead_callers_pending_request() {
    let p = page();
    let dead = p.open();
    assert!(ofd::try_lock(&dead, LIVE_LOCK + 1).unwrap());
    p.block().post(1, &lock(0));
    drop(dead);
    until("the dead caller's lock is released", || {
        !ofd::held_by_another(p.open(), LIVE_LOCK + 1).unwrap()
    });
    let h = helper(&p, 1, Duration::ZERO);
    let done = p
        .block()
        .call(
            &p.open(),
            &Request {
                op: Op::Checkpoint,
                ..lock(0)
            },
            ALIVE,
        )
        .unwrap();
    assert_eq!(done.result, 20);
    assert_eq!(
        h.join().unwrap()[0].op,
        Op::Checkpoint,
        "only one request ran"
    );
}

/// F3, second half: a request the helper took completes though its caller died.
#[test]
fn f3_a_taken_request_completes_after_its_caller_died() {
    let p = page();
    let caller = p.open();
    assert!(ofd::try_lock(&caller, LIVE_LOCK + 1).unwrap());
    p.block().post(1, &lock(0));
    let h = helper(&p, 1, Duration::from_millis(300));
    while p.slot() != slot::TAKEN {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(caller);
    assert_eq!(h.join().unwrap()[0].op, Op::Lock, "finished");
    assert_eq!(p.slot(), slot::DONE, "an orphaned result");
    assert_eq!(p.block().state(), state::RUNNING);
}

fn get_state(p: &Page, gone: &dyn Fn() -> bool) -> Result<u32, u32> {
    let req = Request {
        op: Op::State,
        ..lock(0)
    };
    p.block()
        .call(&p.open(), &req, gone)
        .map(|_| p.block().state())
}

/// F4, F11: the state is answered by the helper thread, after the request before it.
#[test]
fn f4_the_state_waits_for_a_pending_or_running_request() {
    let p = page();
    let caller = {
        let p = p.clone();
        std::thread::spawn(move || p.block().call(&p.open(), &lock(0), ALIVE))
    };
    while p.slot() != slot::PENDING {
        std::thread::sleep(Duration::from_millis(5));
    }
    let asked = Arc::new(AtomicBool::new(false));
    let reader = {
        let (p, asked) = (p.clone(), asked.clone());
        std::thread::spawn(move || {
            asked.store(true, Ordering::SeqCst);
            get_state(&p, ALIVE)
        })
    };
    // Asked while the lock is pending: an answer before the lock ends would be RUNNING (the
    // last assertion), whatever the timing; the checks in between say where it waited.
    until("the state is asked", || asked.load(Ordering::SeqCst));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !reader.is_finished(),
        "no answer while the request is pending"
    );
    let p2 = p.clone();
    let (took, taken) = std::sync::mpsc::channel();
    let (go, went) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        let _ = p2.block().next_request(&p2.fd);
        took.send(()).unwrap();
        went.recv().unwrap();
        p2.block().set_state(state::LOCKED);
        p2.block().complete(0);
        // Then the state request.
        let _ = p2.block().next_request(&p2.fd);
        p2.block().complete(0);
    });
    taken.recv().unwrap();
    assert!(!reader.is_finished(), "no answer while the request runs");
    go.send(()).unwrap();
    assert_eq!(
        reader.join().unwrap(),
        Ok(state::LOCKED),
        "the state it left"
    );
    caller.join().unwrap().unwrap();
    h.join().unwrap();
}

/// F6: a second action waits its turn, then runs after the first.
#[test]
fn f6_a_second_action_waits_its_turn() {
    let p = page();
    let h = helper(&p, 2, Duration::from_millis(300));
    let first = {
        let p = p.clone();
        std::thread::spawn(move || p.block().call(&p.open(), &lock(0), ALIVE))
    };
    while p.slot() != slot::TAKEN {
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let second = p
        .block()
        .call(
            &p.open(),
            &Request {
                op: Op::Unlock,
                ..lock(0)
            },
            ALIVE,
        )
        .unwrap();
    let first = first.join().unwrap().unwrap();
    assert!(second.started_ns >= first.finished_ns, "not overlapped");
    assert!(start.elapsed() >= Duration::from_millis(300));
    let order: Vec<Op> = h.join().unwrap().iter().map(|r| r.op).collect();
    assert_eq!(order, [Op::Lock, Op::Unlock]);
}

/// F7: a caller whose target dies stops waiting at once, with CUDA_ERROR_OPERATING_SYSTEM.
#[test]
fn f7_the_targets_death_ends_every_wait() {
    let p = page();
    let dead = Arc::new(AtomicBool::new(false));
    let gone = {
        let dead = dead.clone();
        move || dead.load(Ordering::SeqCst)
    };
    let caller = {
        let (p, gone) = (p.clone(), gone.clone());
        std::thread::spawn(move || p.block().call(&p.open(), &lock(0), &gone))
    };
    let queued = {
        let (p, gone) = (p.clone(), gone.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            p.block().call(&p.open(), &lock(0), &gone)
        })
    };
    let reader = {
        let (p, gone) = (p.clone(), gone.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            get_state(&p, &gone)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    dead.store(true, Ordering::SeqCst);
    for t in [caller, queued] {
        assert_eq!(t.join().unwrap(), Err(code::OPERATING_SYSTEM));
    }
    assert_eq!(reader.join().unwrap(), Err(code::OPERATING_SYSTEM));
    assert!(start.elapsed() < Duration::from_millis(500), "at once");
}
