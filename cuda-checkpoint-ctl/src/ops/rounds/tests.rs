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
fn the_locked_are_unlocked_after_a_failed_round_and_the_limit_grows() {
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
        vec![FIRST, FIRST * 3 / 2, FIRST * 9 / 4],
        "each failed round half as long again"
    );
    assert_eq!(r.longest, FIRST * 9 / 4);
}

#[test]
fn a_round_in_which_nothing_locked_doubles_the_limit() {
    let mut l = Scripted::new(vec![vec![GaveUp, GaveUp], vec![Locked, Locked]]);
    lock_in_rounds(&mut l, &[1, 2], budget(8000), &mut Jitter::seeded(3)).unwrap();
    assert_eq!(l.limits, vec![FIRST, FIRST * 2]);
    assert_eq!(l.unlocked, vec![Vec::<i32>::new()]);
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
        RoundsError::GaveUp { report, last } => {
            assert_eq!(report.rounds as usize, l.limits.len());
            assert_eq!(last, vec![(1, Locked), (2, GaveUp)]);
            // The last round was not cut short by the schedule: it had the rest of the time.
            let last_limit = *l.limits.last().unwrap();
            let scheduled = l.limits[l.limits.len() - 2] * 3 / 2;
            assert!(
                last_limit >= scheduled.min(Duration::from_millis(100)),
                "{l:?}"
            );
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
    assert_eq!(Rounds::parse("OFF"), Some(Rounds::Off));
    assert_eq!(Rounds::parse("1"), Some(Rounds::On));
    assert_eq!(Rounds::parse("sometimes"), None);
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "limits {:?}", self.limits)
    }
}
