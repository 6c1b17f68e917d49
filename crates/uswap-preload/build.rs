// Bind every symbol of the library at load (-z now): an engine thread must never run
// the dynamic linker's lazy lookup, which walks link maps that a program thread's
// dlopen may have allocated (see `lib.rs`, "Engine threads and the program's memory").
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}
