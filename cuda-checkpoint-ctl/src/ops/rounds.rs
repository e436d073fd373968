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
//! The rounds never outlast the caller's deadline (CRIU's seize time): the last round takes what
//! is left. A round's limit grows by half each time, and doubles when no process locked at all
//! (work longer than the limit, not a deadlock).

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

impl Rounds {
    pub fn parse(s: &str) -> Option<Rounds> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Rounds::Auto),
            "1" | "on" | "yes" | "true" => Some(Rounds::On),
            "0" | "off" | "no" | "false" => Some(Rounds::Off),
            _ => None,
        }
    }

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
    /// Less time left than a round needs.
    NoTime {
        left: Duration,
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

/// The limit of the next round after one of `limit` in which `locked` processes locked.
fn next_limit(limit: Duration, locked: usize) -> Duration {
    if locked == 0 {
        limit * 2
    } else {
        limit * 3 / 2
    }
}

/// Locks every process of `pids` in rounds (see the module's text).
pub fn lock_in_rounds<L: Locker>(
    locker: &mut L,
    pids: &[i32],
    deadline: Instant,
    jitter: &mut Jitter,
) -> Result<Report, RoundsError<L::Failure, L::Error>> {
    let start = Instant::now();
    let mut report = Report {
        rounds: 0,
        elapsed: Duration::ZERO,
        longest: Duration::ZERO,
    };
    let mut want = FIRST;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut limit = want.min(left);
        // No room for a round after this one: this one takes what is left.
        if left.saturating_sub(limit) < next_limit(limit, 1) + PAUSE {
            limit = left;
        }
        if limit < SHORTEST {
            return Err(RoundsError::NoTime { left });
        }
        report.rounds += 1;
        report.longest = report.longest.max(limit);
        let attempts = locker.lock_all(pids, limit).map_err(RoundsError::Locker)?;
        report.elapsed = start.elapsed();
        let last: Vec<(i32, Attempt<L::Failure>)> = pids.iter().copied().zip(attempts).collect();
        let locked: Vec<i32> = last
            .iter()
            .filter(|(_, a)| matches!(a, Attempt::Locked))
            .map(|(p, _)| *p)
            .collect();
        if locked.len() == pids.len() {
            return Ok(report);
        }
        if last.iter().any(|(_, a)| matches!(a, Attempt::Failed(_))) {
            return Err(RoundsError::Failed { report, last });
        }
        let failures = locker.unlock_all(&locked).map_err(RoundsError::Locker)?;
        if !failures.is_empty() {
            return Err(RoundsError::Unlock { report, failures });
        }
        let waited: Vec<i32> = last
            .iter()
            .filter(|(_, a)| matches!(a, Attempt::GaveUp))
            .map(|(p, _)| *p)
            .collect();
        let pause = jitter.up_to(PAUSE);
        tracing::debug!(
            "lock round {} ({} ms): {} of {} locked, the work of {:?} did not finish; unlocked, \
             next round in {} ms",
            report.rounds,
            limit.as_millis(),
            locked.len(),
            pids.len(),
            waited,
            pause.as_millis()
        );
        let after = deadline.saturating_duration_since(Instant::now() + pause);
        if after < SHORTEST {
            report.elapsed = start.elapsed();
            return Err(RoundsError::GaveUp { report, last });
        }
        std::thread::sleep(pause);
        want = next_limit(limit, locked.len());
    }
}

#[cfg(test)]
mod tests;
