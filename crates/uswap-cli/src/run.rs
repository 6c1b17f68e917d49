//! `uswap run`: exec a program with `libuswap_preload.so` preloaded, so that its large
//! anonymous memory is paged by uswap under the budget (docs/run.md).

use crate::RunArgs;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

pub const HELP: &str = "\
What goes under uswap (in PROGRAM and in every process it starts):
  - malloc/calloc/realloc/memalign blocks of at least --threshold bytes;
  - mmap of anonymous private read-write memory of at least --threshold bytes, and
    private mappings of /dev/zero;
  munmap, mremap, madvise(DONTNEED/FREE/REMOVE) and mprotect on that memory behave
  as on ordinary memory; fork gives the child its own copy-on-write view.
Not under uswap: smaller allocations, shared mappings, file mappings, stacks,
PROT_NONE reservations, statically linked or setuid programs (LD_PRELOAD does not
apply). Each process has its own pool and budget.

Exit status: PROGRAM's own (128+N when killed by signal N), 2 for bad options,
126/127 when PROGRAM cannot be executed / is not found.

Examples:
  uswap run --budget 2G --stats -- python3 big.py
  uswap run --budget 512M --unit 2m --stats=/tmp/stats.json -- ./solver input";

/// Where `libuswap_preload.so` is: $USWAP_PRELOAD, next to this executable, or in
/// ../lib relative to it.
fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("USWAP_PRELOAD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("USWAP_PRELOAD={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let tries = [
        dir.join("libuswap_preload.so"),
        dir.join("../lib/libuswap_preload.so"),
        dir.join("../lib/uswap/libuswap_preload.so"),
    ];
    for t in &tries {
        if t.is_file() {
            return Ok(t.canonicalize().unwrap_or_else(|_| t.clone()));
        }
    }
    Err(format!(
        "libuswap_preload.so not found (looked in {} and {}; build it with \
         `cargo build --release -p uswap-preload`, or set USWAP_PRELOAD)",
        dir.display(),
        dir.join("../lib").display()
    ))
}

pub fn main(args: RunArgs) -> i32 {
    let preload = match find_preload() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("uswap run: error: {e}");
            return 2;
        }
    };
    // Check the settings here, where an error can stop the run, rather than in the
    // program, where the preload library could only go on without uswap.
    let mut b = uswap::Pool::builder().budget(args.budget);
    if let Some(p) = &args.swap_file {
        b = b.swap_file(p);
    }
    match b.build() {
        Ok(pool) => {
            // Each process makes its own pool in the same place: say where, when asked
            // for figures on stderr (each stats line says it too), and always when it is
            // compressed RAM.
            if matches!(args.stats, Some(None)) {
                eprintln!("uswap run: swap: {}", pool.swap_place());
            }
            if let Some(z) = pool.swap_zram() {
                eprintln!("{}", crate::memory::zram_note(&z));
            }
        }
        Err(e) => {
            eprintln!("uswap run: error: {e}");
            return crate::bench::exit_status(&e);
        }
    }
    let stats = match &args.stats {
        None => None,
        Some(None) => Some(OsString::from("-")),
        Some(Some(path)) => {
            // One line per process that used uswap is appended; start empty.
            if let Err(e) = std::fs::File::create(path) {
                eprintln!(
                    "uswap run: error: cannot create stats file {}: {e}",
                    path.display()
                );
                return 2;
            }
            Some(
                path.canonicalize()
                    .unwrap_or_else(|_| path.clone())
                    .into_os_string(),
            )
        }
    };
    let mut ld_preload = preload.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        ld_preload.push(":");
        ld_preload.push(old);
    }
    let (program, rest) = args.program.split_first().expect("clap requires PROGRAM");
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", ld_preload)
        .env("USWAP_BUDGET", args.budget.to_string())
        .env("USWAP_UNIT", args.unit.name())
        .env("USWAP_THRESHOLD", args.threshold.to_string())
        .env("USWAP_ROOT_PID", std::process::id().to_string());
    match &args.swap_file {
        Some(p) => cmd.env("USWAP_SWAP_FILE", p),
        None => cmd.env_remove("USWAP_SWAP_FILE"),
    };
    match stats {
        Some(s) => cmd.env("USWAP_STATS", s),
        None => cmd.env_remove("USWAP_STATS"),
    };
    // exec: on success this does not return; PROGRAM keeps our pid, stdio and signals.
    let err = cmd.exec();
    let shown = Path::new(program).display();
    match err.kind() {
        std::io::ErrorKind::NotFound => {
            eprintln!("uswap run: {shown}: command not found");
            127
        }
        _ => {
            eprintln!("uswap run: cannot execute {shown}: {err}");
            126
        }
    }
}
