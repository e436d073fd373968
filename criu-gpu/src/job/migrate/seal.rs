//! The plugin records digests of the image files at the end of a dump, which for a move comes
//! after the receiver has restored: so at post-dump, once CRIU wrote every image and before
//! they leave, the sender records them itself, and the receiver's plugin checks the files it got
//! (the pages themselves come over CRIU's page connection, checked by TCP only).

use std::path::Path;

use criu_gpu_image::cuda::{self, CudaImage};
use criu_gpu_image::{digest, record};

/// Adds digests of the image files in `dir` to its CUDA record (none: nothing to do).
pub fn digests(dir: &Path) -> Result<(), String> {
    let read = record::read::<CudaImage>(dir, cuda::RECORD, cuda::FORMAT, cuda::VERSION);
    let mut img = match read {
        Ok(Some(img)) => img,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let names = digest::image_files(dir).map_err(|e| e.to_string())?;
    img.digests = digest::digest(dir, &names).map_err(|e| e.to_string())?;
    record::write(dir, cuda::RECORD, cuda::FORMAT, cuda::VERSION, &img).map_err(|e| e.to_string())
}
