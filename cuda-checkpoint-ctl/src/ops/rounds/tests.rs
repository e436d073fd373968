use super::*;

/// A locker that answers each round from a script (the last answer repeats), waiting as the
/// driver does: a round with a lock that gives up lasts its limit.
struct Scripted {
    script: Vec<Vec<Attempt<String>>>,
    limits: Vec<Duration>,
    unlocked: Vec<Vec<i32>>,
    unlock_fails: bool,
}

impl Scripted {
    fn new(script: Vec<Vec<Attempt<String>>>) -> Scripted {
        Scripted {
            script,
            limits: Vec::new(),
            unlocked: Vec::new(),
            unlock_fails: false,
        }
    }
}

impl Locker for Scripted {
    type Failure = String;
    type Error = ();
    fn lock_all(&mut self, pids: &[i32], limit: Duration) -> Result<Vec<Attempt<String>>, ()> {
        let i = self.limits.len().min(self.script.len() - 1);
        self.limits.push(limit);
        let answer = self.script[i].clone();
        assert_eq!(answer.len(), pids.len());
        if answer.contains(&Attempt::GaveUp) {
            std::thread::sleep(limit);
        }
        Ok(answer)
    }
    fn unlock_all(&mut self, pids: &[i32]) -> Result<Vec<(i32, String)>, ()> {
        self.unlocked.push(pids.to_vec());
        Ok(if self.unlock_fails {
            pids.iter().map(|p| (*p, "no".to_owned())).collect()
        } else {
            Vec::new()
        })
    }
}

use Attempt::{Failed, GaveUp, Locked};

fn budget(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

#[test]
fn a_group_that_locks_at_once_takes_one_round() {
    let mut l = Scripted::new(vec![vec![Locked, Locked]]);
    let r = lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(1)).unwrap();
    assert_eq!(r.rounds, 1);
    assert_eq!(l.limits, vec![FIRST]);
    assert!(l.unlocked.is_empty());
}

#[test]
fn the_locked_are_unlocked_after_a_skewed_round_and_the_next_is_as_short() {
    let mut l = Scripted::new(vec![
        vec![Locked, GaveUp],
        vec![GaveUp, Locked],
        vec![Locked, Locked],
    ]);
    let r = lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(2)).unwrap();
    assert_eq!(r.rounds, 3);
    assert_eq!(l.unlocked, vec![vec![1], vec![2]]);
    assert_eq!(
        l.limits,
        vec![FIRST, FIRST, FIRST],
        "a longer limit cannot undo rank skew: short rounds at random offsets"
    );
    assert_eq!(r.longest, FIRST);
}

/// The dump that failed on two H200s (issue 28): 28.5 s of skewed rounds. The old schedule
/// (limits growing by half, the last taking the rest) made 9 rounds of it; short rounds make
/// many, each a fresh chance to catch the ranks between the same collectives, and only the
/// second half grows the limits (work long on one rank alone).
#[test]
fn persistent_skew_gets_many_short_rounds_within_the_budget() {
    let budget = Duration::from_millis(28_500);
    let mut p = Policy::new(budget);
    let mut left = budget;
    let mut limits = Vec::new();
    let mut next = p.first(left);
    let mut j = Jitter::seeded(11);
    while let Next::Lock { pause, limit } = next {
        left = left.saturating_sub(pause + limit);
        limits.push(limit);
        let skewed = Outcome {
            limit,
            locked: 1,
            of: 2,
            failed: false,
        };
        next = p.after(&skewed, left, j.up_to(PAUSE));
    }
    assert!(matches!(next, Next::Stop(_)), "{next:?}");
    let short = limits.iter().filter(|l| **l == FIRST).count();
    assert!(short >= 40, "{} rounds: {limits:?}", limits.len());
    let total: Duration = limits.iter().sum();
    assert!(total <= budget, "{total:?}");
    // The first half is all short rounds.
    let mut used = Duration::ZERO;
    for l in &limits {
        if used * 2 > budget {
            break;
        }
        assert_eq!(*l, FIRST, "{limits:?}");
        used += *l + PAUSE;
    }
}

