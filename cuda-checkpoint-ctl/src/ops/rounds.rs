//! Locking CUDA processes that may wait for each other, in rounds.
//!
//! A rank of an NCCL job that is locked before it launched its part of a collective never
//! launches it: its peers' kernels wait in that collective, and their locks wait for those
//! kernels until they give up (docs/driver-facts.md, F18). Locks taken all at once succeed when
//! they catch every rank after it launched the same collectives; a job that trains flat out is at
//! such a point only part of the time (2 of 3 single locks of 28 s failed). So such processes
//! are locked in rounds: all at once, each lock with a short limit; when any gives up, the ones
//! that locked are unlocked again (their peers' kernels then finish), a short random pause breaks
//! the rhythm of the job, and another round starts with a longer limit. Measured on two H100s:
//! rounds of 500 ms locked both ranks of a job training flat out in 15 of 15 trials, after 1 to
//! 7 rounds (F18).
//!
//! A round in which some processes locked and others gave up caught the ranks at different
//! points of their collectives (rank skew): the locked ones hold the others' kernels, and no
//! longer limit helps. So after such a round the limit goes back to the first one, and the
//! rounds go on, short and at random offsets, until one catches every rank between the same
//! collectives. Only a round in which nothing locked means long GPU work: then the limit doubles.
//! If skew persists through half the time, the limit grows again (work that is long on one rank
//! alone, while the others wait idle, looks like skew). Measured on two H200s, a spawned job
//! training flat out failed 1 dump of 8 with the old schedule (limits growing by half after each
//! skewed round, the last round taking what was left): 8 rounds of 0.25 to 4.3 s and a last one
//! of 15.9 s, all skewed.
//!
//! The rounds never outlast the caller's deadline (CRIU's seize time). Their schedule
//! ([`Policy`]) depends only on the rounds' outcomes and the time left, so nodes that share the
//! outcomes (a job across machines, `criu-gpu dump --nnodes`) take the same decisions
//! ([`Schedule`], [`lock_in_rounds_with`]).

use std::time::{Duration, Instant};

/// The first round's limit: a step of a training job is usually shorter.
pub const FIRST: Duration = Duration::from_millis(250);
/// The longest random pause between two rounds (as measured, F18).
pub const PAUSE: Duration = Duration::from_millis(80);
/// A round shorter than this is not worth starting.
const SHORTEST: Duration = Duration::from_millis(50);

/// Whether a group of processes is locked in rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounds {
    /// When two or more NCCL ranks are locked together.
    #[default]
    Auto,
    /// Whenever two or more processes are locked together.
    On,
    /// One lock of every process at once, with all the time there is (the old way).
    Off,
}

impl std::str::FromStr for Rounds {
    type Err = String;

    /// `auto`, or a switch ([`process_facts::units::switch`]): on locks any group in rounds,
    /// off locks once.
    fn from_str(v: &str) -> Result<Rounds, String> {
        if v.trim().eq_ignore_ascii_case("auto") {
            return Ok(Rounds::Auto);
        }
        match process_facts::units::switch(v) {
            Some(true) => Ok(Rounds::On),
            Some(false) => Ok(Rounds::Off),
            None => Err(format!("auto, or {}", process_facts::units::SWITCH_WORDS)),
        }
    }
}

impl Rounds {
    /// Whether `running` processes, `ranks` of them NCCL ranks, are locked in rounds.
    pub fn wanted(self, running: usize, ranks: usize) -> bool {
        match self {
            Rounds::Auto => running >= 2 && ranks >= 2,
            Rounds::On => running >= 2,
            Rounds::Off => false,
        }
    }
}

/// One process's lock in a round.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt<F> {
    Locked,
    /// The driver gave up waiting for the process's work (it stays running).
    GaveUp,
    /// Anything else: the rounds stop.
    Failed(F),
}

/// How the caller locks and unlocks processes.
pub trait Locker {
    /// Why one process's lock or unlock failed.
    type Failure: Clone;
    /// Why the locker cannot go on at all.
    type Error;
    /// Locks every process of `pids` at once, each lock waiting at most `limit` for the
    /// process's work; the attempts in the order of `pids`.
    fn lock_all(
        &mut self,
        pids: &[i32],
        limit: Duration,
    ) -> Result<Vec<Attempt<Self::Failure>>, Self::Error>;
    /// Unlocks `pids`; the processes that could not be unlocked.
    fn unlock_all(&mut self, pids: &[i32]) -> Result<Vec<(i32, Self::Failure)>, Self::Error>;
}

/// What the rounds took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub rounds: u32,
    pub elapsed: Duration,
    /// The last round's limit, the longest any lock waited.
    pub longest: Duration,
}

#[derive(Debug)]
pub enum RoundsError<F, E> {
    /// No round locked every process; those that locked in the last round were unlocked again.
    /// The last round's attempts, in the order of the pids.
    GaveUp {
        report: Report,
        last: Vec<(i32, Attempt<F>)>,
        /// The schedule's reason (no time left; for a job across machines, another node's).
        why: String,
    },
    /// A lock failed otherwise: the rounds stopped, and the processes that locked in that round
    /// are still locked.
    Failed {
        report: Report,
        last: Vec<(i32, Attempt<F>)>,
    },
    /// Processes locked in a failed round could not be unlocked again.
    Unlock {
        report: Report,
        failures: Vec<(i32, F)>,
    },
    /// No round could start: less time left than a round needs, or the schedule said why.
    NoTime {
        why: String,
    },
    Locker(E),
}

