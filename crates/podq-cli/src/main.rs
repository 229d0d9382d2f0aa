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
mod procinfo;
mod sim;
mod table;
mod target;
mod topo;
mod usage;

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
    #[command(after_help = "Examples:
  podq topo                              # this machine, as this process may use it
  podq topo --synthetic 2s4l8c2t --summary
  podq topo --sysfs-root capture.tar.gz --scope cache_shard
  podq topo --json > pods.json
  podq topo --capture my-machine.tar.gz
  podq topo --pid 9464                   # a running process's worker pools (as ctl pools)")]
    Topo(topo::Args),
    /// List a running process's workqueues, read or write their attributes, dump their state.
    #[command(after_help = "Examples:
  podq ctl --pid 9464 list
  podq ctl --pid 9464 get rpciod affinity_scope
  podq ctl --pid 9464 set rpciod affinity_scope cpu
  podq ctl --pid 9464 set rpciod min_active 16
  podq ctl --pid 9464 default-scope numa
  podq ctl --pid 9464 dump rpciod        # pwqs, running items, pools (show_workqueue_state)
  podq ctl --pid 9464 pools              # pools, CPU -> pool, nr_active/max_active (wq_dump.py)")]
    Ctl(ctl::CtlArgs),
    /// Watch a running process's workqueues, CPUs and threads live.
    #[command(after_help = "Examples:
  podq monitor --pid 9464
  podq monitor --pid 9464 -i 500ms rpciod nfsiod
  podq monitor --pid 9464 --json --count 10 > samples.jsonl
(--help explains every column)")]
    Monitor(monitor::MonitorArgs),
    /// Benchmark podq across affinity scopes, and against peer executors.
    #[command(after_help = "Examples:
  podq bench                             # queue + latency over every scope (~1 min)
  podq bench queue --scopes smt,cache --strict off --duration 2s
  podq bench latency --think 1ms --rounds 5
  podq bench completion --synthetic 2s4c2t --cq-placement node0 --toggle smt,cache_shard,smt
  podq bench peers --json peers.json --plot peers.svg")]
    Bench(Box<bench::BenchArgs>),
    /// Simulate the bench workloads on a many-CPU machine we don't have.
    #[command(after_help = "Examples:
  podq sim --machine epyc-2s32c
  podq sim latency --machine xeon-2s24c --plot sim.svg
  podq sim --print-cost")]
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
            if err.downcast_ref::<usage::UsageError>().is_some() {
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
