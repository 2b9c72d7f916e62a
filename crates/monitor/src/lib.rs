//! netwarden-monitor (being built).