/// A small random source for the pauses (xorshift64*), seeded from the clock and the pid: the
/// pauses only need to differ from one round and one dump to the next.
pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Jitter {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter::seeded(nanos ^ (std::process::id() as u64) << 32)
    }

    pub fn seeded(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }

    /// A duration in `[0, max]`.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let ms = max.as_millis() as u64;
        Duration::from_millis(r % (ms + 1))
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Jitter::new()
    }
}

/// What one round did, as the schedule sees it (for a job across machines: all nodes' rounds
/// added up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Its limit.
    pub limit: Duration,
    /// How many processes locked, of how many.
    pub locked: usize,
    pub of: usize,
    /// A lock failed otherwise than by giving up (the rounds stop).
    pub failed: bool,
}

impl Outcome {
    pub fn all_locked(&self) -> bool {
        self.locked == self.of && !self.failed
    }
}

/// What the schedule wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// (After unlocking what the last round locked:) pause, then a round of this limit.
    Lock { pause: Duration, limit: Duration },
    /// Every process is locked: done.
    Done,
    /// Give up: the reason, in the operator's words (no time left, another node failed).
    Stop(String),
}

/// The rounds' schedule: when to lock, with what limit, and when to give up.
pub trait Schedule {
    type Error;
    /// The first round (`last` is `None`), or what follows a round with outcome `last`.
    fn next(&mut self, last: Option<&Outcome>) -> Result<Next, Self::Error>;
}

/// The policy of the module's text, as a function of the outcomes and the time left: the same
/// inputs give the same decisions on every node.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The time there was when the rounds began.
    budget: Duration,
    /// The time the rounds have used (limits and pauses).
    used: Duration,
    /// The limit a round of long work gets next.
    want: Duration,
}

impl Policy {
    pub fn new(budget: Duration) -> Policy {
        Policy {
            budget,
            used: Duration::ZERO,
            want: FIRST,
        }
    }

    /// The first round, with `left` of the time.
    pub fn first(&mut self, left: Duration) -> Next {
        self.round(Duration::ZERO, left, true)
    }

    /// After a round with outcome `last`, with `left` of the time; `pause` is this round's
    /// random pause (up to [`PAUSE`]).
    pub fn after(&mut self, last: &Outcome, left: Duration, pause: Duration) -> Next {
        if last.all_locked() {
            return Next::Done;
        }
        self.used += last.limit + pause;
        let skewed = last.locked > 0;
        let long_work = !skewed || self.used * 2 > self.budget;
        self.want = match (skewed, long_work) {
            // Skew: short rounds at random offsets.
            (true, false) => FIRST,
            (false, _) => (last.limit * 2).max(FIRST),
            (true, true) => (last.limit * 3 / 2).max(FIRST),
        };
        let left = left.saturating_sub(pause);
        if left < SHORTEST {
            return Next::Stop(format!(
                "no time for another lock round ({} ms left)",
                left.as_millis()
            ));
        }
        match self.round(pause, left, !skewed || long_work) {
            Next::Stop(_) if !skewed => Next::Stop(format!(
                "no time for another lock round ({} ms left)",
                left.as_millis()
            )),
            next => next,
        }
    }

    /// The next round within `left`; when `grow_last`, a round with no room for another after it
    /// takes what is left (long work may need it; skew never does).
    fn round(&self, pause: Duration, left: Duration, grow_last: bool) -> Next {
        let mut limit = self.want.min(left);
        if grow_last && left.saturating_sub(limit) < limit * 3 / 2 + PAUSE {
            limit = left;
        }
        if limit < SHORTEST {
            return Next::Stop(format!(
                "no time for a lock round ({} ms left)",
                left.as_millis()
            ));
        }
        Next::Lock { pause, limit }
    }
}

/// One node's rounds: [`Policy`] against a deadline, with random pauses.
pub struct Local<'a> {
    policy: Policy,
    deadline: Instant,
    jitter: &'a mut Jitter,
}

impl<'a> Local<'a> {
    pub fn new(deadline: Instant, jitter: &'a mut Jitter) -> Local<'a> {
        let left = deadline.saturating_duration_since(Instant::now());
        Local {
            policy: Policy::new(left),
            deadline,
            jitter,
        }
    }
}

impl Schedule for Local<'_> {
    type Error = std::convert::Infallible;

    fn next(&mut self, last: Option<&Outcome>) -> Result<Next, Self::Error> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        Ok(match last {
            None => self.policy.first(left),
            Some(o) => {
                let pause = self.jitter.up_to(PAUSE);
                self.policy.after(o, left, pause)
            }
        })
    }
}

