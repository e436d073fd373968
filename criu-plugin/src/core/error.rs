//! A failed hook, as a typed cause. Its `Display` is the operator's message: what went wrong,
//! what state things were left in, and what to do.

use criu_gpu_host::settings::SettingsError;
use criu_gpu_image::digest::DigestError;
use criu_gpu_image::record::RecordError;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Settings(#[from] SettingsError),
    #[error("{0}")]
    Record(#[from] RecordError),
    #[error("{0}")]
    Digest(#[from] DigestError),
    /// A restore on other addresses that cannot run.
    #[error("{0}")]
    Addresses(#[from] super::inet::AddressError),
    /// A backend's own typed error.
    #[error("{0}")]
    Gpu(Box<dyn std::error::Error + Send + Sync>),
    /// A backend's message (the AMD backend reports its library's errors as text).
    #[error("{0}")]
    Backend(String),
    /// The backend that failed, for the log.
    #[error("{backend}: {source}")]
    In {
        backend: &'static str,
        source: Box<HookError>,
    },
}

impl HookError {
    pub fn gpu(e: impl std::error::Error + Send + Sync + 'static) -> HookError {
        HookError::Gpu(Box::new(e))
    }

    /// The backend's own typed error inside, if it is an `E`: what callers and tests match
    /// on (the text is for operators, and each wording is tested once, beside its enum).
    pub fn gpu_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            // Shared when one failure answers the hooks of several processes.
            HookError::Gpu(e) => e
                .downcast_ref::<E>()
                .or_else(|| e.downcast_ref::<std::sync::Arc<E>>().map(|a| &**a)),
            HookError::In { source, .. } => source.gpu_error(),
            _ => None,
        }
    }

    /// Names the backend, once.
    pub fn in_backend(self, backend: &'static str) -> HookError {
        match self {
            e @ HookError::In { .. } => e,
            e => HookError::In {
                backend,
                source: Box::new(e),
            },
        }
    }
}
