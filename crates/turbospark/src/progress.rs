//! The load progress bar: drawn on a terminal, absent when stderr is piped
//! (indicatif hides itself when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

pub struct LoadBar(ProgressBar);

impl LoadBar {
    pub fn new(what: &str) -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("loading {what}"));
        LoadBar(bar)
    }

    pub fn update(&self, done: u64, total: u64) {
        self.0.set_length(total);
        self.0.set_position(done);
    }

    pub fn finish(self) {
        self.0.finish_and_clear();
    }
}
