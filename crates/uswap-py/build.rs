//! With the `bundle-preload` feature (turned on by maturin, python/pyproject.toml):
//! build `libuswap_preload.so` (crates/uswap-preload) and hand its path to the crate,
//! which embeds it, so that `python -m uswap run` works from the installed wheel alone.
//! The build, or `USWAP_PRELOAD_SO=PATH` for a library built already, is the same as
//! the `uswap` binary's (crates/uswap-preload/embedded.rs).

#[path = "../uswap-preload/embedded.rs"]
mod embedded;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BUNDLE_PRELOAD").is_none() {
        return;
    }
    let lib = embedded::preload_library();
    println!("cargo:rustc-env=USWAP_PRELOAD_SO={}", lib.display());
}
