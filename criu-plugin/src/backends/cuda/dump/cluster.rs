//! The lock rounds of a job across machines (`criu-gpu dump --nnodes`): each round's outcome on
//! this node goes to this node's `criu-gpu` over the unix socket `CRIU_GPU_CLUSTER` names; it
//! shares it with the other nodes through etcd and answers with the next step, which every node
//! gets alike (`criu_gpu_image::cluster`). No etcd inside CRIU: a line of JSON each way.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use criu_gpu_image::cluster::{Answer, Counted, Report};
use cuda_checkpoint_ctl::ops::rounds::{Next, Outcome, Schedule};

/// Past the time left for locking, `criu-gpu` has answered (its own waits are bounded by it).
const SLACK: Duration = Duration::from_secs(5);

/// The rounds' schedule, decided with the other nodes.
pub(super) struct Cluster {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    deadline: Instant,
    round: u32,
}

impl Cluster {
    pub(super) fn connect(socket: &Path, deadline: Instant) -> Result<Cluster, String> {
        let writer = UnixStream::connect(socket).map_err(|e| {
            format!(
                "this node's criu-gpu ({}) cannot be reached: {e}",
                socket.display()
            )
        })?;
        let reader = BufReader::new(writer.try_clone().map_err(|e| e.to_string())?);
        Ok(Cluster {
            reader,
            writer,
            deadline,
            round: 0,
        })
    }

    fn ask(&mut self, report: &Report) -> Result<Answer, String> {
        let mut line = serde_json::to_string(report).map_err(|e| e.to_string())?;
        line.push('\n');
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.writer
            .set_read_timeout(Some(left + SLACK))
            .map_err(|e| e.to_string())?;
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("this node's criu-gpu went away: {e}"))?;
        let mut answer = String::new();
        match self.reader.read_line(&mut answer) {
            Ok(0) => Err("this node's criu-gpu went away".into()),
            Ok(_) => serde_json::from_str(&answer)
                .map_err(|e| format!("this node's criu-gpu answered {answer:?}: {e}")),
            Err(e) => Err(format!(
                "this node's criu-gpu did not answer within {} s: {e}",
                (left + SLACK).as_secs()
            )),
        }
    }
}

impl Schedule for Cluster {
    type Error = String;

    fn next(&mut self, last: Option<&Outcome>) -> Result<Next, String> {
        let report = Report {
            round: self.round,
            left_ms: self
                .deadline
                .saturating_duration_since(Instant::now())
                .as_millis() as u64,
            outcome: last.map(Counted::from),
        };
        let answer = self.ask(&report)?;
        if matches!(answer, Answer::Lock { .. }) {
            self.round += 1;
        }
        tracing::debug!("lock round {} across nodes: {answer:?}", self.round);
        Ok(answer.into())
    }
}
