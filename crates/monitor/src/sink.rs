//! Where events and status records go: JSON lines to stdout and/or a file, memory (tests),
//! or several sinks at once.
//!
//! Apart from [`crate::event`] because a sink takes both events and status records
//! ([`crate::status`], whose lines hold events): it sits above both, so neither imports the
//! other back.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::event::Event;
use crate::status::{StatusRecord, TamperRecord};

/// Where events go.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event) -> io::Result<()>;
    /// A status record goes to the same stream as the events (see [`crate::status`]).
    fn emit_status(&self, status: &StatusRecord) -> io::Result<()>;
    /// So does a tamper repair.
    fn emit_tamper(&self, record: &TamperRecord) -> io::Result<()>;
}

/// Writes one JSON line per event to stdout and/or a file (appended).
///
/// Each line is written with a single `write_all` and flushed, so a reader tailing the file
/// never sees half a line and nothing sits in a buffer when the agent is killed.
pub struct JsonLinesSink {
    stdout: bool,
    file: Option<Mutex<File>>,
}

impl JsonLinesSink {
    pub fn new(stdout: bool, file: Option<&Path>) -> io::Result<JsonLinesSink> {
        let file = match file {
            Some(path) => Some(Mutex::new(
                OpenOptions::new().create(true).append(true).open(path)?,
            )),
            None => None,
        };
        Ok(JsonLinesSink { stdout, file })
    }
}

impl JsonLinesSink {
    fn write_line(&self, mut line: String) -> io::Result<()> {
        line.push('\n');
        if self.stdout {
            let mut out = io::stdout().lock();
            out.write_all(line.as_bytes())?;
            out.flush()?;
        }
        if let Some(file) = &self.file {
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            f.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}

impl EventSink for JsonLinesSink {
    fn emit(&self, event: &Event) -> io::Result<()> {
        self.write_line(event.to_json_line())
    }

    fn emit_status(&self, status: &StatusRecord) -> io::Result<()> {
        self.write_line(status.to_json_line())
    }

    fn emit_tamper(&self, record: &TamperRecord) -> io::Result<()> {
        self.write_line(record.to_json_line())
    }
}

/// Keeps events in memory (tests, `lab check`). Clones share the same list.
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    events: Arc<Mutex<Vec<Event>>>,
    statuses: Arc<Mutex<Vec<StatusRecord>>>,
    tampers: Arc<Mutex<Vec<TamperRecord>>>,
}

impl MemorySink {
    pub fn new() -> MemorySink {
        MemorySink::default()
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A copy of the status records so far.
    pub fn statuses(&self) -> Vec<StatusRecord> {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A copy of the tamper records so far.
    pub fn tampers(&self) -> Vec<TamperRecord> {
        self.tampers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes the events so far, leaving the sink empty.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl EventSink for MemorySink {
    fn emit(&self, event: &Event) -> io::Result<()> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
        Ok(())
    }

    fn emit_status(&self, status: &StatusRecord) -> io::Result<()> {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(status.clone());
        Ok(())
    }

    fn emit_tamper(&self, record: &TamperRecord) -> io::Result<()> {
        self.tampers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record.clone());
        Ok(())
    }
}

/// Sends every event to several sinks.
pub struct FanoutSink(pub Vec<Box<dyn EventSink>>);

impl FanoutSink {
    /// Calls `emit` on every sink, even after one failed; returns the first error.
    fn each(&self, emit: impl Fn(&dyn EventSink) -> io::Result<()>) -> io::Result<()> {
        let mut first_err = None;
        for sink in &self.0 {
            if let Err(e) = emit(sink.as_ref()) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl EventSink for FanoutSink {
    fn emit(&self, event: &Event) -> io::Result<()> {
        self.each(|sink| sink.emit(event))
    }

    fn emit_status(&self, status: &StatusRecord) -> io::Result<()> {
        self.each(|sink| sink.emit_status(status))
    }

    fn emit_tamper(&self, record: &TamperRecord) -> io::Result<()> {
        self.each(|sink| sink.emit_tamper(record))
    }
}
