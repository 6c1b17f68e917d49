//! The tier options of `uswap bench` and `uswap run` (`--tier`, `--compressor`,
//! `--compressed-max`, `--remote`): parsed and checked once here, then put on a pool
//! builder, on a child's command line, or in the preload library's environment.

use clap::{Args, ValueEnum};

/// Where swapped pages go (`uswap::TierKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    /// The swap file (or block device) only: the default; pick it for data that does not
    /// compress, or when RAM is the scarce thing.
    File,
    /// Compressed RAM only, charged to the budget (zram's place): no disk at all; what
    /// does not compress, or does not fit, stays resident over the budget (said once).
    Compressed,
    /// Compressed RAM in front of the swap file (zswap's place): compressible pages stay
    /// in RAM, the rest and the pool's oldest entries go to the file.
    #[value(name = "compressed+file")]
    CompressedFile,
    /// Other machines' RAM on a Redis Cluster (needs --remote): no local disk; pick it
    /// when the network is faster than the disk.
    Remote,
    /// Compressed RAM in front of the Redis Cluster (needs --remote).
    #[value(name = "compressed+remote")]
    CompressedRemote,
}

impl Tier {
    /// The engine's tier.
    pub fn kind(self) -> uswap::TierKind {
        match self {
            Tier::File => uswap::TierKind::File,
            Tier::Compressed => uswap::TierKind::Compressed,
            Tier::CompressedFile => uswap::TierKind::CompressedFile,
            Tier::Remote => uswap::TierKind::Remote,
            Tier::CompressedRemote => uswap::TierKind::CompressedRemote,
        }
    }

    /// The name on the command line (the engine's name).
    pub fn name(self) -> &'static str {
        self.kind().name()
    }
}

/// What the compressed pool does with a page that compresses poorly, where a tier is
/// behind it (`--incompressible`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Incompressible {
    /// Stored in the pool as it is, uncompressed (zswap since Linux 6.18): a fault on it
    /// costs a copy from RAM; it goes on to the tier behind with writeback.
    Store,
    /// Passed straight to the tier behind the pool (zswap before 6.18).
    Pass,
}

impl Incompressible {
    /// The name on the command line and in `USWAP_INCOMPRESSIBLE`.
    pub fn name(self) -> &'static str {
        match self {
            Incompressible::Store => "store",
            Incompressible::Pass => "pass",
        }
    }
}

/// Parse `--compressor`: `lz4`, `lz4:ACCELERATION`, `zstd` or `zstd:LEVEL`.
fn parse_compressor(s: &str) -> Result<uswap::Compressor, String> {
    s.parse()
}

/// Tier options, shared by `uswap bench` and `uswap run`.
#[derive(Debug, Clone, Args)]
pub struct TierArgs {
    /// Where swapped pages go [default: file]:
    ///   file               the swap file only (data that does not compress)
    ///   compressed         compressed RAM only, inside the budget, no disk (zram's place)
    ///   compressed+file    compressed RAM in front of the swap file (zswap's place;
    ///                      with --unit 2m, units go to the file still compressed)
    ///   remote             a Redis Cluster's RAM, no local disk (needs --remote)
    ///   compressed+remote  compressed RAM in front of the Redis Cluster (needs --remote)
    #[arg(long, value_enum, value_name = "TIER", default_value_t = Tier::File,
          hide_default_value = true, hide_possible_values = true, verbatim_doc_comment)]
    pub tier: Tier,

    /// Compressor of the compressed tiers: lz4 (fast), lz4:ACCELERATION (2-64: faster to
    /// compress, less small; lz4:8 compresses ~1.3x as fast at ~13% more bytes), zstd
    /// (level 1: smaller) or zstd:LEVEL [default: lz4].
    #[arg(long, value_name = "NAME", value_parser = parse_compressor)]
    pub compressor: Option<uswap::Compressor>,

    /// The compressed pool's share of the budget in percent, 1-90, like zswap's
    /// max_pool_percent: past it the oldest entries go on to the file or the cluster
    /// (new ones are refused with --tier compressed) [default: 90 with a tier behind
    /// the pool, where what the budget holds as pool beats what it holds resident
    /// (pmbench at equal memory: 1.10x 80%); 50 with --tier compressed, where the rest
    /// is what stays resident].
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=90))]
    pub compressed_max: Option<u32>,

    /// Pages that compress poorly (over 80%), with compressed+file or compressed+remote:
    /// store (default) keeps them in the pool as they are while it is under its share
    /// (zswap since Linux 6.18), so that a fault on one is a copy from RAM instead of a
    /// read; pass sends them straight on to the file or the cluster (zswap before).
    /// Either way each takes a page of the budget while in RAM. Store pays where the
    /// pool has room (the default share, pmbench at equal memory: 1.33x pass); with a
    /// small share that the pool fills it costs compressed pages their place (50%: 0.92x).
    #[arg(long, value_enum, value_name = "WHAT")]
    pub incompressible: Option<Incompressible>,

    /// The Redis Cluster of the remote tiers: redis://HOST:PORT[,HOST:PORT...] (a few
    /// nodes as seeds; rediss:// for TLS, redis://USER:PASSWORD@HOST:PORT for AUTH).
    #[arg(long, value_name = "URLS")]
    pub remote: Option<String>,
}

