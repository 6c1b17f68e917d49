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
  - the parts of PROT_NONE reservations (JVM heaps, ...) that are committed later;
  - small blocks of threads other than the main one (uswap arenas instead of glibc's).
Not under uswap: the main thread's small allocations, shared mappings, file mappings,
stacks; statically linked or setuid programs (LD_PRELOAD does not apply) and Go
programs (raw system calls): uswap run says so at start. Each process has its own
pool and budget.

Exit status: PROGRAM's own (128+N when killed by signal N), 2 for bad options,
126/127 when PROGRAM cannot be executed / is not found. With --against: 0, or 1 when
the uswap side failed in a run (or on an error; a kernel side OOM-killed is counted, not
a failure).

Examples:
  uswap run --budget 2G --stats -- python3 big.py
  uswap run --budget 1G --tier compressed+file -- ./server    (compressed RAM before disk)
  uswap run --budget 1G --tier remote --remote redis://10.0.0.5:7000 -- ./solver
  uswap run --budget 512M --unit 2m --stats=/tmp/stats.json -- ./solver input
  sudo uswap run --against kernel --budget 256M --repeat 3 -- node bufs.js
      the same program timed under kernel swap (swap file, --against-swap 4G by
      default) and under uswap, each in a memcg of budget + 64 MiB (docs/run.md)
  sudo uswap run --against zswap --budget 512M --direct --json -- python numpy_4x.py
      --direct: the program uses uswap itself and reads USWAP_AGAINST_SIDE";

/// PROGRAM as exec will find it: a path, or the first match in $PATH.
pub(crate) fn resolve(program: &std::ffi::OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// Why uswap cannot serve this executable, if it cannot; and whether the preload must
/// stay out of it (a dynamically linked Go program, which it could harm).
pub(crate) fn why_not_served(path: &Path) -> Option<(String, bool)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::{Endianness, Object};
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    let mode = meta.permissions().mode();
    if mode & 0o6000 != 0 {
        let bit = if mode & 0o4000 != 0 {
            "setuid"
        } else {
            "setgid"
        };
        return Some((
            format!("it is {bit}, and the dynamic loader ignores LD_PRELOAD for {bit} programs"),
            false,
        ));
    }
    let data = std::fs::read(path).ok()?;
    let elf = ElfFile64::<Endianness>::parse(&*data).ok()?;
    let go = elf.section_by_name(".note.go.buildid").is_some()
        || elf.section_by_name(".go.buildinfo").is_some();
    let dynamic = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(elf.endian()) == object::elf::PT_INTERP);
    match (go, dynamic) {
        (true, _) => Some((
            "it is a Go program: the Go runtime maps and releases its heap with raw system \
             calls, which uswap cannot see"
                .into(),
            dynamic,
        )),
        (false, false) => Some((
            "it is statically linked, so LD_PRELOAD cannot load uswap into it".into(),
            false,
        )),
        (false, true) => None,
    }
}

/// Get the preload library and check the settings (a pool is started and stopped), or
/// say why not on stderr and give the exit status.
pub(crate) fn check(args: &RunArgs) -> Result<(PathBuf, u64), i32> {
    if let Err(e) = args.tiers.check() {
        eprintln!("uswap run: error: {e}");
        return Err(2);
    }
    let preload = match crate::preload::library() {
        Ok(lib) => lib.path,
        Err(e) => {
            eprintln!("uswap run: error: {e}");
            return Err(2);
        }
    };
    // Check the settings here, where an error can stop the run, rather than in the
    // program, where the preload library could only go on without uswap.
    let budget = if args.fill_memcg {
        // The program runs in this process's cgroup: its limit is the program's.
        match uswap::memcg::limit() {
            Some(l) => l,
            None => {
                eprintln!(
                    "uswap run: error: --fill-memcg: this process's memory cgroup has no \
                     limit below the machine's RAM; run it in a limited cgroup (a container, \
                     or `systemd-run -p MemoryMax=2G ...`) or give --budget"
                );
                return Err(2);
            }
        }
    } else {
        args.place.budget
    };
    let b = pool_builder(
        budget,
        &args.tiers,
        args.place.encrypt,
        args.place.swap_file.as_deref(),
        args.place.max_swap,
    );
    let keep_free = match b.build() {
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
            // Every process of the run keeps this much free, so that together they
            // stay within one --max-swap (each process starts its own pool).
            pool.swap_keep_free()
        }
        Err(e) => {
            eprintln!("uswap run: error: {e}");
            return Err(crate::bench::exit_status(&e));
        }
    };
    Ok((preload, keep_free))
}

