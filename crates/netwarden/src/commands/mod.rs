//! What each command does, one function per command, grouped as the commands are: the
//! arguments come from [`crate::cli`], the work is the library's and the agent's; here are the
//! reading of the arguments into their calls, the printing, and the exit status.

pub mod agent;
pub mod analysis;
pub mod crd;
pub mod lab;
pub mod promote;
pub mod report;