impl TierArgs {
    /// Combinations clap cannot see: a remote tier without `--remote`, and settings
    /// given for a tier that would ignore them.
    pub fn check(&self) -> Result<(), String> {
        let kind = self.tier.kind();
        match (&self.remote, kind.is_remote()) {
            (None, true) => {
                return Err(format!(
                    "--tier {} needs --remote redis://HOST:PORT[,HOST:PORT...] (the Redis \
                     Cluster to page to)",
                    self.tier.name()
                ))
            }
            (Some(_), false) => {
                return Err(format!(
                    "--remote is for the remote tiers: add --tier remote or --tier \
                     compressed+remote (the tier is {})",
                    self.tier.name()
                ))
            }
            (Some(r), true) if r.trim().is_empty() => {
                return Err("--remote is empty: give redis://HOST:PORT[,HOST:PORT...]".into())
            }
            _ => {}
        }
        if self.incompressible.is_some()
            && !matches!(
                kind,
                uswap::TierKind::CompressedFile | uswap::TierKind::CompressedRemote
            )
        {
            return Err(format!(
                "--incompressible is for a compressed pool with a tier behind it: add \
                 --tier compressed+file or compressed+remote (the tier is {}{})",
                self.tier.name(),
                if kind == uswap::TierKind::Compressed {
                    ", where such pages stay resident"
                } else {
                    ""
                }
            ));
        }
        if !kind.is_compressed() {
            for (given, opt) in [
                (self.compressor.is_some(), "--compressor"),
                (self.compressed_max.is_some(), "--compressed-max"),
            ] {
                if given {
                    return Err(format!(
                        "{opt} is for the compressed tiers: add --tier compressed, \
                         compressed+file or compressed+remote (the tier is {})",
                        self.tier.name()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The compressor in use (the engine's default when not given).
    pub fn compressor(&self) -> uswap::Compressor {
        self.compressor.unwrap_or(uswap::Compressor::Lz4)
    }

    /// The compressed pool's share in use, percent (the engine's default for the tier
    /// when not given).
    pub fn compressed_max(&self) -> u32 {
        self.compressed_max
            .unwrap_or(self.tier.kind().default_compressed_max_percent())
    }

    /// What becomes of pages that compress poorly (the engine's default when not given:
    /// stored where a tier is behind the pool; with none they stay resident).
    pub fn incompressible(&self) -> Incompressible {
        self.incompressible
            .unwrap_or(if self.tier.kind().has_writeback() {
                Incompressible::Store
            } else {
                Incompressible::Pass
            })
    }

    /// The settings on a pool builder.
    pub fn apply(&self, b: uswap::PoolBuilder) -> uswap::PoolBuilder {
        let mut b = b
            .tier(self.tier.kind())
            .compressor(self.compressor())
            .compressed_max_percent(self.compressed_max())
            .store_incompressible(self.incompressible() == Incompressible::Store);
        if let Some(r) = &self.remote {
            b = b.remote(r.clone());
        }
        b
    }

    /// Options that reproduce the settings (only those given, so that the result passes
    /// [`TierArgs::check`] again).
    pub fn to_cli_args(&self) -> Vec<String> {
        let mut a = vec!["--tier".to_string(), self.tier.name().to_string()];
        if let Some(c) = self.compressor {
            a.extend(["--compressor".to_string(), c.to_string()]);
        }
        if let Some(p) = self.compressed_max {
            a.extend(["--compressed-max".to_string(), p.to_string()]);
        }
        if let Some(i) = self.incompressible {
            a.extend(["--incompressible".to_string(), i.name().to_string()]);
        }
        if let Some(r) = &self.remote {
            a.extend(["--remote".to_string(), r.clone()]);
        }
        a
    }

    /// The settings as the preload library reads them (`USWAP_TIER`, ...).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut e = vec![
            ("USWAP_TIER", self.tier.name().to_string()),
            ("USWAP_COMPRESSOR", self.compressor().to_string()),
            ("USWAP_COMPRESSED_MAX", self.compressed_max().to_string()),
            (
                "USWAP_INCOMPRESSIBLE",
                self.incompressible().name().to_string(),
            ),
        ];
        if let Some(r) = &self.remote {
            e.push(("USWAP_REMOTE", r.clone()));
        }
        e
    }
}

/// A `--remote` list for reports: each URL without its `USER:PASSWORD@`.
pub fn redacted(urls: &str) -> String {
    urls.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}{}", &u[..s + 3], &u[at + 1..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        t: TierArgs,
    }

    fn parse(args: &[&str]) -> Result<TierArgs, String> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.t.check()?;
        Ok(cli.t)
    }

    #[test]
    fn every_tier_parses_and_round_trips() {
        for t in Tier::value_variants() {
            let mut args = vec!["--tier", t.name()];
            if t.kind().is_compressed() {
                args.extend(["--compressor", "zstd:3", "--compressed-max", "30"]);
            }
            if matches!(t, Tier::CompressedFile | Tier::CompressedRemote) {
                args.extend(["--incompressible", "store"]);
            }
            if t.kind().is_remote() {
                args.extend(["--remote", "redis://127.0.0.1:7000"]);
            }
            let a = parse(&args).unwrap();
            assert_eq!(a.tier, *t);
            let again: Vec<String> = a.to_cli_args();
            let again: Vec<&str> = again.iter().map(String::as_str).collect();
            assert_eq!(again, args);
        }
        let a = parse(&[]).unwrap();
        assert_eq!(a.tier, Tier::File);
        assert_eq!(a.compressed_max(), 50);
        assert_eq!(a.compressor(), uswap::Compressor::Lz4);
        assert_eq!(a.incompressible(), Incompressible::Pass);
        let a = parse(&["--tier", "compressed"]).unwrap();
        assert_eq!(a.compressed_max(), 50);
        let a = parse(&["--tier", "compressed+file"]).unwrap();
        assert_eq!(a.compressed_max(), 90);
        assert_eq!(a.incompressible(), Incompressible::Store);
        assert!(a
            .env()
            .contains(&("USWAP_COMPRESSED_MAX", "90".to_string())));
        let env = parse(&["--tier", "compressed+file", "--incompressible", "store"])
            .unwrap()
            .env();
        assert!(
            env.contains(&("USWAP_INCOMPRESSIBLE", "store".to_string())),
            "{env:?}"
        );
    }

    #[test]
    fn reports_leave_passwords_out() {
        assert_eq!(
            redacted("redis://u:secret@10.0.0.1:7000,rediss://10.0.0.2:7000"),
            "redis://10.0.0.1:7000,rediss://10.0.0.2:7000"
        );
    }

    #[test]
    fn bad_combinations_are_refused_clearly() {
        let e = parse(&["--tier", "remote"]).unwrap_err();
        assert!(e.contains("needs --remote"), "{e}");
        let e = parse(&["--remote", "redis://127.0.0.1:1"]).unwrap_err();
        assert!(e.contains("--remote is for the remote tiers"), "{e}");
        let e = parse(&["--tier", "remote", "--remote", " "]).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = parse(&["--compressor", "zstd"]).unwrap_err();
        assert!(
            e.contains("--compressor is for the compressed tiers"),
            "{e}"
        );
        let e = parse(&[
            "--tier",
            "remote",
            "--remote",
            "redis://h:1",
            "--compressed-max",
            "9",
        ])
        .unwrap_err();
        assert!(e.contains("--compressed-max is for"), "{e}");
        let e = parse(&["--tier", "compressed", "--compressed-max", "95"]).unwrap_err();
        assert!(e.contains("95"), "{e}");
        let e = parse(&["--tier", "compressed", "--compressor", "gzip"]).unwrap_err();
        assert!(e.contains("unknown compressor"), "{e}");
        let e = parse(&["--tier", "compressed", "--incompressible", "store"]).unwrap_err();
        assert!(e.contains("stay resident"), "{e}");
        let e = parse(&["--incompressible", "pass"]).unwrap_err();
        assert!(e.contains("--incompressible is for"), "{e}");
        let e = parse(&["--tier", "compressed+file", "--incompressible", "keep"]).unwrap_err();
        assert!(e.contains("keep"), "{e}");
        let e = parse(&["--tier", "ssd"]).unwrap_err();
        assert!(e.contains("ssd"), "{e}");
    }
}
