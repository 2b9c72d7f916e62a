//! Collector benchmark (being written).
fn main() {}
