//! Builds `libuswap_preload.so` (crates/uswap-preload) and hands its path to the crate,
//! which embeds it (`preload.rs`), so that the `uswap` binary alone, installed by
//! `cargo install --path crates/uswap-cli`, runs programs under uswap.

#[path = "../uswap-preload/embedded.rs"]
mod embedded;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let lib = embedded::preload_library();
    println!("cargo:rustc-env=USWAP_PRELOAD_SO={}", lib.display());
}
