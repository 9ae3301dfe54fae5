//! Download progress: a bar when stderr is a terminal, else a log line every few seconds
//! (container logs have no terminal, and a bar there is noise).

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the log line comes when there is no terminal.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

struct Counters {
    bytes: AtomicU64,
    files: AtomicUsize,
}

/// Shared by the parallel downloads of one fetch.
pub struct Progress {
    what: String,
    total_files: usize,
    started: Instant,
    counters: Arc<Counters>,
    bar: Option<ProgressBar>,
    logger: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Start reporting a download of `total_files` files, `total_bytes` bytes (still to fetch).
    pub fn start(what: &str, total_files: usize, total_bytes: u64) -> Self {
        tracing::info!(
            "downloading {what}: {total_files} file(s), {}",
            human_bytes(total_bytes)
        );
        let counters = Arc::new(Counters {
            bytes: AtomicU64::new(0),
            files: AtomicUsize::new(0),
        });
        let started = Instant::now();
        let (bar, logger) = if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(what.to_string());
            (Some(bar), None)
        } else {
            let counters = counters.clone();
            let what = what.to_string();
            let logger = tokio::spawn(async move {
                let mut tick = tokio::time::interval(LOG_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let done = counters.bytes.load(Ordering::Relaxed);
                    let secs = started.elapsed().as_secs_f64().max(1e-3);
                    tracing::info!(
                        "downloading {what}: {} / {} ({:.0}%), {}/s, {} of {total_files} file(s) done",
                        human_bytes(done),
                        human_bytes(total_bytes),
                        100.0 * done as f64 / total_bytes.max(1) as f64,
                        human_bytes((done as f64 / secs) as u64),
                        counters.files.load(Ordering::Relaxed),
                    );
                }
            });
            (None, Some(logger))
        };
        Progress {
            what: what.to_string(),
            total_files,
            started,
            counters,
            bar,
            logger,
        }
    }

    pub fn add_bytes(&self, n: u64) {
        self.counters.bytes.fetch_add(n, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// Bytes of a resumed file that were already on disk count as done.
    pub fn add_resumed(&self, n: u64) {
        self.add_bytes(n);
    }

    pub fn file_done(&self) {
        self.counters.files.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finish(self) {
        let secs = self.started.elapsed().as_secs_f64();
        let done = self.counters.bytes.load(Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        tracing::info!(
            "downloaded {}: {} file(s), {} in {secs:.1}s ({}/s)",
            self.what,
            self.total_files,
            human_bytes(done),
            human_bytes((done as f64 / secs.max(1e-3)) as u64)
        );
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(l) = self.logger.take() {
            l.abort();
        }
        if let Some(bar) = &self.bar
            && !bar.is_finished()
        {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(98_000_000), "98.0 MB");
        assert_eq!(human_bytes(16_100_000_000), "16.1 GB");
    }
}
