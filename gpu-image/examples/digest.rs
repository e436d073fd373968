//! Times the image digests the plugin takes at the end of a dump and checks before a restore:
//! `cargo run --release -p criu-gpu-image --example digest -- DIR` hashes DIR's `*.img` files
//! (scripts/gpu/bench-digest.sh makes an 8 GiB one and compares with a plain read of it).

use std::time::Instant;

use criu_gpu_image::digest;

fn main() {
    let dir = std::env::args().nth(1).expect("usage: digest DIR");
    let dir = std::path::Path::new(&dir);
    let names = digest::image_files(dir).expect("read the directory");
    let start = Instant::now();
    let digests = digest::digest(dir, &names).expect("hash the files");
    let took = start.elapsed().as_secs_f64();
    let bytes: u64 = digests.iter().map(|d| d.size).sum();
    println!(
        "digest: {} files, {:.2} GiB in {took:.3} s ({:.2} GB/s)",
        digests.len(),
        bytes as f64 / (1u64 << 30) as f64,
        bytes as f64 / 1e9 / took
    );
    let start = Instant::now();
    digest::verify(dir, &digests).expect("verify");
    println!("verify: {:.3} s", start.elapsed().as_secs_f64());
}
