//! The `podq` command.
//!
//! Exit codes: 0 success, 1 runtime failure (the error is printed with its causes;
//! this includes a refused control request: unknown workqueue, attribute or value),
//! 2 usage error (printed by the argument parser, or a bad `podq bench` value found
//! after parsing).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod ctl;
mod monitor;
mod sim;
mod table;
mod target;
mod topo;

/// Locality-aware unbound workqueues for user space.
#[derive(Parser)]
#[command(name = "podq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the pods of every affinity scope (like wq_dump.py's "Affinity Scopes").
    Topo(topo::Args),
    /// List a running process's workqueues, read or write their attributes.
    Ctl(ctl::CtlArgs),
    /// Watch a running process's workqueues, CPUs and threads live.
    Monitor(monitor::MonitorArgs),
    /// Benchmark podq across affinity scopes, and against peer executors.
    Bench(Box<bench::BenchArgs>),
    /// Simulate the bench workloads on a many-CPU machine we don't have.
    Sim(Box<sim::SimArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(args) => topo::run(&args),
        Command::Ctl(args) => ctl::run(args),
        Command::Monitor(args) => monitor::run(args),
        Command::Bench(args) => bench::run(&args),
        Command::Sim(args) => sim::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`podq monitor | head`): not a failure.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("podq: error: {err:#}");
            if err.downcast_ref::<bench::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