/// The pool each process of a run starts with these settings (`uswap doctor` starts
/// one too, to check them).
pub(crate) fn pool_builder(
    budget: u64,
    tiers: &crate::tier::TierArgs,
    encrypt: bool,
    swap_file: Option<&Path>,
    max_swap: Option<uswap::MaxSwap>,
) -> uswap::PoolBuilder {
    let mut b = tiers
        .apply(uswap::Pool::builder().budget(budget))
        .encrypt(encrypt);
    if let Some(p) = swap_file {
        b = b.swap_file(p);
    }
    if let Some(m) = max_swap {
        b = b.max_swap(m);
    }
    b
}

/// `uswap run`'s arguments for the same settings and PROGRAM (the uswap side of
/// `--against`).
pub(crate) fn child_args(args: &RunArgs, budget: u64) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        "run".into(),
        "--budget".into(),
        budget.to_string().into(),
        "--unit".into(),
        args.unit.name().into(),
        "--threshold".into(),
        args.threshold.to_string().into(),
    ];
    if let Some(p) = &args.place.swap_file {
        v.push("--swap-file".into());
        v.push(p.clone().into_os_string());
    }
    if let Some(m) = args.place.max_swap {
        v.push("--max-swap".into());
        v.push(m.to_string().into());
    }
    v.extend(args.tiers.to_cli_args().into_iter().map(OsString::from));
    if args.place.encrypt {
        v.push("--encrypt".into());
    }
    match &args.stats {
        None => {}
        Some(None) => v.push("--stats".into()),
        Some(Some(f)) => {
            let mut a = OsString::from("--stats=");
            a.push(f);
            v.push(a);
        }
    }
    v.push("--".into());
    v.extend(args.program.iter().cloned());
    v
}

pub fn main(args: RunArgs) -> i32 {
    let (preload, keep_free) = match check(&args) {
        Ok(p) => p,
        Err(code) => return code,
    };
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
    let resolved = resolve(program);
    let not_served = resolved.as_deref().and_then(why_not_served);
    if let Some((why, _)) = &not_served {
        eprintln!(
            "uswap run: {} runs WITHOUT uswap (no budget applies to it): {why}",
            Path::new(program).display()
        );
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", ld_preload)
        .env(
            "USWAP_BUDGET",
            match args.fill_memcg {
                true => "auto".to_string(),
                false => args.place.budget.to_string(),
            },
        )
        .env("USWAP_UNIT", args.unit.name())
        .env("USWAP_THRESHOLD", args.threshold.to_string())
        .env(
            "USWAP_ENCRYPT",
            if args.place.encrypt { "on" } else { "off" },
        )
        .env("USWAP_KEEP_FREE", keep_free.to_string())
        .envs(args.tiers.env())
        .env("USWAP_ROOT_PID", std::process::id().to_string());
    // tcmalloc grows its heap with sbrk first, and the brk heap is no mapping the
    // preload can place under uswap; with this it maps it (its own documented switch).
    if std::env::var_os("TCMALLOC_SKIP_SBRK").is_none() {
        cmd.env("TCMALLOC_SKIP_SBRK", "true");
    }
    // The preload stays out of an executable it could harm (its children still run
    // under uswap).
    match (
        &not_served,
        resolved.as_ref().and_then(|p| p.canonicalize().ok()),
    ) {
        (Some((_, true)), Some(exe)) => cmd.env("USWAP_SKIP_EXE", exe),
        _ => cmd.env_remove("USWAP_SKIP_EXE"),
    };
    match &args.place.swap_file {
        Some(p) => cmd.env("USWAP_SWAP_FILE", p),
        None => cmd.env_remove("USWAP_SWAP_FILE"),
    };
    match args.place.max_swap {
        Some(m) => cmd.env("USWAP_MAX_SWAP", m.to_string()),
        None => cmd.env_remove("USWAP_MAX_SWAP"),
    };
    match stats {
        Some(s) => cmd.env("USWAP_STATS", s),
        None => cmd.env_remove("USWAP_STATS"),
    };
    if let Some(addr) = args.metrics {
        if let Err(e) = crate::live::start_run_exporter(addr) {
            eprintln!("uswap run: error: {e}");
            return 2;
        }
    }
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
