//! Numbers and times as people read them.

pub use criu_gpu_node::human::rfc3339;
pub use process_facts::units::{bytes, gbps};