/// Locks every process of `pids` in rounds (see the module's text), on one node.
pub fn lock_in_rounds<L: Locker>(
    locker: &mut L,
    pids: &[i32],
    deadline: Instant,
    jitter: &mut Jitter,
) -> Result<Report, RoundsError<L::Failure, L::Error>> {
    let mut local = Local::new(deadline, jitter);
    lock_in_rounds_with(locker, pids, &mut local).map_err(|e| match e {
        Either::Rounds(e) => e,
        Either::Schedule(never) => match never {},
    })
}

/// An error of the rounds or of their schedule.
#[derive(Debug)]
pub enum Either<R, S> {
    Rounds(R),
    Schedule(S),
}

/// The error of [`lock_in_rounds_with`].
pub type WithError<L, S> =
    Either<RoundsError<<L as Locker>::Failure, <L as Locker>::Error>, <S as Schedule>::Error>;

/// A round's outcome and each process's attempt, in the order of the pids.
type Round<F> = (Outcome, Vec<(i32, Attempt<F>)>);
/// The rounds' own error for locker `L`.
type ErrorOf<L> = RoundsError<<L as Locker>::Failure, <L as Locker>::Error>;

/// Locks every process of `pids` in rounds as `schedule` decides. On success every process is
/// locked; on any error, those that locked in the last round are unlocked again, except after a
/// lock that failed otherwise than by giving up ([`RoundsError::Failed`]).
pub fn lock_in_rounds_with<L: Locker, S: Schedule>(
    locker: &mut L,
    pids: &[i32],
    schedule: &mut S,
) -> Result<Report, WithError<L, S>> {
    let start = Instant::now();
    let mut report = Report {
        rounds: 0,
        elapsed: Duration::ZERO,
        longest: Duration::ZERO,
    };
    let mut last: Option<Round<L::Failure>> = None;
    loop {
        let next = schedule.next(last.as_ref().map(|(o, _)| o));
        report.elapsed = start.elapsed();
        let locked: Vec<i32> = last.as_ref().map_or(Vec::new(), |(_, a)| locked_of(a));
        let (pause, limit) = match next {
            Ok(Next::Done) if locked.len() == pids.len() => return Ok(report),
            Ok(Next::Lock { pause, limit }) => (pause, limit),
            other => {
                unlock(locker, &locked, report).map_err(Either::Rounds)?;
                return Err(stopped::<L, S>(
                    other.map_err(Either::Schedule)?,
                    report,
                    last,
                ));
            }
        };
        unlock(locker, &locked, report).map_err(Either::Rounds)?;
        if let Some((o, _)) = &last {
            tracing::debug!(
                "lock round {} ({} ms): {} of {} locked here; unlocked, next round of {} ms in \
                 {} ms",
                report.rounds,
                o.limit.as_millis(),
                o.locked,
                o.of,
                limit.as_millis(),
                pause.as_millis()
            );
        }
        std::thread::sleep(pause);
        report.rounds += 1;
        report.longest = report.longest.max(limit);
        let round = lock_round(locker, pids, limit).map_err(Either::Rounds)?;
        report.elapsed = start.elapsed();
        if round.0.failed {
            // Told to the schedule (other nodes stop too), then the rounds stop here.
            let _ = schedule.next(Some(&round.0));
            return Err(Either::Rounds(RoundsError::Failed {
                report,
                last: round.1,
            }));
        }
        last = Some(round);
    }
}

/// One round: every process locked at once with `limit`.
fn lock_round<L: Locker>(
    locker: &mut L,
    pids: &[i32],
    limit: Duration,
) -> Result<Round<L::Failure>, ErrorOf<L>> {
    let attempts = locker.lock_all(pids, limit).map_err(RoundsError::Locker)?;
    let attempts: Vec<(i32, Attempt<L::Failure>)> = pids.iter().copied().zip(attempts).collect();
    let outcome = Outcome {
        limit,
        locked: locked_of(&attempts).len(),
        of: pids.len(),
        failed: attempts
            .iter()
            .any(|(_, a)| matches!(a, Attempt::Failed(_))),
    };
    Ok((outcome, attempts))
}

/// Unlocks what a round locked.
fn unlock<L: Locker>(locker: &mut L, locked: &[i32], report: Report) -> Result<(), ErrorOf<L>> {
    if locked.is_empty() {
        return Ok(());
    }
    let failures = locker.unlock_all(locked).map_err(RoundsError::Locker)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(RoundsError::Unlock { report, failures })
    }
}

/// The error when the schedule stopped the rounds (`next` is neither a round nor done with
/// everything locked).
fn stopped<L: Locker, S: Schedule>(
    next: Next,
    report: Report,
    last: Option<Round<L::Failure>>,
) -> WithError<L, S> {
    let why = match next {
        Next::Stop(why) => why,
        _ => "the schedule ended the rounds before every process locked".into(),
    };
    Either::Rounds(match last {
        Some((_, last)) => RoundsError::GaveUp { report, last, why },
        None => RoundsError::NoTime { why },
    })
}

fn locked_of<F>(attempts: &[(i32, Attempt<F>)]) -> Vec<i32> {
    attempts
        .iter()
        .filter(|(_, a)| matches!(a, Attempt::Locked))
        .map(|(p, _)| *p)
        .collect()
}

#[cfg(test)]
mod tests;
