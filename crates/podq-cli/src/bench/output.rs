//! The `--json` and `--plot` files: opened before the run, so that a path that cannot
//! be written fails at once instead of after the whole benchmark. A file the run
//! created is removed again when the run fails (no empty file is left behind); an
//! existing one keeps its content until it is replaced.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use serde::Serialize;

use super::usage;

/// The output files of one run.
pub struct Outputs {
    json: Option<Target>,
    plot: Option<(PathBuf, File)>,
    /// Files this run created, removed unless [`Outputs::keep`] is called.
    created: Vec<PathBuf>,
}

enum Target {
    Stdout,
    File(PathBuf, File),
}

impl Outputs {
    /// Checks and creates the files. `--plot` must name a `.svg` file: the plot is
    /// SVG, and a `.png` holding SVG opens nowhere.
    pub fn open(json: Option<&str>, plot: Option<&Path>) -> Result<Outputs> {
        let mut outputs = Outputs {
            json: None,
            plot: None,
            created: Vec::new(),
        };
        if let Some(path) = plot {
            let svg = path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
            if !svg {
                return Err(usage(format!(
                    "--plot {}: the plot is SVG; name the file FILE.svg",
                    path.display()
                )));
            }
        }
        if let Some(json) = json {
            outputs.json = Some(if json == "-" {
                Target::Stdout
            } else {
                let path = PathBuf::from(json);
                let file = outputs.create(&path, "--json")?;
                Target::File(path, file)
            });
        }
        if let Some(path) = plot {
            let file = outputs.create(path, "--plot")?;
            outputs.plot = Some((path.to_path_buf(), file));
        }
        Ok(outputs)
    }

    fn create(&mut self, path: &Path, option: &str) -> Result<File> {
        if path.is_dir() {
            return Err(usage(format!(
                "{option} {}: is a directory",
                path.display()
            )));
        }
        let existed = path.exists();
        // An existing file is opened without truncating it: it keeps its old content
        // until the run has something to replace it with.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("{option}: cannot create {}", path.display()))?;
        if !existed {
            self.created.push(path.to_path_buf());
        }
        Ok(file)
    }

    /// Writes the report (bench's or the simulator's) as JSON where `--json` said.
    pub fn write_json(&mut self, report: &impl Serialize) -> Result<()> {
        match self.json.take() {
            None => Ok(()),
            Some(Target::Stdout) => {
                let mut out = std::io::stdout().lock();
                serde_json::to_writer_pretty(&mut out, report)
                    .map_err(std::io::Error::from)
                    .and_then(|()| writeln!(out))
                    .context("writing JSON to stdout")
            }
            Some(Target::File(path, file)) => {
                file.set_len(0)
                    .with_context(|| format!("writing {}", path.display()))?;
                let mut out = BufWriter::new(file);
                serde_json::to_writer_pretty(&mut out, report)
                    .map_err(std::io::Error::from)
                    .and_then(|()| writeln!(out))
                    .and_then(|()| out.flush())
                    .with_context(|| format!("writing {}", path.display()))
            }
        }
    }

    /// Writes the plot `render` draws, when `--plot` was given.
    pub fn write_plot(&mut self, render: impl FnOnce() -> Result<String>) -> Result<()> {
        let Some((path, mut file)) = self.plot.take() else {
            return Ok(());
        };
        let svg = render()?;
        file.set_len(0)
            .and_then(|()| file.write_all(svg.as_bytes()))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The run succeeded: keep the files.
    pub fn keep(mut self) {
        self.created.clear();
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        for path in &self.created {
            // Best effort: the run's own error is what the user needs to see.
            let _ = std::fs::remove_file(path);
        }
    }
}
