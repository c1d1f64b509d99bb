//! # tessera
//!
//! The `tessera` binary: one executable that is both the server and the command-line client.
//! This crate holds only argument parsing, file I/O and output formatting; the fleet model and
//! the placement engine live in `tessera-model` and `tessera-sched`.
//!
//! Commands today: `sim openb` (trace replay), `bench placement` (engine benchmark) and
//! `fleet` (show or validate a fleet description).

mod bench;
mod fleetcmd;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: GPU-as-a-service for on-premises NVIDIA fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulations: replay public cluster traces through the placement engine.
    Sim {
        #[command(subcommand)]
        what: sim::SimCommand,
    },
    /// Benchmarks of the core.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// Inspect or validate a fleet description.
    Fleet(fleetcmd::FleetArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim { what } => sim::run(what),
        Command::Bench { what } => bench::run(what),
        Command::Fleet(args) => fleetcmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
