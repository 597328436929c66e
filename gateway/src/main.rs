//! `flashgate`: run the gateway, mint a demo token, check a config file,
//! or operate a running stack through its admin APIs (`sale`, `cache`,
//! `events`: [`flashgate_gateway::cli`]).

// Product code: a panic is a bug. Handle the error, or `expect` with the
// invariant that makes it impossible (tests may unwrap: clippy.toml).
#![warn(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's allocator: the request path allocates many
/// small, short-lived buffers, and glibc malloc/free showed up as a fifth
/// of the gateway's profile when serving pages.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use flashgate_common::config::{Config, ENV_JWT_SECRET};
use flashgate_gateway::cli::{self, Operator};

#[derive(Parser)]
#[command(name = "flashgate", version, about = "Flash-sale edge gateway")]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, global = true, default_value = "config/flashgate.toml")]
    config: PathBuf,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Local(Local),
    #[command(flatten)]
    Operate(Operator),
}

/// The commands of this machine's gateway and config file.
#[derive(Subcommand)]
enum Local {
    /// Run the gateway (the default).
    Serve {
        /// Take over the listening sockets of a running gateway that was
        /// sent SIGQUIT (Pingora's graceful upgrade).
        #[arg(long)]
        upgrade: bool,
    },
    /// Mint a buyer token signed with the configured secret.
    Token {
        #[arg(long)]
        user: String,
        /// Lifetime, e.g. 90s, 30m, 1h, 2d.
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: u64,
    },
    /// Validate the configuration file and exit.
    Check {
        /// Also connect to Redis in the configured `redis.mode` and check
        /// that it answers as that mode expects (cluster state ok, the
        /// sentinels know the master, every script loads).
        #[arg(long)]
        connect: bool,
    },
}

fn parse_ttl(s: &str) -> Result<u64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 90s, 30m, 1h"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{s}`: unit must be s, m, h or d")),
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("`{s}` is out of range"))
}

/// `check`: the file is valid (it was loaded), the secrets the gateway
/// would refuse to start without are there, the TLS certificates load and
/// match their keys, `redis.ca_file` reads; with `connect`, Redis answers as its mode expects.
fn check(path: &std::path::Path, config: &Config, connect: bool) -> anyhow::Result<()> {
    if let Err(e) = config.required_challenge_secret() {
        anyhow::bail!(
            "challenge.mode = \"{}\" needs a signing secret: {e}",
            config.challenge.mode.as_str()
        );
    }
    if let Some(tls) = &config.gateway.tls {
        let certs = flashgate_gateway::edge::CertSet::load(tls)?;
        println!(
            "gateway.tls: ok (default certificate for {:?}; by SNI: {:?})",
            certs.default_names(),
            certs.sni_names()
        );
    }
    if let Some(certificates) = flashgate_common::redis_conn::check_ca_file(&config.redis)? {
        println!(
            "redis.ca_file: ok ({certificates} CA certificates, trusted besides the system's)"
        );
    }
    if connect {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let found = runtime.block_on(flashgate_common::redis_conn::probe(&config.redis))?;
        for line in found {
            println!("redis ({}): {line}", config.redis.target.mode());
        }
        runtime.block_on(check_shop_paths(config));
    }
    println!("{}: ok ({} sales)", path.display(), config.sales.len());
    Ok(())
}

/// `check --connect`: names each of the gateway's own paths the shop also
/// serves (those would be hidden from the shop). An unreachable shop is a
/// warning: the gateway starts without it.
async fn check_shop_paths(config: &Config) {
    let Some(upstream) = config.shop.upstreams.first() else {
        return;
    };
    let ca_pem = match &config.shop.ca_file {
        Some(path) => match flashgate_common::ca_file::read_pem("shop.ca_file", path) {
            Ok(pem) => Some(pem),
            Err(e) => return println!("warning: {e}"),
        },
        None => None,
    };
    let target = flashgate_gateway::edge::ShopTarget {
        base: upstream.to_string(),
        host: match &config.shop.host_header {
            flashgate_common::config::HostHeader::Fixed(name) => Some(name),
            flashgate_common::config::HostHeader::Client => None,
        },
        ca_pem,
    };
    let base = &target.base;
    let routes = flashgate_gateway::edge::Routes::from_config(&config.gateway);
    let ids: Vec<&str> = config.sales.iter().map(|s| s.id.as_str()).collect();
    match flashgate_gateway::edge::probe_shop(&routes, &target, &ids).await {
        Ok(probes) => {
            let shadowed: Vec<_> = probes.iter().filter(|p| p.shadowed()).collect();
            for p in &shadowed {
                println!(
                    "warning: the shop also serves {} ({}); the gateway answers it itself \
                     (move gateway.path_prefix or gateway.sale_page_path)",
                    p.path, p.status
                );
            }
            println!(
                "shop ({base}): {} of the gateway's {} paths also served by the shop",
                shadowed.len(),
                probes.len()
            );
        }
        Err(e) => println!("warning: {e:#}"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        // No logging (stdout is the answer); the config file is read only
        // for the addresses no flag gives.
        Some(Command::Operate(operator)) => {
            return match cli::run(operator, &cli.config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("flashgate: {:#}", anyhow::Error::from(e));
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Local(command)) => command,
        None => Local::Serve { upgrade: false },
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("flashgate: {}: {e}", cli.config.display());
            return ExitCode::from(64);
        }
    };
    let result = match command {
        Local::Serve { upgrade } => flashgate_gateway::server::run(config, &cli.config, upgrade),
        Local::Check { connect } => check(&cli.config, &config, connect),
        Local::Token { user, ttl } => match &config.jwt_secret {
            Some(secret) => {
                flashgate_gateway::admission::mint(secret.as_bytes(), &user, ttl, &config.auth)
                    .map(|t| println!("{t}"))
            }
            None => Err(anyhow::anyhow!("no JWT secret: set {ENV_JWT_SECRET}")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flashgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