/// Nodes that see the same outcomes and the same time left decide the same (a job across
/// machines: every node runs the policy on all nodes' outcomes).
#[test]
fn the_policy_decides_the_same_from_the_same_inputs() {
    let outcomes = [(0, 4), (2, 4), (3, 4), (0, 4), (4, 4)];
    let run = || {
        let mut p = Policy::new(Duration::from_secs(20));
        let mut out = vec![p.first(Duration::from_secs(20))];
        for (i, (locked, of)) in outcomes.iter().enumerate() {
            let o = Outcome {
                limit: FIRST,
                locked: *locked,
                of: *of,
                failed: false,
            };
            let left = Duration::from_secs(19 - i as u64);
            out.push(p.after(&o, left, Duration::from_millis(7 * i as u64)));
        }
        out
    };
    assert_eq!(run(), run());
    assert_eq!(run().last(), Some(&Next::Done));
}

#[test]
fn a_round_in_which_nothing_locked_doubles_the_limit() {
    let mut l = Scripted::new(vec![vec![GaveUp, GaveUp], vec![Locked, Locked]]);
    lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(3)).unwrap();
    assert_eq!(l.limits, vec![FIRST, FIRST * 2]);
    assert!(l.unlocked.is_empty(), "nothing locked, nothing to unlock");
}

#[test]
fn rounds_end_within_the_deadline_and_the_last_takes_what_is_left() {
    let mut l = Scripted::new(vec![vec![Locked, GaveUp]]);
    let start = Instant::now();
    let e = lock_in_rounds(&mut l, &[1, 2], budget(1500), &mut Jitter::seeded(4)).unwrap_err();
    let took = start.elapsed();
    // The deadline bounds the rounds; the slack is for a loaded machine's scheduling.
    assert!(took <= Duration::from_millis(1900), "{took:?}");
    match e {
        RoundsError::GaveUp { report, last, .. } => {
            assert_eq!(report.rounds as usize, l.limits.len());
            assert_eq!(last, vec![(1, Locked), (2, GaveUp)]);
            // Skew through half the time: the limits grow again (work long on one rank), and
            // the last round had the rest of the time.
            let last_limit = *l.limits.last().unwrap();
            assert!(last_limit > FIRST, "{l:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(l.limits.len() >= 3, "{:?}", l.limits);
    assert_eq!(l.unlocked.last(), Some(&vec![1]));
}

#[test]
fn a_lock_that_fails_otherwise_stops_the_rounds_with_the_locked_left_locked() {
    let mut l = Scripted::new(vec![vec![Locked, Failed("gpu lost".into())]]);
    match lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(6)) {
        Err(RoundsError::Failed { report, last }) => {
            assert_eq!(report.rounds, 1);
            assert_eq!(last[1], (2, Failed("gpu lost".into())));
        }
        other => panic!("{other:?}"),
    }
    assert!(l.unlocked.is_empty());
}

#[test]
fn an_unlock_that_fails_stops_the_rounds() {
    let mut l = Scripted::new(vec![vec![Locked, GaveUp]]);
    l.unlock_fails = true;
    match lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(7)) {
        Err(RoundsError::Unlock { failures, .. }) => assert_eq!(failures, vec![(1, "no".into())]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_time_for_a_round_is_said() {
    let mut l = Scripted::new(vec![vec![Locked, Locked]]);
    assert!(matches!(
        lock_in_rounds(&mut l, &[1, 2], budget(10), &mut Jitter::seeded(8)),
        Err(RoundsError::NoTime { .. })
    ));
    assert!(l.limits.is_empty());
}

#[test]
fn pauses_stay_within_their_bound_and_vary() {
    let mut j = Jitter::seeded(9);
    let pauses: Vec<Duration> = (0..200).map(|_| j.up_to(PAUSE)).collect();
    assert!(pauses.iter().all(|p| *p <= PAUSE));
    let distinct: std::collections::BTreeSet<_> = pauses.iter().collect();
    assert!(distinct.len() > 40, "{distinct:?}");
}

#[test]
fn who_is_locked_in_rounds() {
    assert!(Rounds::Auto.wanted(2, 2));
    assert!(
        !Rounds::Auto.wanted(2, 1),
        "one rank alone waits for nobody"
    );
    assert!(!Rounds::Auto.wanted(1, 1));
    assert!(Rounds::On.wanted(2, 0));
    assert!(!Rounds::Off.wanted(8, 8));
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "limits {:?}", self.limits)
    }
}
